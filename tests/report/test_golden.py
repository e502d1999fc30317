"""report.md and report.html of stored report.json files, byte for byte against the pages the
renderers wrote before issue 13's restructure: moving a formatter must not change a character.

The fixtures together reach every section: `real_nvfp4` is a real 135M-model run on an H200
(gates 1–4, diagnostics, sensitivity; its layer table cut to three decoder layers and the flagged
quantizers), `sample` is test_html's report (an error gate, a fallback), `toy_gates` adds depth,
retrieval, every kind of task suite, a skipped, a non-finite and an unknown gate, an uninformative
check, a fallback over alphas and a GPU run; `diagnose_only` is `qval diagnose`'s page (HTML only).
A deliberate change of the wording regenerates the goldens: render each fixture and write it
to golden/<name>.md / .html, and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qval.report.html import render_html
from qval.report.markdown import render_markdown

HERE = Path(__file__).parent
FIXTURES = sorted(p.stem for p in (HERE / "fixtures").glob("*.json"))
PAGES = [(name, ext) for name in FIXTURES for ext in ("md", "html") if (HERE / "golden" / f"{name}.{ext}").exists()]


def test_every_fixture_has_its_pages():
    assert FIXTURES == ["diagnose_only", "real_nvfp4", "sample", "toy_gates"]
    assert len(PAGES) == 2 * len(FIXTURES) - 1  # a diagnose-only report has no report.md


@pytest.mark.parametrize(("name", "ext"), PAGES)
def test_rendering_is_byte_identical_to_the_golden(name: str, ext: str):
    report = json.loads((HERE / "fixtures" / f"{name}.json").read_text(encoding="utf-8"))
    page = (render_markdown if ext == "md" else render_html)(report).encode("utf-8")
    golden = (HERE / "golden" / f"{name}.{ext}").read_bytes()
    if page != golden:
        got, want = page.decode().splitlines(), golden.decode().splitlines()
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        pytest.fail(f"{name}.{ext} differs from line {first + 1}:\n got: {got[first:first + 1]}\nwant: {want[first:first + 1]}")

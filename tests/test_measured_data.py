"""Measured numbers are data, not code (issue 52): the measured false-reject rates live in
qval/report/measured_error_rates.json (written by benchmarks/measured_rates.py) and nothing under qval/ types
them again — no table of rates, no entry's source text, no re-judging margin. The scanner is tested on planted
modules, so that it can fail."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from qval.report.measured_error_rates import DATA

QVAL = Path(__file__).resolve().parent.parent / "qval"
#: keys that together make a dict literal a table of measured rates
RATE_KEYS = ({"failed", "variants"}, {"variants", "rejected"}, {"failed", "limit"}, {"failed", "alpha"})


def typed_figures(table: dict) -> list[str]:
    """The strings that would show a measured entry typed into code: each entry's source text (its first 60
    characters) and every re-judging margin, as Python writes it."""
    out = []
    for e in table["entries"].values():
        out.append(e["source"][:60])
        out += [repr(c["margin"]) for c in e["checks"].values() if "margin" in c]
    return out


def measured_literals(root: Path, figures: list[str]) -> list[str]:
    """Every place under `root` where a measured rate is typed: a dict literal shaped like a rate table, a name
    `MEASURED` assigned, or one of `figures` in the text."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Dict):
                keys = {k.value for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and isinstance(k.value, str)
                        and isinstance(v, ast.Constant) and isinstance(v.value, (int, float))}  # typed numbers, not computed ones
                if any(shape <= keys for shape in RATE_KEYS):
                    found.append(f"{rel}:{node.lineno}: a table of measured rates")
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "MEASURED" for t in targets):
                found.append(f"{rel}:{node.lineno}: MEASURED assigned")
        found += [f"{rel}: types {f!r}" for f in figures if f in text]
    return found


def test_no_measured_rate_is_typed_into_qval() -> None:
    figures = typed_figures(json.loads(DATA.read_text(encoding="utf-8")))
    assert len(figures) >= 5
    assert measured_literals(QVAL, figures) == []


def test_the_scan_finds_a_typed_table(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "ok.py").write_text('ROWS = {"a": {"value": 1}}\n')
    (pkg / "table.py").write_text('MEASURED: dict = {"x": {"variants": 21, "rejected": 0, "checks": {"g/a": {"limit": 0.86, "failed": 0}}}}\n')
    (pkg / "prose.py").write_text('SOURCE = "H200, float32, 2026-12-03; the table"\nMARGIN = 0.024345422103009443\n')
    (pkg / "computed.py").write_text('def f(m, n):\n    return {"failed": m, "variants": n}\n')
    found = measured_literals(pkg, ["H200, float32, 2026-12-03", "0.024345422103009443"])
    assert sorted(found) == ["pkg/prose.py: types '0.024345422103009443'", "pkg/prose.py: types 'H200, float32, 2026-12-03'",
                             "pkg/table.py:1: MEASURED assigned", "pkg/table.py:1: a table of measured rates",
                             "pkg/table.py:1: a table of measured rates"]

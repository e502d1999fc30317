"""report.md's diagnostics part: flagged quantizers with their rules, the ranking, the fallback."""

from __future__ import annotations

from qval.report.markdown import render_markdown

from .test_html import sample_report


def test_markdown_has_rules_flags_ranking_and_fallback():
    r = sample_report()
    md = render_markdown(r)
    assert md.index("## Per-layer scale diagnostics") < md.index("## Sensitivity") < md.index("## Fallback") < md.index("## Calibration")
    for rule in r["diagnostics"]["rules"]:
        assert f"`{rule['id']}`" in md
    flagged = [x["quantizer"] for x in r["diagnostics"]["layers"] if x["flags"]]
    assert f"{len(flagged)} quantizer(s) break a rule" in md and all(f"| {q} |" in md for q in flagged)
    ranking = [line for line in md.splitlines() if line.startswith("| 1 | ") or line.startswith("| 2 | ")]
    assert ranking[0].startswith("| 1 | model.layers.2 | 0.03 |") and "`*model.layers.2.*`" in ranking[0]
    assert "**APPROVE**: APPROVE after keeping 1 layer(s)" in md


def test_markdown_without_diagnostics_is_unchanged_by_them():
    r = sample_report()
    r.pop("diagnostics"), r.pop("fallback")
    md = render_markdown(r)
    assert "Per-layer" not in md and "## Sensitivity" not in md and "## Fallback" not in md

"""The shared wording of report.md and report.html: thresholds, the reference, the run time,
the outcome words and the gate titles."""

from __future__ import annotations

import doctest

from qval.report import formatting, numbers, schema
from qval.report.formatting import TITLES, outcome, reference_text, runtime_text, threshold_text
from qval.report.html import TITLES as HTML_TITLES


def check(op: str, limit: float, **extra) -> dict:
    return {"op": op, "limit": limit, "source": "sized" if extra else "absolute", **extra}


def test_doctests() -> None:
    for module in (formatting, numbers, schema):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_threshold_names_the_value_it_detects_on_the_right_side() -> None:
    assert threshold_text(check("max", 0.037, min_detectable_effect=0.049, detectable=0.049)) == "≤ 0.037 (sized), detects ≥ 0.049"
    # a lower limit detects a fall: the value is below the limit, not "≥ the effect"
    assert threshold_text(check("min", 0.9727, min_detectable_effect=0.0161, detectable=0.9688)) == "≥ 0.9727 (sized), detects ≤ 0.9688"
    assert threshold_text(check("max", 0.07)) == "≤ 0.07 (absolute)"
    # a report written before `detectable` existed keeps its effect, named as such
    assert threshold_text(check("min", 0.97, min_detectable_effect=0.016)) == "≥ 0.97 (sized), detectable effect 0.016"


def test_runtime_of_a_reused_run_says_so() -> None:
    fresh = {"seconds": 812.5, "stages": {"calibrate": {"cached": False, "seconds": 60.0}}}
    assert runtime_text(fresh) == "run took 812.5 s"
    reused = {"seconds": 0.04, "stages": {"calibrate": {"cached": True, "seconds": 59.1}, "gate_agreement": {"cached": True, "seconds": 266.9}}}
    assert runtime_text(reused) == "run took 0.04 s (every stage reused from an earlier run, which computed them in 326 s)"
    part = {"seconds": 400.0, "stages": {"calibrate": {"cached": True, "seconds": 59.1}, "gate_agreement": {"cached": False, "seconds": 340.0}}}
    assert runtime_text(part) == "run took 400.0 s (1 of 2 stages reused from an earlier run, which computed it in 59.1 s)"


def test_reference_text() -> None:
    d = {"name": "SmolLM2", "fingerprint": "97bd540928490fa0", "compute_dtype": "float32", "device": "cpu"}
    assert reference_text(d) == "Reference: SmolLM2 (fingerprint 97bd54092849), computed in float32 on cpu"
    assert reference_text({**d, "loaded": False}).endswith("(as described by the run that computed the stages; not loaded in this one)")
    assert "not loaded in this run" in reference_text({"fingerprint": "97bd540928490fa0", "loaded": False})


def test_a_failed_gate_or_a_nonfinite_check_is_never_a_pass() -> None:
    assert [outcome(x) for x in ("error", "skipped", "nonfinite", None, False)] == ["fail"] * 5


def test_one_title_per_gate_and_report_html_differs_only_where_it_always_has() -> None:
    assert {k for k in TITLES if HTML_TITLES[k] != TITLES[k]} == {"quality"}
    assert TITLES.keys() == HTML_TITLES.keys()

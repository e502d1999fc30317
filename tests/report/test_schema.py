"""report.json's structure, as schema.build_report writes it."""

from __future__ import annotations

import json
from pathlib import Path

from qval.config import parse_config
from qval.report import schema
from qval.verdict import GateResult, Threshold, decide

from ..conftest import small_config

REAL = Path(__file__).parent / "fixtures" / "real_nvfp4.json"


def test_keys_and_their_order_are_those_of_a_real_report():
    """The real fixture was written by the pipeline before the schema had its own module."""
    cfg = parse_config(small_config("s", fmt="fp8"), "<schema test>")
    results = {"agreement": GateResult("agreement", "ok")}
    verdict = decide(results, [Threshold("agreement", "top1", "min", 0.9, "top-1")])
    r = schema.build_report(cfg, verdict, results, reference={"fingerprint": "ab"}, engine=None, calibration=None,
                            stages={}, environment={"versions": {}, "device": "cpu"}, numerics={"mode": "cpu"},
                            diagnostics=None, seconds=1.234)
    real = json.loads(REAL.read_text(encoding="utf-8"))
    # issue 29 added one key after the verdict: the measured error rates that apply (none for this name)
    assert [k for k in r if k != "error_rates"] == list(real) and list(r["candidate"]) == list(real["candidate"])
    assert list(r).index("error_rates") == list(r).index("verdict") + 1 and r["error_rates"] == {"measured": False}
    assert (r["schema"], r["schema_version"], r["seconds"]) == ("qval.report", 1, 1.23)
    assert r["candidate"]["engine"] == {"backend": "fakequant", "built": False}
    assert r["environment"] == {"versions": {}, "device": "cpu", "determinism": {"mode": "cpu"}}
    assert set(r["data"]) == {"calibration", "agreement"}


def test_fallback_steps_lose_their_checks_and_the_report_is_not_changed_in_place():
    report = {"name": "r"}
    record = {"approved": True, "explanation": "x", "steps": [{"step": 1, "checks": [1, 2], "approved": True}]}
    out = schema.with_fallback(report, record)
    assert out["fallback"] == {"approved": True, "explanation": "x", "steps": [{"step": 1, "approved": True}]}
    assert report == {"name": "r"}

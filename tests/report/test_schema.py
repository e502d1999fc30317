"""report.json's structure, as schema.build_report writes it."""

from __future__ import annotations

import json
from pathlib import Path

from qval.config import parse_config
from qval.gates import data_identities
from qval.report import schema
from qval.verdict import CheckKey, GateResult, Threshold, decide

from ..conftest import small_config

REAL = Path(__file__).parent / "fixtures" / "real_nvfp4.json"


def test_keys_and_their_order_are_those_of_a_real_report():
    """The real fixture was written by the pipeline before the schema had its own module."""
    cfg = parse_config(small_config("s", fmt="fp8"), "<schema test>")
    results = {"agreement": GateResult("agreement", "ok")}
    verdict = decide(results, [Threshold(CheckKey("agreement", "top1"), "min", 0.9, "top-1")])
    r = schema.build_report(cfg, verdict, results, reference={"fingerprint": "ab"}, engine=None, calibration=None,
                            stages={}, environment={"versions": {}, "device": "cpu"}, numerics={"mode": "cpu"},
                            diagnostics=None, seconds=1.234, data=data_identities(cfg))
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


def test_the_measured_rates_are_looked_up_by_the_check_file_and_the_run_not_the_candidates_name():
    """A candidate of checks/int8_sq.yaml named by the sweep and the fallback ("int8_sq-alpha0.8-fallback1") reports
    int8_sq's measured rates where it is the measured configuration (alpha 0.8, every mlp.down_proj kept high, the
    built-in model in float32); the same config not loaded from that file, or of another reference model or compute
    dtype, does not (the reference's description is the report's "model")."""
    from qval.calibration import expand_alphas
    from qval.config import load_config
    from qval.report.measured_error_rates import BUILTIN_MODEL

    cfg = expand_alphas(load_config(Path(__file__).parents[2] / "checks/int8_sq.yaml"))[-1][0]
    cfg = cfg.model_copy(update={"name": f"{cfg.name}-fallback1",
                                 "quant": cfg.quant.model_copy(update={"exclude": [*cfg.quant.exclude, "*mlp.down_proj.*"]})})
    results = {"agreement": GateResult("agreement", "ok")}
    verdict = decide(results, [Threshold(CheckKey("agreement", "top1"), "min", 0.84, "top-1")])
    builtin = {"name": "SmolLM2", "fingerprint": BUILTIN_MODEL, "compute_dtype": "float32"}

    def rates(c, reference=builtin):
        return schema.build_report(c, verdict, results, reference=reference, engine=None, calibration=None, stages={},
                                   environment={"versions": {}, "device": "cpu"}, numerics={}, diagnostics=None,
                                   seconds=1.0, data={})["error_rates"]
    assert cfg.name == "int8_sq-alpha0.8-fallback1" and rates(cfg)["measured"] is True
    assert rates(cfg)["checks"] == {"agreement/top1": {"failed": 0, "variants": 27, "uninformative": 0}}
    assert "checks this run lacks" in rates(cfg)["why_not"]  # the other 15 checks are not in this verdict
    assert rates(cfg.model_copy(update={"source_file": None})) == {"measured": False}
    assert rates(cfg, {**builtin, "compute_dtype": "float16"})["why_not"] == (
        "measured on another configuration: the compute dtype: measured float32, this run float16")
    assert "the reference model" in rates(cfg, {"fingerprint": "ab" * 32, "compute_dtype": "float32"})["why_not"]
    unswept = expand_alphas(load_config(Path(__file__).parents[2] / "checks/int8_sq.yaml"))[-1][0]
    assert rates(unswept)["checks"] == {} and "quant.exclude" in rates(unswept)["why_not"]

"""The measured error rates a report shows (qval/report/error_rates.py): the table is what the stored
measurement says, its limits are the shipped check file's (else the report would not show it), and
a report states each check's size."""

from __future__ import annotations

import json
from pathlib import Path

from qval.config import load_config
from qval.report.error_rates import MEASURED, file_text, for_report, size_cell
from qval.verdict import row_of

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "benchmarks/results/h200_error_rates_fp8_kvfp16_healthy.json"


def test_the_table_is_the_stored_measurement() -> None:
    runs = [r for r in json.loads(STORED.read_text(encoding="utf-8"))["results"] if r["decision"] != "ERROR"]
    m = MEASURED["fp8_kvfp16"]
    assert m["variants"] == len(runs) >= 18 and m["rejected"] == sum(r["decision"] == "REJECT" for r in runs)
    assert set(m["checks"]) == set(runs[0]["checks"])
    for key, entry in m["checks"].items():
        assert entry["failed"] == sum(r["checks"][key]["outcome"] == "fail" for r in runs), key
        assert entry.get("uninformative", 0) == sum(r["checks"][key]["outcome"] == "uninformative" for r in runs), key
        c = runs[0]["checks"][key]
        assert (entry.get("limit") == c["limit"]) if c["source"] == "absolute" else entry.get("alpha") == 0.005, key


def test_the_shipped_check_file_has_the_measured_limits() -> None:
    """A limit moved in checks/fp8_kvfp16.yaml without a new measurement would silently drop the
    measured rate from every report: this fails first."""
    cfg = load_config(ROOT / "checks/fp8_kvfp16.yaml")
    for key, entry in MEASURED["fp8_kvfp16"]["checks"].items():
        gate, metric = key.split("/")
        row = row_of(gate, metric)
        assert row is not None, key
        section = getattr(cfg.gates, gate)
        if gate == "retrieval":
            limit = section.margin if "@" in metric else section.margin_overall
        elif gate == "tasks":
            limit = next(s.margin for s in section.suites if s.label == metric.split("@")[1])
        else:
            limit = getattr(section, row.field)
        if "alpha" in entry:
            assert limit.sized and limit.alpha == entry["alpha"], key
        else:
            assert limit == entry["limit"], key


def test_a_report_shows_the_measured_rate_only_at_the_measured_limits() -> None:
    checks = [{"gate": "agreement", "metric": "top1", "limit": 0.86, "source": "absolute", "size": 0.0},
              {"gate": "longgen", "metric": "judge_nll_excess", "limit": 0.02, "source": "sized", "size": 0.005}]
    rates = for_report("fp8_kvfp16", checks)
    assert rates["checks"]["agreement/top1"]["failed"] == 0 and "longgen/judge_nll_excess" in rates["checks"]
    assert rates["file"] is None and "checks this run lacks" in file_text(rates)  # the rest of the file's checks are missing
    assert size_cell(checks[1], rates) == f"≤ 0.005 (α); measured 0/{MEASURED['fp8_kvfp16']['variants']}"
    moved = for_report("fp8_kvfp16", [{**checks[0], "limit": 0.87}])
    assert moved["checks"] == {} and "measured at other limits: agreement/top1" in file_text(moved)
    assert for_report("my_check", checks) == {"measured": False} and "not measured" in file_text({"measured": False})

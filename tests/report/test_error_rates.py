"""The measured error rates a report shows (qval/report/error_rates.py): the table is what the stored
measurement says, its limits are the shipped check file's (else the report would not show it), and
a report states each check's size."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from qval.calibration import expand_alphas
from qval.config import load_config
from qval.gate_metrics import MEDIAN_SPREAD
from qval.report.error_rates import MEASURED, file_text, for_report, measured_key, size_cell
from qval.verdict import row_of

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"


def per_prompt(r: dict) -> list[dict]:
    return (r.get("longgen") or {}).get("per_prompt") or []


def measured_file(name: str) -> str:
    """The check file whose rows measured `MEASURED[name]`: the shipped one, or its approving configuration."""
    return MEASURED[name].get("measured_on", f"checks/{name}.yaml")


def healthy_runs(name: str) -> list[dict]:
    """Every healthy variant (the shipped selection and the sample seeds) stored for a check file, once each:
    a run with per-prompt gate-3 figures over a run of the same variant without them (re-runs' figures equal,
    on an H100 as on the H200 but for the judge-NLL statistic: RESULTS.md §12)."""
    runs: dict[str, dict] = {}
    check = measured_file(name)
    for path in sorted(RESULTS.glob(f"h[12]00_error_rates_{Path(check).stem}_*.json")):
        for r in json.loads(path.read_text(encoding="utf-8"))["results"]:
            if r["check"] == check and r["variant"] in ("shipped", "healthy") and r["decision"] != "ERROR":
                if r["name"] not in runs or (per_prompt(r) and not per_prompt(runs[r["name"]])):
                    runs[r["name"]] = r
    return list(runs.values())


def judge_excess(r: dict) -> list[float]:
    return [p["cand_late_judge_nll"] - p["ref_late_nll"] for p in per_prompt(r)]


def outcome_at(c: dict, limit: float) -> str:
    """A stored absolute check judged again at `limit`: its stored end (value, or the interval's bound) against it."""
    if c["outcome"] == "uninformative":
        return "uninformative"
    end = c[c["on"]]
    return "pass" if (end <= limit if c["op"] == "max" else end >= limit) else "fail"


def outcome_of(c: dict, entry: dict, run: dict | None = None) -> str:
    """A stored check judged at the table's limit: an absolute one at `limit`; a sized one re-centred on
    `healthy` at that centre + `margin` (the stored limit less the centre in force when the run was judged, and
    less √(π/2) × `margin` where the run judged the median), its figure the stored mean, or with
    `"statistic": "median"` the median of the run's per-prompt figures against `healthy` + √(π/2) × `margin`
    (`healthy` 0 where the entry has none: a sized check without a centre)."""
    if "limit" in entry:
        return outcome_at(c, entry["limit"])
    if "margin" not in entry:  # judged as it ran
        assert "healthy" not in entry and "statistic" not in entry, entry
        return c["outcome"]
    healthy = entry.get("healthy", 0.0)  # a sized check without a centre is centred on 0
    if c.get("statistic") == "median":  # judged as the check judges now: the stored limit is the median's
        assert c["limit"] == pytest.approx(c.get("healthy", 0.0) + MEDIAN_SPREAD * entry["margin"], abs=1e-12), run["name"]
    else:
        centre = c["limit"] - entry["margin"]  # the centre in force when the run was judged: 0 or 0.005
        assert min(abs(centre), abs(centre - 0.005)) < 1e-12 and c.get("healthy", centre) == pytest.approx(centre), run["name"]
    if entry.get("statistic", "mean") == "mean":
        return outcome_at({**c, "on": "value"}, healthy + entry["margin"])
    assert entry["statistic"] == "median" and per_prompt(run), f"{run['name']}: no per-prompt figures to take the median of"
    limit = healthy + MEDIAN_SPREAD * entry["margin"]
    outcome = "pass" if statistics.median(judge_excess(run)) <= limit else "fail"
    if c.get("statistic") == "median" and c.get("healthy") == entry.get("healthy"):  # judged at this limit when it ran
        assert outcome == c["outcome"], run["name"]
    return outcome


def test_the_table_is_the_stored_measurement() -> None:
    assert set(MEASURED) >= {"fp8_kvfp16", "fp8_kvfp8", "int8_sq"}
    for name, m in MEASURED.items():
        runs = healthy_runs(name)
        assert m["variants"] == len(runs) >= 20, name
        assert set(m["checks"]) == set(runs[0]["checks"]), name
        rejected = 0
        for r in runs:
            outcomes = {key: outcome_of(r["checks"][key], e, r) for key, e in m["checks"].items()}
            rejected += "fail" in outcomes.values()
        assert m["rejected"] == rejected, name
        for key, entry in m["checks"].items():
            judged = [outcome_of(r["checks"][key], entry, r) for r in runs]
            assert entry["failed"] == judged.count("fail"), (name, key)
            assert entry.get("uninformative", 0) == judged.count("uninformative"), (name, key)
            c = runs[0]["checks"][key]
            assert ("limit" in entry) if c["source"] == "absolute" else entry.get("alpha") == 0.005, (name, key)


def test_rejudging_a_stored_check_moves_with_the_limit() -> None:
    c = {"value": 0.2, "lo": -0.18, "hi": 0.565, "op": "max", "on": "hi", "outcome": "pass"}
    assert (outcome_at(c, 0.6), outcome_at(c, 0.5), outcome_at({**c, "outcome": "uninformative"}, 0.5)) == ("pass", "fail", "uninformative")


def shipped_limit(cfg, key: str):
    """A check's limit as a check file sets it (a number, or a sized limit's settings)."""
    gate, metric = key.split("/")
    row = row_of(gate, metric)
    assert row is not None, key
    section = getattr(cfg.gates, gate)
    if gate == "retrieval":
        return section.margin if "@" in metric else section.margin_overall
    if gate == "tasks":
        return next(s.margin for s in section.suites if s.label == metric.split("@")[1])
    return getattr(section, row.field)


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_shipped_check_file_has_the_measured_limits(name: str) -> None:
    """A limit moved in a shipped check file without updating its measured rates would silently drop
    them from every report: this fails first."""
    cfg = load_config(ROOT / f"checks/{name}.yaml")
    if "measured_on" in MEASURED[name]:  # measured on the shipped file's approving configuration: the same limits
        assert load_config(ROOT / MEASURED[name]["measured_on"]).gates == cfg.gates, name
    for key, entry in MEASURED[name]["checks"].items():
        limit = shipped_limit(cfg, key)
        if "alpha" in entry:
            assert limit.sized and limit.alpha == entry["alpha"] and limit.healthy == entry.get("healthy"), key
        else:
            assert limit == entry["limit"], key


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_a_run_of_the_shipped_file_shows_the_whole_files_rate(name: str) -> None:
    """Every candidate of a shipped check file — the sweep's "-alpha…" ones and a fallback's steps included,
    whose names are not the file's — shows the file's measured rate: the key is the file, not the name."""
    cfg = load_config(ROOT / f"checks/{name}.yaml")
    checks = []
    for key in MEASURED[name]["checks"]:
        gate, metric = key.split("/")
        limit = shipped_limit(cfg, key)
        checks.append({"gate": gate, "metric": metric, "source": "sized", "size": limit.alpha, "healthy": limit.healthy}
                      if getattr(limit, "sized", False) else {"gate": gate, "metric": metric, "limit": limit, "source": "absolute"})
    # the candidates as the sweep names them, and a fallback step's copy of one (qval/diagnostics/fallback.py)
    candidates = [c for c, _ in expand_alphas(cfg)]
    candidates.append(candidates[-1].model_copy(update={"name": f"{candidates[-1].name}-fallback1"}))
    for c in candidates:
        key = measured_key(c.name, c.source_file)
        assert key == name and for_report(key, checks)["file"]["variants"] == MEASURED[name]["variants"], c.name
        assert f"{MEASURED[name]['rejected']} of {MEASURED[name]['variants']} healthy variants" in file_text(for_report(key, checks))
    assert (len(candidates) == 3) == (name == "int8_sq")  # int8_sq sweeps two alphas, each under its own name
    assert for_report(measured_key(cfg.name, "elsewhere/my_check.yaml"), checks) == {"measured": False}


def test_a_report_shows_the_measured_rate_only_at_the_measured_limits() -> None:
    checks = [{"gate": "agreement", "metric": "top1", "limit": 0.86, "source": "absolute", "size": 0.0},
              {"gate": "longgen", "metric": "judge_nll_excess", "limit": 0.02, "source": "sized", "size": 0.005}]
    rates = for_report("fp8_kvfp16", checks)
    # the table's judge-NLL entry was judged around healthy 0.002: a check sized around 0 is another limit
    assert rates["checks"]["agreement/top1"]["failed"] == 0 and "longgen/judge_nll_excess" not in rates["checks"]
    assert "measured at other limits: longgen/judge_nll_excess" in rates["why_not"]
    checks[1]["healthy"] = 0.002
    rates = for_report("fp8_kvfp16", checks)
    assert "longgen/judge_nll_excess" in rates["checks"]
    assert rates["file"] is None and "checks this run lacks" in file_text(rates)  # the rest of the file's checks are missing
    assert size_cell(checks[1], rates) == (f"≤ 0.005 (α; at 0.002, the healthy figure it is sized around); "
                                           f"measured 0/{MEASURED['fp8_kvfp16']['variants']}")
    assert size_cell({**checks[1], "healthy": None}, None) == "≤ 0.005 (α)"
    moved = for_report("fp8_kvfp16", [{**checks[0], "limit": 0.87}])
    assert moved["checks"] == {} and "measured at other limits: agreement/top1" in file_text(moved)
    assert for_report("my_check", checks) == {"measured": False} and "not measured" in file_text({"measured": False})


def test_stored_per_prompt_figures_are_what_gate_3_judged() -> None:
    """benchmarks/error_rates.py stores gate 3's late NLLs and loop periods prompt by prompt (what
    benchmarks/judge_nll_per_prompt.py re-judges other statistics from): over every stored row carrying them,
    their excess's statistic (the mean, or the median where the row says so) is the judge-NLL figure the run was
    judged on, and their loops its loops excess."""
    rows = [r for path in sorted(RESULTS.glob("*error_rates_*.json"))
            for r in json.loads(path.read_text(encoding="utf-8"))["results"] if per_prompt(r)]
    assert len(rows) >= 20
    for r in rows:
        pp, excess, c = per_prompt(r), judge_excess(r), r["checks"]["longgen/judge_nll_excess"]
        figure = statistics.median(excess) if c.get("statistic") == "median" else sum(excess) / len(excess)
        assert figure == pytest.approx(c["value"], abs=1e-12), r["name"]
        loops = sum(p["cand_loop_period"] is not None for p in pp) - sum(p["ref_loop_period"] is not None for p in pp)
        assert loops == r["checks"]["longgen/loops_excess"]["value"], r["name"]


def test_a_stored_row_names_the_statistic_its_gate_metrics_row_takes() -> None:
    """benchmarks/error_rates.py marks a row's figure "median" exactly where its gate_metrics row is sized as a median
    (gate 3's judge-NLL excess), and gate 3's cache key names the same statistic: one source for both."""
    import importlib.util

    from qval.gates.longgen import JUDGE_STATISTIC, inputs
    spec = importlib.util.spec_from_file_location("error_rates_script", ROOT / "benchmarks/error_rates.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    check = {"value": 0.01, "lo": 0.0, "hi": 0.02, "op": "max", "limit": 0.03, "on": "value", "source": "sized", "outcome": "pass"}
    report = {"verdict": {"decision": "APPROVE", "checks": [{**check, "gate": "longgen", "metric": m, "healthy": 0.002}
                                                            for m in ("judge_nll_excess", "seq_rep4_excess")]}}
    row = script.summary({"check": "c.yaml", "variant": "shipped"}, report, 1.0)
    assert row["checks"]["longgen/judge_nll_excess"]["statistic"] == JUDGE_STATISTIC == "median"
    assert "statistic" not in row["checks"]["longgen/seq_rep4_excess"]
    assert inputs(load_config(ROOT / "checks/fp8_kvfp16.yaml"))["judge"] == "judge_nll_excess: median over prompts"

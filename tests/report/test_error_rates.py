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
from qval.report.error_rates import (BUILTIN_MODEL, MEASURED, configuration_differs, file_text, for_report, measured_key,
                                     run_configuration, size_cell)
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


#: the reference as a report describes the built-in model computed in float32 (what the measurements ran)
BUILTIN_F32 = {"fingerprint": BUILTIN_MODEL, "compute_dtype": "float32"}


def shipped_checks(cfg, name: str) -> list[dict]:
    """The verdict's checks of a run of `cfg`, at the shipped file's limits, for `MEASURED[name]`'s keys."""
    checks = []
    for key in MEASURED[name]["checks"]:
        gate, metric = key.split("/")
        limit = shipped_limit(cfg, key)
        checks.append({"gate": gate, "metric": metric, "source": "sized", "size": limit.alpha, "healthy": limit.healthy}
                      if getattr(limit, "sized", False) else {"gate": gate, "metric": metric, "limit": limit, "source": "absolute"})
    return checks


def test_the_builtin_models_fingerprint_is_the_installed_files() -> None:
    from qval import models
    assert models.locate(load_config(ROOT / "checks/fp8_kvfp16.yaml").model)[3] == BUILTIN_MODEL


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_measured_configuration_is_the_one_the_rows_ran(name: str) -> None:
    """A `MEASURED` entry's configuration is its rows' check file as they ran it (the built-in model in float32,
    every stored file's dtype): a run of that file matches it whatever its calibration sample."""
    metas = [json.loads(p.read_text(encoding="utf-8"))["meta"]
             for p in sorted(RESULTS.glob(f"h[12]00_error_rates_{Path(measured_file(name)).stem}_*.json"))]
    assert metas and {m["dtype"] for m in metas} == {MEASURED[name]["configuration"]["compute_dtype"]}, name
    cfg = load_config(ROOT / measured_file(name))
    assert configuration_differs(MEASURED[name]["configuration"], run_configuration(cfg, BUILTIN_F32)) == [], name
    seeded = cfg.model_copy(update={"calibration": cfg.calibration.model_copy(update={"sample_seed": 7})})
    assert configuration_differs(MEASURED[name]["configuration"], run_configuration(seeded, BUILTIN_F32)) == [], name


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_a_run_of_the_shipped_file_shows_the_whole_files_rate_where_it_is_the_measured_configuration(name: str) -> None:
    """The key is the check file, not the candidate's name: a fallback step ("-fallback1") and a sweep's candidate
    ("-alpha0.8") of a shipped file find its entry; they show its rate where their configuration is the measured one
    (int8_sq: only alpha 0.8 with every mlp.down_proj kept high, what `--fallback auto` approves), and say which
    part differs where not."""
    cfg = load_config(ROOT / f"checks/{name}.yaml")
    checks = shipped_checks(cfg, name)
    measured = MEASURED[name]["configuration"]["quant"]
    candidates = [c for c, _ in expand_alphas(cfg)]
    last = candidates[-1]
    candidates.append(last.model_copy(update={"name": f"{last.name}-fallback1", "quant": last.quant.model_copy(
        update={"exclude": list(measured["exclude"])})}))  # a fallback step's copy (qval/diagnostics/fallback.py)
    assert (len(candidates) == 3) == (name == "int8_sq")  # int8_sq sweeps two alphas, each under its own name
    shown = []
    for c in candidates:
        key = measured_key(c.name, c.source_file)
        rates = for_report(key, checks, run_configuration(c, BUILTIN_F32))
        assert key == name and rates["measured"], c.name
        if rates["file"] is not None:
            shown.append(c.name)
            assert rates["file"]["variants"] == MEASURED[name]["variants"] and len(rates["checks"]) == len(checks), c.name
            assert f"{MEASURED[name]['rejected']} of {MEASURED[name]['variants']} healthy variants" in file_text(rates)
        else:
            assert rates["why_not"].startswith("measured on another configuration: quant.") and rates["checks"] == {}, c.name
            assert "not as it ran here" in file_text(rates), c.name
    assert shown == ([candidates[-1].name] if name == "int8_sq" else [c.name for c in candidates]), name
    assert for_report(measured_key(cfg.name, "elsewhere/my_check.yaml"), checks, run_configuration(cfg, BUILTIN_F32)) == {"measured": False}


@pytest.mark.parametrize("change, says", [
    ({"model": "0" * 64}, "the reference model: measured on the built-in model, this run another (fingerprint 000000000000…)"),
    ({"compute_dtype": "float16"}, "the compute dtype: measured float32, this run float16"),
    ({"compute_dtype": None}, "the compute dtype: measured float32, this run not recorded"),
    ({"backend": "vllm"}, "the engine backend: measured fakequant, this run vllm"),
    ({"quant.kv_cache": "fp8"}, "quant.kv_cache: measured fp16, this run fp8"),
    ({"quant.exclude": ["*lm_head*", "*layers.3.*"]}, "quant.exclude: measured *lm_head*, this run *lm_head*, *layers.3.*"),
    ({"calibration.samples": 512}, "calibration.samples: measured 64, this run 512"),
])
def test_a_run_of_another_configuration_shows_no_measured_rate(change: dict, says: str) -> None:
    """Rates measured on the built-in model in float32 are not this run's when it gates another model (a user's
    own, with the shipped file's limits), another dtype (float16 on a GPU), engine, quantization or calibration."""
    cfg = load_config(ROOT / "checks/fp8_kvfp16.yaml")
    run = run_configuration(cfg, BUILTIN_F32)
    for k, v in change.items():
        part, _, field = k.partition(".")
        run = {**run, part: {**run[part], field: v}} if field else {**run, part: v}
    checks = shipped_checks(cfg, "fp8_kvfp16")
    rates = for_report("fp8_kvfp16", checks, run)
    assert rates == {"measured": True, "source": MEASURED["fp8_kvfp16"]["source"], "checks": {}, "file": None,
                     "why_not": f"measured on another configuration: {says}"}
    assert all("measured" not in size_cell(c, rates) for c in checks)
    assert "not as it ran here (measured on another configuration: " in file_text(rates)


def test_a_report_shows_the_measured_rate_only_at_the_measured_limits() -> None:
    run = run_configuration(load_config(ROOT / "checks/fp8_kvfp16.yaml"), BUILTIN_F32)
    checks = [{"gate": "agreement", "metric": "top1", "limit": 0.86, "source": "absolute", "size": 0.0},
              {"gate": "longgen", "metric": "judge_nll_excess", "limit": 0.02, "source": "sized", "size": 0.005}]
    rates = for_report("fp8_kvfp16", checks, run)
    # the table's judge-NLL entry was judged around healthy 0.002: a check sized around 0 is another limit
    assert rates["checks"]["agreement/top1"]["failed"] == 0 and "longgen/judge_nll_excess" not in rates["checks"]
    assert "measured at other limits: longgen/judge_nll_excess" in rates["why_not"]
    checks[1]["healthy"] = 0.002
    rates = for_report("fp8_kvfp16", checks, run)
    assert "longgen/judge_nll_excess" in rates["checks"]
    assert rates["file"] is None and "checks this run lacks" in file_text(rates)  # the rest of the file's checks are missing
    assert size_cell(checks[1], rates) == (f"≤ 0.005 (α; at 0.002, the healthy figure it is sized around); "
                                           f"measured 0/{MEASURED['fp8_kvfp16']['variants']}")
    assert size_cell({**checks[1], "healthy": None}, None) == "≤ 0.005 (α)"
    moved = for_report("fp8_kvfp16", [{**checks[0], "limit": 0.87}], run)
    assert moved["checks"] == {} and "measured at other limits: agreement/top1" in file_text(moved)
    assert for_report("my_check", checks, run) == {"measured": False} and "not measured" in file_text({"measured": False})


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

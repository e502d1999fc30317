"""The measured error rates a report shows (qval/report/measured_error_rates.py): the table is what the stored
measurement says, its limits are the shipped check file's (else the report would not show it), and
a report states each check's size."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.lib.measured_rates import healthy_runs, judge, judge_excess, measured_file, outcome_at, per_prompt
from qval.calibration import expand_alphas
from qval.config import load_config
from qval.report.measured_error_rates import (BUILTIN_MODEL, DATA, check_limits, configuration_differs, file_text,
                                              for_report, measured, measured_key, run_configuration, size_cell)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"
MEASURED = measured()


def test_the_table_is_the_stored_measurement() -> None:
    """Every count in the data file is what its stored runs give at the check file's current limits (moving a
    limit without `python benchmarks/measured_rates.py --write` fails here)."""
    assert set(MEASURED) >= {"fp8_kvfp16", "fp8_kvfp8", "int8_sq"}
    for name, m in MEASURED.items():
        runs = healthy_runs(m)
        assert m["variants"] == len(runs) >= 20, name
        assert set(m["checks"]) == set(runs[0]["checks"]), name
        held = {"variants": m["variants"], "rejected": m["rejected"],
                "checks": {k: {f: v for f, v in c.items() if f in ("failed", "uninformative")} for k, c in m["checks"].items()}}
        assert judge(m) == held, name
        limits = check_limits(load_config(ROOT / m["check"]), list(m["checks"]))
        for key, limit in limits.items():
            c = runs[0]["checks"][key]
            assert ("limit" in limit) if c["source"] == "absolute" else limit["alpha"] == 0.005, (name, key)


def test_a_moved_limit_changes_the_judged_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: the stored runs judged at a limit no healthy variant meets reject them all."""
    import benchmarks.lib.measured_rates as mr

    real = mr.check_limits
    monkeypatch.setattr(mr, "check_limits", lambda cfg, keys: {**real(cfg, keys), "agreement/top1": {"limit": 0.99}})
    counts = judge(MEASURED["fp8_kvfp16"])
    assert counts["rejected"] == counts["variants"] == MEASURED["fp8_kvfp16"]["variants"]
    assert counts["checks"]["agreement/top1"]["failed"] == counts["variants"]


def test_the_data_file_holds_no_limit() -> None:
    """The limits live in the check files alone: the data file names its check file and counts, never a limit."""
    for name, m in MEASURED.items():
        for key, c in m["checks"].items():
            assert set(c) <= {"failed", "uninformative", "statistic", "margin"}, (name, key)
    def keys(x) -> set:
        return set(x) | set().union(*map(keys, x.values())) if isinstance(x, dict) else set()

    assert not keys(json.loads(DATA.read_text(encoding="utf-8"))) & {"limit", "alpha", "healthy", "margin_overall"}


def test_rejudging_a_stored_check_moves_with_the_limit() -> None:
    c = {"value": 0.2, "lo": -0.18, "hi": 0.565, "op": "max", "on": "hi", "outcome": "pass"}
    assert (outcome_at(c, 0.6), outcome_at(c, 0.5), outcome_at({**c, "outcome": "uninformative"}, 0.5)) == ("pass", "fail", "uninformative")


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_measured_check_file_has_the_shipped_limits(name: str) -> None:
    """An entry measured on the shipped file's approving configuration (`measured_on`) ran the shipped file's limits."""
    cfg = load_config(ROOT / MEASURED[name]["check"])
    if "measured_on" in MEASURED[name]:
        assert load_config(ROOT / MEASURED[name]["measured_on"]).gates == cfg.gates, name


#: the reference as a report describes the built-in model computed in float32 (what the measurements ran)
BUILTIN_F32 = {"fingerprint": BUILTIN_MODEL, "compute_dtype": "float32"}


def shipped_checks(cfg, name: str) -> list[dict]:
    """The verdict's checks of a run of `cfg`, at the shipped file's limits, for `MEASURED[name]`'s keys."""
    checks = []
    for key, limit in check_limits(cfg, list(MEASURED[name]["checks"])).items():
        gate, metric = key.split("/")
        checks.append({"gate": gate, "metric": metric, "source": "sized", "size": limit["alpha"], "healthy": limit["healthy"]}
                      if "alpha" in limit else {"gate": gate, "metric": metric, "limit": limit["limit"], "source": "absolute"})
    return checks


def test_the_builtin_models_fingerprint_is_the_installed_files() -> None:
    from qval import model_location
    assert model_location.locate(load_config(ROOT / "checks/fp8_kvfp16.yaml").model)[3] == BUILTIN_MODEL


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_measured_configuration_is_the_one_the_rows_ran(name: str) -> None:
    """A `MEASURED` entry's configuration is its rows' check file as they ran it (the built-in model in float32,
    every stored file's dtype): a run of that file matches it whatever its calibration sample."""
    metas = [json.loads(p.read_text(encoding="utf-8"))["meta"] for p in sorted(ROOT.glob(MEASURED[name]["raw"]))]
    assert metas and {m["dtype"] for m in metas} == {MEASURED[name]["configuration"]["compute_dtype"]}, name
    cfg = load_config(ROOT / measured_file(MEASURED[name]))
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
    from benchmarks import error_rates as script
    from qval.gates.longgen.run import JUDGE_STATISTIC, inputs
    check = {"value": 0.01, "lo": 0.0, "hi": 0.02, "op": "max", "limit": 0.03, "on": "value", "source": "sized", "outcome": "pass"}
    report = {"verdict": {"decision": "APPROVE", "checks": [{**check, "gate": "longgen", "metric": m, "healthy": 0.002}
                                                            for m in ("judge_nll_excess", "seq_rep4_excess")]}}
    row = script.summary({"check": "c.yaml", "variant": "shipped"}, report, 1.0)
    assert row["checks"]["longgen/judge_nll_excess"]["statistic"] == JUDGE_STATISTIC == "median"
    assert "statistic" not in row["checks"]["longgen/seq_rep4_excess"]
    assert inputs(load_config(ROOT / "checks/fp8_kvfp16.yaml"))["judge"] == "judge_nll_excess: median over prompts"

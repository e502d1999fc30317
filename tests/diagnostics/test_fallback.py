"""The fallback search's logic with the gate run replaced by a scripted one: which layer it adds,
when it stops, what it writes. (The real-model run is in test_diagnose_e2e.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qval.config import load_config, parse_config
from qval.diagnostics import fallback
from qval.diagnostics.fallback import Budget, search
from qval.pipeline import RunResult
from qval.verdict import CheckKey, GateResult, Threshold, decide

from ..conftest import ROOT

MODULES = {f"model.layers.{i}.mlp.{p}.weight_quantizer": 500 for i in range(4) for p in ("up_proj", "down_proj")}


def config(**quant) -> object:
    return parse_config({
        "name": "cand", "quant": {"format": "int8_sq", **quant},
        "calibration": {"dataset": "calib_data/general_mix.jsonl"},
        "gates": {"agreement": {"dataset": "calib_data/heldout_eval.jsonl", "max_mean_kld": 0.05}},
    }, str(ROOT / "checks" / "x.yaml"))


def ranking(deltas: dict[str, float], kind: str = "layer") -> list[dict]:
    return [{"kind": kind, "name": n, "exclude": f"*{n}.*", "quantizers": 14, "nonfinite_removed": 0,
             "delta_kld": {"value": d, "stderr": abs(d) / 10, "lo": None, "hi": None, "n": 510}}
            for n, d in sorted(deltas.items(), key=lambda t: -t[1])]


#: a finished gate 1's details as report.json holds them (its type, qval.results, is checked when a step's report renders)
AGREEMENT_DETAILS = json.loads((Path(__file__).parents[1] / "report" / "fixtures" / "toy_gates.json").read_text(
    encoding="utf-8"))["gates"]["agreement"]["details"]


def report(cfg, kld: float, approved: bool, verdict, deltas: dict[str, float] | None, parts: dict[str, float]) -> dict:
    sens = {"layers": ranking(deltas), "parts": ranking(parts, "part")} if deltas is not None else None
    return {
        "name": cfg.name, "verdict": verdict.to_dict(), "seconds": 1.0, "created": "now", "stages": {},
        "environment": {"versions": {}, "device": "cpu"}, "model": {"name": "toy"},
        "candidate": {"format": "int8_sq", "kv_cache": "fp16", "exclude": cfg.quant.exclude, "engine": {"backend": "fakequant"}},
        "gates": {"agreement": {"status": "ok", "error": None, "measurements": {"mean_kld": {"value": kld}},
                                "details": AGREEMENT_DETAILS}},
        "diagnostics": {"layers": [], "rules": [], "flagged": [], "sensitivity": sens,
                        "weights": {"bits_quantized": 8, "bits_high": 16, "modules": MODULES, "high_precision_params": 0}},
    }


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """run_gate stand-in: the candidate passes once every layer in `culprits` is excluded (and,
    for SmoothQuant, when alpha is in `good_alphas`); records every call."""
    calls: list[tuple[str, list[str], str | None]] = []
    state = {"culprits": {"model.layers.2"}, "good_alphas": set(), "parts": {},
             "deltas": {"model.layers.2": 0.05, "model.layers.0": 0.01, "model.layers.3": 0.004, "model.layers.1": -0.001}}

    def fake_run_gate(cfg, progress=None, out_dir=None, alpha=None, sensitivity=None, fail_fast=False):
        calls.append((cfg.name, list(cfg.quant.exclude), sensitivity))
        fixed = all(f"*{c}.*" in cfg.quant.exclude for c in state["culprits"]) or alpha in state["good_alphas"] \
            or any(f"*{p}.*" in cfg.quant.exclude for p in state.get("fixing_parts", ()))
        kld = 0.01 if fixed else 0.2
        result = GateResult("agreement", "ok", measurements={"mean_kld": _est(kld)})
        verdict = decide({"agreement": result}, [Threshold(CheckKey("agreement", "mean_kld"), "max", 0.05, "mean KLD")])
        folder = tmp_path / "runs" / cfg.name
        folder.mkdir(parents=True, exist_ok=True)
        deltas = state["deltas"] if sensitivity in ("always", "auto") and not fixed else None
        return RunResult(config=cfg, verdict=verdict, run_dir=folder,
                         report=report(cfg, kld, fixed, verdict, deltas, state["parts"]))

    monkeypatch.setattr(fallback, "run_gate", fake_run_gate)
    return state, calls, tmp_path


def _est(v: float):
    from qval.metrics import Estimate

    return Estimate(v, 0.001, v - 0.002, v + 0.002, 500)


def test_adds_the_most_sensitive_layer_and_stops_when_it_passes(scripted):
    state, calls, tmp = scripted
    out = search(config(), budget=Budget(max_excluded=3))
    assert out.approved and out.exit_code == 0
    assert [s["added"] for s in out.steps] == ["model.layers.2"]
    assert calls[0] == ("cand", ["*lm_head*"], "always")  # the start ranks its layers
    assert calls[1] == ("cand-fallback1", ["*lm_head*", "*model.layers.2.*"], "never")
    assert out.steps[0]["cost"]["effective_bits"] == pytest.approx((3000 * 8 + 1000 * 16) / 4000)
    assert out.steps[0]["cost"]["params_kept_high"] == 1000
    written = load_config(out.config_file)  # the YAML is a config qval accepts as is
    assert out.config_file.name == "fallback.yaml" and written.quant.exclude == ["*lm_head*", "*model.layers.2.*"]
    assert written.name == "cand-fallback1"
    assert written.resolve(written.calibration.dataset).samefile(ROOT / "calib_data/general_mix.jsonl")
    assert out.config_file.read_text().startswith("# qval fallback result: APPROVE")
    record = yaml.safe_load((tmp / "runs/cand/fallback.json").read_text())
    assert record["approved"] and record["steps"][0]["approved"] and record["final"] == "cand-fallback1"
    html = (tmp / "runs/cand/report.html").read_text()
    assert "Fallback search" in html and "model.layers.2" in html


def test_follows_the_ranking_until_the_budget_runs_out(scripted):
    state, calls, tmp = scripted
    state["culprits"] = {"model.layers.2", "model.layers.3"}  # ranked 1st and 3rd
    out = search(config(), budget=Budget(max_excluded=2))
    assert not out.approved and out.exit_code == 1
    assert [s["added"] for s in out.steps] == ["model.layers.2", "model.layers.0"]
    assert "budget spent: 2 part(s)" in out.explanation and "max_excluded 2" in out.explanation
    assert out.config_file.name == "fallback-rejected.yaml"
    out = search(config(), budget=Budget(max_excluded=4))
    assert out.approved and [s["added"] for s in out.steps] == ["model.layers.2", "model.layers.0", "model.layers.3"]


def test_effective_bits_budget(scripted):
    state, calls, tmp = scripted
    state["culprits"] = {"model.layers.2", "model.layers.0"}
    # one layer kept: 10 bits; two: 12 bits > 11
    out = search(config(), budget=Budget(max_excluded=4, max_effective_bits=11))
    assert not out.approved and [s["added"] for s in out.steps] == ["model.layers.2"]
    assert "12.000 > max_effective_bits 11" in out.explanation


def test_layers_that_do_not_help_are_never_added(scripted):
    state, calls, tmp = scripted
    state["culprits"] = {"model.layers.1"}  # its restoration made the KLD worse on the slice
    state["deltas"]["model.layers.3"] = 0.0001
    state["parts"] = {"mlp.up_proj": 0.0002}
    out = search(config(), budget=Budget(max_excluded=10))
    assert not out.approved and "model.layers.1" not in [s["added"] for s in out.steps]
    # layers and projection types in one list, by the KLD they remove
    assert [s["added"] for s in out.steps] == ["model.layers.2", "model.layers.0", "mlp.up_proj", "model.layers.3"]
    assert "every part whose restoration lowers the KLD (4)" in out.explanation
    for entry in ranking(state["deltas"]):  # the noise filter: within one stderr of zero is not a candidate
        entry["delta_kld"]["stderr"] = entry["delta_kld"]["value"] * 2 if entry["name"] == "model.layers.3" else 0.0
        assert fallback._useful(entry) == (entry["name"] in ("model.layers.2", "model.layers.0"))
    state["deltas"] = {k: -0.001 for k in state["deltas"]}
    state["parts"] = {"mlp.up_proj": -0.002}
    out = search(config(), budget=Budget(max_excluded=10))
    assert not out.approved and not out.steps and "spread over the whole model" in out.explanation
    assert out.config_file is None


def test_a_projection_type_can_be_the_fallback(scripted):
    """SmoothQuant on small Llamas: the per-tensor INT8 input of every down_proj carries most of the
    error; keeping that projection type in high precision is the fix, and costs bits accordingly."""
    state, calls, tmp = scripted
    state["culprits"] = {"nothing"}
    state["fixing_parts"] = {"mlp.down_proj"}
    state["parts"] = {"mlp.down_proj": 0.08, "mlp.up_proj": 0.001}
    out = search(config(), budget=Budget(max_excluded=4))
    assert out.approved and [s["added"] for s in out.steps] == ["mlp.down_proj"] and out.steps[0]["kind"] == "part"
    assert out.steps[0]["exclude"] == ["*lm_head*", "*mlp.down_proj.*"]
    assert out.steps[0]["cost"]["params_kept_high"] == 4 * 500
    assert out.steps[0]["cost"]["effective_bits"] == pytest.approx((2000 * 8 + 2000 * 16) / 4000)


def test_alpha_list_is_searched_before_layers(scripted):
    state, calls, tmp = scripted
    state["good_alphas"] = {0.8}
    out = search(config(smoothquant_alpha=[0.5, 0.8]), budget=Budget(max_excluded=2))
    assert out.approved and not out.steps
    assert [c[0] for c in calls] == ["cand-alpha0.5", "cand-alpha0.8"] and all(c[2] == "never" for c in calls)
    assert load_config(out.config_file).quant.smoothquant_alpha == 0.8
    assert "alpha 0.8 passes" in out.explanation


def test_no_alpha_passes_then_the_best_one_falls_back(scripted):
    state, calls, tmp = scripted
    out = search(config(smoothquant_alpha=[0.5, 0.8]), budget=Budget(max_excluded=2))
    assert out.approved and out.steps[0]["name"] == "cand-alpha0.5-fallback1"
    assert [a["approved"] for a in out.alphas] == [False, False]
    assert calls[2] == ("cand-alpha0.5", ["*lm_head*"], "always")  # ranking only for the chosen alpha


def test_portable_config_makes_unreachable_relative_paths_absolute(tmp_path):
    data_file = tmp_path / "mine" / "calib.jsonl"
    data_file.parent.mkdir()
    data_file.write_text('{"text": "x"}\n')
    cfg = parse_config({"name": "p", "quant": {"format": "fp8"}, "calibration": {"dataset": "calib.jsonl"},
                        "gates": {"agreement": {"dataset": "calib_data/heldout_eval.jsonl", "max_mean_kld": 1}}},
                       str(tmp_path / "mine" / "cfg.yaml"))
    d = fallback.portable_config(cfg, tmp_path / "elsewhere" / "deep" / "fallback.yaml")
    assert Path(d["calibration"]["dataset"]) == data_file.resolve()  # would be lost from the new folder
    assert d["gates"]["agreement"]["dataset"] == "calib_data/heldout_eval.jsonl"  # resolves from the checkout anyway
    assert d["report"]["dir"] == "reports" and d["name"] == "p"

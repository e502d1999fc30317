"""Export + fidelity on the real default model: fp8 (FP16 and FP8 KV cache), int8_sq, int4_awq;
tampered exports are caught. Calibrations and exports are shared (tests/engines/calibrated.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.engines.calibrated import calibrated_state, exported, gate_config

pytestmark = pytest.mark.slow


def checks(build) -> dict[str, dict]:
    return {c["name"]: c for c in build.fidelity["checks"]}


def read_kv(folder: Path) -> tuple[dict, dict, list[str]]:
    from safetensors import safe_open

    hq = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        kv = [k for k in f.keys() if k.endswith(("k_scale", "v_scale"))]
    return hq, qc, kv


def test_fp8_fp16kv_export_passes_and_carries_no_kv_quantization(default_model):
    b = exported(default_model, "fp8", "fp16")
    assert b.passed, b.fidelity["checks"]
    hq, qc, kv = read_kv(b.folder)
    assert hq["quant_algo"] == "FP8" and hq["kv_cache_quant_algo"] is None
    assert "kv_cache_scheme" not in qc and kv == []
    t = b.fidelity["totals"]
    assert t["layers"] == 210 and t["n"] == 106_168_320 and t["mismatches"] == 0
    assert t["equal"] + t["ties"] == t["n"] and t["ties"] < t["n"] * 1e-3
    assert checks(b)["export_is_calibrated_model"]["ok"]  # FP8: ModelOpt exports the calibrated quantizers unchanged
    assert (b.folder / "tokenizer.json").is_file() and (b.folder / "fidelity.json").is_file()


def test_fp8_fp8kv_export_carries_kv_scales(default_model):
    b = exported(default_model, "fp8", "fp8")
    assert b.passed, b.fidelity["checks"]
    hq, qc, kv = read_kv(b.folder)
    assert hq["kv_cache_quant_algo"] == "FP8" and qc.get("kv_cache_scheme")
    assert len(kv) == 2 * 30  # one k_scale and one v_scale per decoder layer


def test_int8_sq_export_passes_and_reports_resmoothing(default_model):
    b = exported(default_model, "int8_sq")
    assert b.passed, b.fidelity["checks"]
    assert b.fidelity["totals"]["mismatches"] == 0
    changed = b.fidelity["changed_at_export"]
    # ModelOpt gives q/k/v and gate/up one pre_quant_scale each: 5 layers of 7 in each of 30 blocks
    assert len(changed) == 150
    assert not checks(b)["export_is_calibrated_model"]["ok"] and checks(b)["export_is_calibrated_model"]["severity"] == "warn"


def test_int4_awq_export_passes(default_model):
    b = exported(default_model, "int4_awq")
    assert b.passed, b.fidelity["checks"]
    assert b.fidelity["totals"]["mismatches"] == 0 and b.fidelity["totals"]["layers"] == 210


def test_export_is_reused_when_nothing_changed(default_model):
    from qval.export.build import ExportOptions, build_export

    first = exported(default_model, "fp8", "fp16")
    cfg = gate_config("calib-fp8-fp16", "fp8", "fp16")
    state = calibrated_state(default_model, "fp8", "fp16")
    again = build_export(cfg, default_model, state, state.parent.parent, ExportOptions(), log=lambda m: None)
    assert again.cached and again.fidelity == first.fidelity


def _tamper(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def fp8_views(default_model):
    from qval.export.fidelity import as_exported
    from qval.export.hf import calibrated_copy

    state = calibrated_state(default_model, "fp8", "fp16")
    return calibrated_copy(default_model, state), as_exported(calibrated_copy(default_model, state))


def fidelity_of(folder: Path, views, kv: str = "fp16"):  # noqa: ANN001
    from qval.export.fidelity import check_fidelity

    cfg = gate_config("t", "fp8", kv)
    return check_fidelity(folder, views[0], views[1], cfg.quant, torch.float32)


def test_changed_and_missing_scales_are_caught(default_model, fp8_views, tmp_path):
    """One export, two tamperings in different layers: a scale changed by 1 %, a scale deleted."""
    changed, dropped = "model.layers.7.mlp.down_proj", "model.layers.3.self_attn.q_proj"

    def edit(t):  # noqa: ANN001
        t[f"{changed}.weight_scale"] = t[f"{changed}.weight_scale"] * 1.01
        del t[f"{dropped}.weight_scale"]

    report = fidelity_of(_tamper(exported(default_model, "fp8").folder, tmp_path / "x", edit), fp8_views)
    assert not report.passed
    bad = {c.name: c.detail for c in report.failures()}
    assert {"weights_equal", "layer_coverage"} <= set(bad)
    assert dropped in bad["layer_coverage"] and changed in bad["weights_equal"]
    rows = [r for r in report.layers if r.get("counts", {}).get("mismatches")]
    assert [r["layer"] for r in rows] == [changed] and rows[0]["counts"]["mismatches"] > 0.9 * rows[0]["counts"]["n"]
    # every other layer still decodes to the calibrated weights
    assert report.totals["mismatches"] == rows[0]["counts"]["mismatches"]


def test_fp8_kv_declared_on_an_fp16_kv_candidate_is_caught(default_model, fp8_views, tmp_path):
    src = exported(default_model, "fp8", "fp8").folder  # an export with FP8 KV, checked against kv_cache: fp16
    report = fidelity_of(_tamper(src, tmp_path / "x", lambda t: None), fp8_views, kv="fp16")
    bad = {c.name: c.detail for c in report.failures()}
    assert "declared_kv_cache" in bad and "kv_scales" in bad
    assert "kv_cache_quant_algo = 'FP8'" in bad["declared_kv_cache"] and "60 k_scale/v_scale" in bad["kv_scales"]

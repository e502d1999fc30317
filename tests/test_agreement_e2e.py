"""End to end on the real default model (SmolLM2-135M-Instruct): calibrate, build, gate 1 (agreement),
verdict and report, through the CLI as a user runs it. Sized for two CPU cores: the runs share one
output folder, so gate 1's reference snapshot is filled once and read by every later run (each run
keeps its own run folder); diagnostics are off where a test reads none of them."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from qval.cli import app

from .conftest import small_config, write_config

runner = CliRunner()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The module's output folder: one reference snapshot, one run folder per test's config name."""
    return tmp_path_factory.mktemp("agreement_e2e_reports")


def gate(tmp_path, reports, data) -> tuple[int, dict, str]:
    path = write_config(tmp_path, data, f"{data['name']}.yaml")
    result = runner.invoke(app, ["gate", "--config", str(path), "--out", str(reports), "-q"])
    out = result.output + result.stderr
    report_file = reports / data["name"] / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return result.exit_code, report, out


def no_diagnostics(data: dict) -> dict:
    return {**data, "diagnostics": {"enabled": False}}


def test_none_candidate_is_exact_and_approved(tmp_path, reports, patch_reference):
    code, report, out = gate(tmp_path, reports, no_diagnostics(small_config("identity", fmt="none")))
    assert code == 0, out
    m = report["gates"]["agreement"]["measurements"]
    assert m["top1"]["value"] == 1.0
    assert m["mean_kld"]["value"] == 0.0
    assert report["gates"]["agreement"]["details"]["kld"]["max"] == 0.0
    assert report["verdict"]["decision"] == "APPROVE"
    assert (reports / "identity/report.md").read_text().startswith("# qval: identity — APPROVE")


def test_fp8_verdict_with_sane_figures(tmp_path, reports, patch_reference):
    code, report, out = gate(tmp_path, reports, small_config("fp8-small", fmt="fp8", kv="fp16"))  # diagnostics on
    assert code in (0, 1), out
    ag = report["gates"]["agreement"]
    top1, kld = ag["measurements"]["top1"], ag["measurements"]["mean_kld"]
    # FP8 on a 135M model: clearly not identical, clearly not broken
    assert 0.6 < top1["value"] < 1.0 and top1["lo"] < top1["value"] < top1["hi"]
    assert 0.0 < kld["value"] < 0.5 and kld["stderr"] > 0
    assert ag["details"]["kld"]["median"] < kld["value"] < ag["details"]["kld"]["p99"]
    assert ag["details"]["scored_positions"] == 8 * 255  # 8 chunks × (512/2 − 1)
    assert report["calibration"]["quantizers_enabled"] == 30 * 7 * 2  # 7 linears × (weight, input) × 30 layers; lm_head excluded
    assert report["candidate"]["kv_cache"] == "fp16"
    kv_entries = [e for e in report["calibration"]["mtq_config"]["quant_cfg"] if e["quantizer_name"] == "*[kv]_bmm_quantizer"]
    assert kv_entries == [{"quantizer_name": "*[kv]_bmm_quantizer", "enable": False}]
    assert report["model"]["compute_dtype"] == "float32" and report["schema_version"] == 1
    assert set(report["environment"]["versions"]) >= {"torch", "transformers", "nvidia-modelopt"}


def test_planted_layer_fault_is_rejected(tmp_path, reports, patch_reference, monkeypatch):
    """One decoder layer's weights badly damaged in the candidate only: the gate must reject."""
    from qval.engines import BUILDERS

    real = BUILDERS.get("fakequant")

    def damaged(ctx):
        engine = real(ctx)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in engine.model.model.layers[7].parameters():
                if p.dim() == 2:
                    p.add_(torch.randn(p.shape, generator=g) * p.std() * 3)
        return engine

    monkeypatch.setitem(BUILDERS._items, "fakequant", damaged)
    code, report, out = gate(tmp_path, reports, no_diagnostics(small_config("damaged", fmt="none")))
    assert code == 1, out
    assert report["verdict"]["decision"] == "REJECT"
    failed = {c["metric"] for c in report["verdict"]["checks"] if c["outcome"] == "fail"}
    assert {"top1", "mean_kld"} <= failed
    assert "REJECT" in out


def test_interrupted_run_resumes_without_recalibrating(tmp_path, reports, patch_reference, monkeypatch):
    import qval.gates.agreement.run as agreement
    import modelopt.torch.quantization as mtq

    data = no_diagnostics(small_config("resume", fmt="fp8"))
    # 1) the run is interrupted during gate 1, after calibration finished
    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(agreement, "token_stats", interrupt)
    code, _, out = gate(tmp_path, reports, data)
    assert code == 130 and "resumes" in out
    run = reports / "resume"
    assert (run / "calibrate/done.json").exists() and (run / "calibrate/quant_state.pt").exists()
    assert not (run / "gate_agreement/done.json").exists() and not (run / "report.json").exists()
    monkeypatch.undo()
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: patch_reference)

    # 2) the re-run must not calibrate again
    def no_quantize(*a, **k):
        raise AssertionError("recalibrated")

    monkeypatch.setattr(mtq, "quantize", no_quantize)
    code, report, out = gate(tmp_path, reports, data)
    assert code in (0, 1), out
    assert report["stages"]["calibrate"]["cached"] is True
    assert report["stages"]["gate_agreement"]["cached"] is False

    # 3) a third run reuses everything and loads no model at all
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: (_ for _ in ()).throw(AssertionError("loaded")))
    code, report2, out = gate(tmp_path, reports, data)
    assert code in (0, 1), out
    assert all(s["cached"] for s in report2["stages"].values())
    assert report2["verdict"] == report["verdict"]
    # ... and still names the reference (as the run that loaded it described it) and says where the time went
    assert report2["model"]["name"] == report["model"]["name"] and report2["model"]["loaded"] is False
    md = (reports / "resume/report.md").read_text()
    assert "computed in ?" not in md and "not loaded in this one" in md
    assert "every stage reused from an earlier run" in md


def test_changed_calibration_recalibrates(tmp_path, patch_reference):
    data = small_config("recal", fmt="fp8")
    path = write_config(tmp_path, data)
    assert runner.invoke(app, ["calibrate", "--config", str(path), "--out", str(tmp_path / "r"), "-q"]).exit_code == 0
    key1 = json.loads((tmp_path / "r/recal/calibrate/done.json").read_text())["key"]
    data["calibration"]["samples"] = 4
    path = write_config(tmp_path, data)
    result = runner.invoke(app, ["calibrate", "--config", str(path), "--out", str(tmp_path / "r"), "-q"])
    assert result.exit_code == 0 and "calibration done" in result.output
    key2 = json.loads((tmp_path / "r/recal/calibrate/done.json").read_text())["key"]
    assert key1 != key2

"""End to end on the real default model (SmolLM2-135M), through the CLI as a user runs it.

- `qval diagnose` on FP8 weights/activations with an FP8 KV cache: every enabled quantizer,
  KV-cache ones included, gets a row; layers.csv and diagnostics.html are written and render.
- A planted fault: one decoder layer's weight scales × 8 after every calibration (a broken
  calibration of that layer). `qval gate --fallback auto` rejects the candidate, ranks that layer
  first, keeps it in high precision, re-calibrates and passes.
Sized for two CPU cores: tiny calibrations, short gate-1 slices, one sensitivity chunk.
"""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
from typer.testing import CliRunner

from qval.cli import app
from qval.config import load_config

from ..conftest import small_config, write_config
from ..report.test_html import browser_check

runner = CliRunner()
FAULT_LAYER = 7


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output + (result.stderr or "")


@pytest.fixture(scope="module")
def fp8_kv8(tmp_path_factory, default_model):
    from qval import pipeline

    mp = pytest.MonkeyPatch()
    mp.setattr("qval.run_reference.load_model", lambda cfg: default_model)
    tmp = tmp_path_factory.mktemp("diag")
    data = small_config("fp8kv8", fmt="fp8", kv="fp8", diagnostics={"batches": 1, "sensitivity": "never"})
    data["calibration"].update(samples=2, seq_len=64, batch_size=2)
    path = write_config(tmp, data)
    code, out = cli("diagnose", "--config", str(path), "--out", str(tmp / "out"), "-q")
    again = cli("diagnose", "--config", str(path), "--out", str(tmp / "out"), "-q")  # every stage cached now
    mp.undo()
    return code, out, tmp / "out" / "fp8kv8", again


@pytest.mark.slow
def test_diagnose_covers_every_enabled_quantizer_kv_cache_included(fp8_kv8, default_model):
    import copy

    from qval.quantize.modelopt_adapter import iter_quantizers, restore_state

    code, out, run, _ = fp8_kv8
    assert code == 0, out
    page = json.loads((run / "diagnostics.json").read_text())
    rows = page["diagnostics"]["layers"]
    model = restore_state(copy.deepcopy(default_model.model), run / "calibrate" / "quant_state.pt")
    enabled = {n for n, q in iter_quantizers(model) if q.is_enabled}
    assert {r["quantizer"] for r in rows} == enabled and len(rows) == len(enabled)
    kinds = {k: sum(1 for r in rows if r["kind"] == k) for k in ("weight", "input", "kv")}
    assert kinds == {"weight": 210, "input": 210, "kv": 60}  # 30 layers × 7 linears, and k/v caches of 30 layers
    for r in rows:
        assert r["format"] == "FP8 E4M3" and r["maxbound"] == 448.0
        assert r["scale_max"] == pytest.approx(r["amax_max"] / 448.0)
        assert 20 < float(r["sqnr_db"]) < 40  # 3 mantissa bits: ~31 dB for any well-scaled tensor
        assert float(r["clipped"]) < 0.01 and 0 < float(r["range_use"]) <= 1.5
    csv_rows = list(csv.DictReader((run / "layers.csv").open()))
    assert [r["quantizer"] for r in csv_rows] == [r["quantizer"] for r in rows]
    assert "most sensitive" not in out and f"{len(rows)} quantizers diagnosed" in out
    assert not (run / "report.json").exists()  # diagnose is not a sign-off


@pytest.mark.slow
def test_diagnostics_html_renders_in_a_browser(fp8_kv8, chromium, tmp_path):
    code, out, run, _ = fp8_kv8
    assert code == 0, out
    html = (run / "diagnostics.html").read_text()
    assert "DIAGNOSTICS ONLY" in html and "self_attn.k_bmm" in html
    result = browser_check(chromium, tmp_path, html)
    assert result["images"] >= 6 and result["loaded"] == result["images"]


@pytest.mark.slow
def test_diagnose_again_reuses_every_stage(fp8_kv8):
    code, out, run, (code2, out2) = fp8_kv8
    assert code2 == 0, out2
    page = json.loads((run / "diagnostics.json").read_text())
    assert {k: v["cached"] for k, v in page["stages"].items()} == {"calibrate": True, "diagnose": True}
    assert out2.splitlines()[-3:] == out.splitlines()[-3:]  # same summary, same files


@pytest.fixture(scope="module")
def planted(tmp_path_factory, default_model):
    """INT4 AWQ (weight-only, blocks of 128) with layer 7's weight scales × 8 after calibration."""
    from qval import pipeline
    from qval.quantize import modelopt_adapter as adapter
    from qval.quantize.formats import FORMATS

    mp = pytest.MonkeyPatch()
    mp.setattr("qval.run_reference.load_model", lambda cfg: default_model)
    spec = FORMATS.get("int4_awq")

    def fewer_alphas(preset, q, alpha):  # AWQ-lite tries 11 strengths per layer; 3 are enough for a test
        cfg = spec.adjust(preset, q, alpha)
        cfg["algorithm"] = {**cfg["algorithm"], "alpha_step": 0.5}
        return cfg

    mp.setitem(FORMATS._items, "int4_awq", dataclasses.replace(spec, adjust=fewer_alphas))
    real = adapter.quantize

    def faulty(model, q, batches, device, alpha=None, on_batch=None):
        facts = real(model, q, batches, device, alpha=alpha, on_batch=on_batch)
        for name, qz in adapter.iter_quantizers(model):
            if name.startswith(f"model.layers.{FAULT_LAYER}.") and name.endswith("weight_quantizer") and qz.is_enabled:
                qz.amax = qz.amax * 8
        return facts

    mp.setattr(adapter, "quantize", faulty)
    tmp = tmp_path_factory.mktemp("planted")
    # measured on this setup: healthy mean KLD 0.38 (top-1 0.68), with the fault 1.15 (top-1 0.47)
    data = small_config("planted", fmt="int4_awq", diagnostics={"batches": 1, "slice_chunks": 1, "slice_ctx": 256})
    data["calibration"].update(samples=4, seq_len=128, batch_size=4)
    data["gates"]["agreement"].update(tokens=2048, ctx=512, min_top1=0.55, max_mean_kld=0.7, max_p99_kld=10.0)
    path = write_config(tmp, data)
    code, out = cli("gate", "--config", str(path), "--out", str(tmp / "out"), "-q", "--fallback", "auto", "--max-excluded", "2")
    mp.undo()
    return code, out, tmp / "out"


@pytest.mark.slow
def test_planted_fault_is_rejected_and_ranked_first(planted):
    code, out, root = planted
    report = json.loads((root / "planted" / "report.json").read_text())
    assert report["verdict"]["decision"] == "REJECT", out
    assert "mean_kld" in {c["metric"] for c in report["verdict"]["checks"] if c["outcome"] == "fail"}
    diag = report["diagnostics"]
    assert len(diag["layers"]) == report["calibration"]["quantizers_enabled"] == 210  # weight-only: 7 × 30
    ranking = diag["sensitivity"]["layers"]
    top, second = ranking[0], ranking[1]
    assert top["name"] == f"model.layers.{FAULT_LAYER}", [e["name"] for e in ranking[:5]]
    assert top["delta_kld"]["value"] > 2 * second["delta_kld"]["value"]
    assert top["delta_kld"]["value"] > 5 * top["delta_kld"]["stderr"]
    # the scale statistics see the same fault without running a single sensitivity slice
    rows = list(csv.DictReader((root / "planted" / "layers.csv").open()))
    faulty = [r for r in rows if r["unit"] == f"model.layers.{FAULT_LAYER}"]
    assert len(faulty) == 7 and all(float(r["range_use"]) == pytest.approx(0.125, rel=1e-3) for r in faulty)
    assert all("unused_range" in r["flags"] for r in faulty)
    assert not any("unused_range" in r["flags"] for r in rows if r["unit"] != f"model.layers.{FAULT_LAYER}")


@pytest.mark.slow
def test_fallback_excludes_that_layer_and_then_passes(planted, chromium, tmp_path):
    code, out, root = planted
    assert code == 0, out
    assert "fallback: APPROVE" in out
    record = json.loads((root / "planted" / "fallback.json").read_text())
    assert record["approved"] and len(record["steps"]) == 1
    step = record["steps"][0]
    assert step["added"] == f"model.layers.{FAULT_LAYER}" and step["exclude"][-1] == f"*model.layers.{FAULT_LAYER}.*"
    assert step["cost"]["effective_bits"] > step["cost"]["base_effective_bits"]
    written = load_config(record["config_file"])
    assert written.quant.exclude == ["*lm_head*", f"*model.layers.{FAULT_LAYER}.*"]
    final = json.loads((root / "planted-fallback1" / "report.json").read_text())
    assert final["verdict"]["decision"] == "APPROVE"
    assert final["calibration"]["quantizers_enabled"] == 210 - 7  # the layer really is unquantized
    html = (root / "planted" / "report.html").read_text()
    assert "Fallback search" in html
    result = browser_check(chromium, tmp_path, html)
    # KLD histogram; weight SQNR, scale, range use, flushed (weight-only: no activation charts); 2 rankings
    assert result["images"] == 7 and result["loaded"] == result["images"]


@pytest.mark.slow
def test_diagnostics_take_the_calibrations_batches_whatever_the_free_memory_now(tmp_path, default_model, monkeypatch):
    """`batch_size: auto` follows the free memory when it is decided. The calibration decides it
    (here: 2) and records it; the diagnostics, later, with more in memory (here auto would say 1),
    must take the calibration's batches, or two runs of one gate see different samples (on the
    H200: 62 and 54 samples of activations in two runs of the same 8B gate)."""
    from qval import calibration, pipeline

    sizes = iter([2])
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: default_model)
    monkeypatch.setattr(calibration, "auto_batch_size", lambda cfg, reference: next(sizes, 1))
    data = small_config("autobs", fmt="fp8", diagnostics={"batches": 1, "sensitivity": "never"})
    data["calibration"].update(samples=4, seq_len=32, batch_size="auto")
    code, out = cli("diagnose", "--config", str(write_config(tmp_path, data)), "--out", str(tmp_path / "out"), "-q")
    assert code == 0, out
    page = json.loads((tmp_path / "out" / "autobs" / "diagnostics.json").read_text())
    assert page["calibration"]["calibration"]["batch_size"] == 2
    assert page["diagnostics"]["activation_batches"] == 1 and page["diagnostics"]["activation_tokens"] == 2 * 32

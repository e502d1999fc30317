"""The reference snapshot end to end on the built-in model (CPU-sized): `qval reference` fills it
with the reference alone, then two different candidates are gated against it without one
reference forward pass on candidate-independent inputs; a sequential run (one model in memory at
a time) gives the same figures as the run with both in memory; both modes report peak memory."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

from qval import pipeline
from qval.cli import app
from qval.engines import concurrent

from ..conftest import ROOT, small_config, write_config

runner = CliRunner()
GATES = {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 1024, "ctx": 256,
                       "min_top1": 0.5, "max_mean_kld": 1.0},
         "longgen": {"max_prompts": 2, "new_tokens": 48, "window": 16, "edge": 16, "piece": 32, "min_late_top1": 0.0},
         "retrieval": {"haystack": str(ROOT / "calib_data/longctx_docs.jsonl"), "lengths": [256], "depths": [0.0, 1.0],
                       "trials": 1, "margin": 1.0}}


def config(name: str, **extra) -> dict:  # noqa: ANN003
    cfg = small_config(name, fmt="fp8", gates=GATES, calibration={"samples": 4, "seq_len": 128})
    cfg["diagnostics"] = {"enabled": False}
    cfg.update(extra)
    return cfg


def invoke(tmp_path, command: str, data: dict) -> tuple[int, dict, str]:  # noqa: ANN001
    path = write_config(tmp_path, data, f"{data['name']}.yaml")
    result = runner.invoke(app, [command, "--config", str(path), "--out", str(tmp_path / "reports"), "-q"])
    report_file = tmp_path / "reports" / data["name"] / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() and command == "gate" else {}
    return result.exit_code, report, result.output + (result.stderr or "")


@pytest.fixture(scope="module")
def against_snapshot(tmp_path_factory, default_model):
    """`qval reference` fills the snapshot with the reference alone, then two candidates (`cand-a`: FP8,
    `cand-b`: FP8 with an FP8 KV cache) are gated against it, both models in memory: the folder and each
    run's (exit code, report, output), read by the tests below."""
    tmp = tmp_path_factory.mktemp("snapshot_pipeline")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("qval.run_reference.load_model", lambda cfg: default_model)
        mp.setattr(concurrent, "can_pair", lambda engines: False)  # count every call in this process
        runs = {"fill": invoke(tmp, "reference", config("fill"))}
        for name, extra in (("cand-a", {}), ("cand-b", {"quant": {"format": "fp8", "kv_cache": "fp8"}})):
            runs[name] = invoke(tmp, "gate", config(name, **extra))
    return tmp, runs


@pytest.mark.slow
def test_candidates_against_a_filled_snapshot_make_no_reference_pass(against_snapshot):
    tmp_path, runs = against_snapshot
    code, _, out = runs["fill"]
    assert code == 0, out
    assert "reference snapshot" in out and "agreement" in out
    for name in ("cand-a", "cand-b"):
        code, report, out = runs[name]
        assert code in (0, 1), out
        snap = report["model"]["snapshot"]
        assert snap["reference_forward_calls"] == 0 and snap["reused_calls"] > 0, snap
        for gate in GATES:
            used = report["gates"][gate]["details"]["snapshot"]
            assert used["reference_forward_calls"] == 0 and used["key"] == snap["key"], (gate, used)
        ag = report["gates"]["agreement"]["details"]
        assert ag["kld_bound"]["mean_kld_upper"] >= ag["kld_bound"]["mean_kld"] > 0
        assert "kld_audit" not in ag  # nothing was computed in full: there is nothing to audit against
        md = (tmp_path / "reports" / name / "report.md").read_text()
        assert f"Reference snapshot {snap['key'][:12]}" in md and "this run computed 0 reference passes" in md
        assert all("memory" in st for k, st in report["stages"].items() if not st["cached"])


@pytest.mark.slow
def test_sequential_run_equals_both_in_memory(tmp_path, against_snapshot, default_model, monkeypatch):
    """Sequential calibrates the loaded weights in place: each load is a fresh copy of the session's model.
    The run with both in memory is `cand-a` above (the same config under another name)."""
    loads = []

    def load(cfg):  # noqa: ANN001, ANN202
        loads.append(1)
        return dataclasses.replace(default_model, model=copy.deepcopy(default_model.model))

    monkeypatch.setattr("qval.run_reference.load_model", load)
    monkeypatch.setattr(concurrent, "can_pair", lambda engines: False)
    _, both, out = against_snapshot[1]["cand-a"]
    assert both, out
    (tmp_path / "seq").mkdir()  # its own report folder: its own snapshot, filled by the sequential run itself
    _, seq, out = invoke(tmp_path / "seq", "gate", config("seq", snapshot={"sequential": True}))
    assert seq, out
    assert len(loads) >= 3  # fill, calibrate (in place), build (consumed); the judge's return when the texts differ
    for gate in GATES:
        assert seq["gates"][gate]["measurements"] == both["gates"][gate]["measurements"], gate
    assert seq["verdict"]["decision"] == both["verdict"]["decision"]
    assert seq["model"]["sequential"] is True and seq["model"]["snapshot_fill"]["gates"].keys() == set(GATES)
    # every reference pass was the fill's, in its own phase: none in the gates' (candidate) phase
    fill = seq["model"]["snapshot_fill"]["gates"]
    assert all(seq["gates"][g]["details"]["snapshot"]["reference_forward_calls"] == 0 for g in GATES)
    assert sum(f["reference_forward_calls"] for f in fill.values()) == seq["model"]["snapshot"]["reference_forward_calls"] > 0


@pytest.mark.slow
def test_sequential_diagnostics_hold_one_model(tmp_path, default_model, monkeypatch):
    """`qval diagnose` in sequential mode restores the calibrated candidate onto the reference's own
    weights (no copy of the model anywhere in the diagnostics stages) and ranks sensitivity against
    the slices' reference logits kept compactly in the snapshot: the scale statistics are the
    in-memory run's to the last digit, the ranking's KLDs the snapshot's estimates of the same.
    (Before: the diagnostics deep-copied the reference beside it — two models in memory.)"""
    real_deepcopy = copy.deepcopy
    monkeypatch.setattr("qval.run_reference.load_model",  # each load a fresh copy of the session's model
                        lambda cfg: dataclasses.replace(default_model, model=real_deepcopy(default_model.model)))
    diag = {"enabled": True, "batches": 1, "sensitivity": "always", "slice_chunks": 1, "slice_ctx": 64}
    code, _, out = invoke(tmp_path, "diagnose", config("both", diagnostics=diag))
    assert code == 0, out
    both = json.loads((tmp_path / "reports" / "both" / "diagnostics.json").read_text())["diagnostics"]

    def no_model_copies(obj, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        assert not isinstance(obj, torch.nn.Module), "a sequential run copied a model"
        return real_deepcopy(obj, *a, **k)

    monkeypatch.setattr(copy, "deepcopy", no_model_copies)  # anywhere in qval: the loads above are the only copies
    (tmp_path / "seq").mkdir()
    code, _, out = invoke(tmp_path / "seq", "diagnose", config("seq", diagnostics=diag, snapshot={"sequential": True}))
    assert code == 0, out
    seq = json.loads((tmp_path / "seq" / "reports" / "seq" / "diagnostics.json").read_text())["diagnostics"]
    assert seq["layers"] == both["layers"]
    a, b = both["sensitivity"], seq["sensitivity"]
    assert [r["name"] for r in a["layers"]] and len(a["layers"]) == len(b["layers"])
    base_a, base_b = a["base_kld"]["value"], b["base_kld"]["value"]
    assert a["positions"] == b["positions"] and abs(base_b / base_a - 1) < 0.02, (base_a, base_b)

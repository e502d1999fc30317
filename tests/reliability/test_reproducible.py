"""Reproducibility on a CPU: the same config and seed, run twice in fresh folders, give the same
report figure for figure, and the same bytes for the calibration state and gate 1's positions.

benchmarks/compare_reports.py does the comparison (the same one that checks the H200 runs,
benchmarks/RESULTS.md §12). FP8 candidate, all three gates small (diagnostics off: they add
minutes on two cores and are statistics of the same tensors), on the real default model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qval.cli import app

from ..conftest import ROOT, small_config, write_config

pytestmark = pytest.mark.slow


def compare_reports():
    spec = importlib.util.spec_from_file_location("compare_reports", ROOT / "benchmarks/compare_reports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config(tmp_path: Path) -> dict:
    bleu = [json.loads(x) for x in (ROOT / "calib_data/bleu_eval.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    bleu_file = tmp_path / "bleu.jsonl"
    keep = [r for r in bleu if r["lang"] == "en"][:2] + [r for r in bleu if r["lang"] == "zh"][:2]
    bleu_file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep), encoding="utf-8")
    return small_config("repro", fmt="fp8", kv="fp16", gates={
        "agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 1024, "ctx": 512, "min_top1": 0.0,
                      "max_mean_kld": 1e9, "max_p99_kld": 1e9},
        "quality": {"bleu_dataset": str(bleu_file), "bleu_max_new_tokens": 12, "bootstrap": 100, "max_ppl_ratio": 1e9,
                    "max_bleu_drop": 100.0},
        "longgen": {"new_tokens": 32, "window": 8, "edge": 8, "max_prompts": 2, "batch_size": 2, "piece": 16,
                    "max_loops_excess": 1000, "max_late_drift": 1e9},
    }, calibration={"samples": 4, "seq_len": 128}, diagnostics={"enabled": False, "sensitivity": "never"})


def test_two_runs_in_fresh_folders_are_identical(tmp_path, patch_reference):
    cfg = write_config(tmp_path, config(tmp_path), "repro.yaml")
    runs = []
    for i in (1, 2):
        out = tmp_path / f"run{i}"  # a fresh folder each: calibration and the reference's generations recomputed
        result = CliRunner().invoke(app, ["gate", "--config", str(cfg), "--out", str(out), "-q"])
        assert result.exit_code in (0, 1), result.output + result.stderr
        runs.append(out / "repro")
    a, b = (json.loads((r / "report.json").read_text(encoding="utf-8")) for r in runs)
    assert not a["stages"]["calibrate"]["cached"] and not b["gates"]["longgen"]["details"]["reference_generation"]["cached"]
    res = compare_reports().compare(a, b)
    assert res["differing"] == 0, res["differing_figures"][:5]
    assert res["figures"] > 250 and res["only_in_one"] == []
    assert {s for s in res["by_section"]} >= {"gates.agreement", "gates.quality", "gates.longgen", "verdict", "calibration"}
    # the strings that differ are the run folders' paths and what hashes them (stage keys), nothing else
    assert all("/run1/" in str(d["a"]) or d["path"].endswith(("key", "config_hash")) for d in res["differing_strings"])
    assert a["verdict"] == b["verdict"]
    for name in ("calibrate/quant_state.pt", "gate_agreement/positions.npz"):
        assert sha(runs[0] / name) == sha(runs[1] / name), name
    assert a["environment"]["determinism"] == {"mode": "cpu"}  # a CPU run: nothing set, and the report says so

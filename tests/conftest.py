"""Shared fixtures. The real default model is loaded once per session (≈20 s) and shared;
tests that change it work on copies."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model():
    """The built-in reference (SmolLM2-135M-Instruct, dequantized GGUF), loaded once."""
    warnings.filterwarnings("ignore")
    from qval.config import ModelConfig
    from qval.models import load_model

    return load_model(ModelConfig())


@pytest.fixture
def patch_reference(monkeypatch, default_model):
    """Make every pipeline Session reuse the session's loaded model instead of reloading it."""
    from qval import pipeline

    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: default_model)
    return default_model


def write_config(folder: Path, data: dict[str, Any], name: str = "cfg.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def small_config(name: str, fmt: str = "fp8", kv: str = "fp16", **sections: Any) -> dict[str, Any]:
    """A config sized for CI on two cores: few calibration samples, a short gate 1."""
    cfg: dict[str, Any] = {
        "name": name,
        "quant": {"format": fmt, "kv_cache": kv},
        "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 8, "seq_len": 256},
        "gates": {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 4096, "ctx": 512,
                                "min_top1": 0.8, "max_mean_kld": 0.1, "max_p99_kld": 1.0}},
    }
    for k, v in sections.items():
        cfg[k] = copy.deepcopy(v) if not isinstance(cfg.get(k), dict) else {**cfg[k], **v}
    return cfg


def gate4_result(drops: list[float], items: int = 100) -> dict[str, Any]:
    """Gate 4's finished result as report.json stores it, built by its judge: one right/wrong suite
    `s<i>` per drop, of `items` items each, whose accuracy drop (reference − candidate) is the drop
    rounded to a multiple of 1/items (right→wrong flips, or wrong→right ones for a negative drop)."""
    from qval.config import parse_config
    from qval.judges.tasks import summarize

    labels = [f"s{i}" for i in range(len(drops))]
    data = small_config("gate4", "none")
    data["gates"]["tasks"] = {"suites": [{"builtin": "choice", "name": x, "margin": 0.5} for x in labels]}
    suites = []
    for x, d in zip(labels, drops):
        k = round(d * items)
        ref = [i >= -k for i in range(items)]  # wrong on the first −k items where the candidate gains them
        cand = [i >= k for i in range(items)]  # wrong on the first k items where it loses them
        suites.append({"suite": x, "source": "builtin:choice", "kinds": ["choice"], "default_chance": 0.25, "seconds": 0.0,
                       "rows": [{"id": str(i), "ref_right": r, "cand_right": c} for i, (r, c) in enumerate(zip(ref, cand))]})
    return summarize(parse_config(data, "<gate 4 result>"), suites, 1.0).to_dict()

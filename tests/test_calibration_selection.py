"""calibration.sample_seed: which windows of the calibration data calibrate (issue 29's healthy
variants). Without it the selection is the one every earlier run made (the first `samples`
windows), so the README's figures cannot move; with it, a seeded draw of as many windows, recorded
in the calibration's facts (report.json's `calibration.calibration`) and part of the calibrate
stage's key (the whole `calibration` section is)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qval.calibration import calibration_samples, select_windows
from qval.config import ConfigError, load_config, parse_config
from qval.data import chunk, read_texts, token_stream

ROOT = Path(__file__).resolve().parent.parent
#: sha256 of json.dumps(samples) of checks/fp8_kvfp16.yaml's calibration with the built-in tokenizer,
#: computed by the code before sample_seed existed (commit 119052e: `chunk(ids, 512, limit=64)`)
SHIPPED_DEFAULT = "f93139374ebb8dcdb526d13e112ca3ba71ef43903a78f8f4c25755f69026cb97"


class CharTokenizer:
    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [1 + ord(c) % 250 for c in text]}


def cfg_with(tmp_path: Path, **calibration: object):
    data = tmp_path / "calib.jsonl"
    data.write_text("".join(json.dumps({"text": f"document {i} " + "abcdefghij" * (3 + i % 5)}) + "\n" for i in range(40)),
                    encoding="utf-8")
    return parse_config({"name": "c", "quant": {"format": "fp8"}, "gates": {"agreement": {"min_top1": 0.5}},
                         "calibration": {"dataset": str(data), "samples": 6, "seq_len": 32, **calibration}}, "c.yaml")


def test_without_a_seed_the_first_windows_in_order(tmp_path: Path) -> None:
    cfg = cfg_with(tmp_path)
    ids = token_stream(read_texts(cfg.calibration.dataset), CharTokenizer(), 0)
    samples, info = calibration_samples(cfg, CharTokenizer())
    assert samples == chunk(ids, 32, limit=6)  # the selection before sample_seed existed
    assert info["sample_seed"] is None and "windows" not in info


def test_a_seed_draws_other_windows_of_the_same_stream(tmp_path: Path) -> None:
    ids = token_stream(read_texts(cfg_with(tmp_path).calibration.dataset), CharTokenizer(), 0)
    every = chunk(ids, 32)
    drawn = {}
    for seed in (0, 1, 2):
        samples, info = calibration_samples(cfg_with(tmp_path, sample_seed=seed), CharTokenizer())
        assert len(samples) == 6 and info["samples_used"] == 6 and info["sample_seed"] == seed
        assert info["windows_available"] == len(every) and samples == [every[i] for i in info["windows"]]
        assert info["windows"] == sorted(set(info["windows"]))  # without replacement, in dataset order
        drawn[seed] = info["windows"]
    assert len({tuple(w) for w in drawn.values()}) == 3  # each seed its own sample
    assert drawn[1] == calibration_samples(cfg_with(tmp_path, sample_seed=1), CharTokenizer())[1]["windows"]  # repeatable
    assert drawn[0] != list(range(6))  # seed 0 is a draw, not the default


def test_the_draw_is_spread_over_the_data() -> None:
    """Over many seeds every window is drawn about samples/available of the time (no window favoured)."""
    counts = [0] * 20
    for seed in range(400):
        for i in select_windows(20, 5, seed):
            counts[i] += 1
    assert min(counts) > 60 and max(counts) < 140  # expectation 100 each; binomial sd ≈ 8.7


def test_the_seed_is_validated() -> None:
    base = {"name": "c", "quant": {"format": "fp8"}, "gates": {"agreement": {"min_top1": 0.5}}}
    with pytest.raises(ConfigError, match="sample_seed"):
        parse_config({**base, "calibration": {"sample_seed": -1}}, "c.yaml")
    with pytest.raises(ConfigError, match="sample_seed"):
        parse_config({**base, "calibration": {"sample_seed": "x"}}, "c.yaml")


def test_the_shipped_default_selection_is_unchanged(default_tokenizer) -> None:
    """The main command's calibration samples, token for token, as before sample_seed existed."""
    cfg = load_config(ROOT / "checks/fp8_kvfp16.yaml")
    samples, info = calibration_samples(cfg, default_tokenizer)
    assert info["samples_used"] == 64 and info["sample_seed"] is None
    assert hashlib.sha256(json.dumps(samples).encode()).hexdigest() == SHIPPED_DEFAULT

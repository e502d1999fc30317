"""`qval validate` means valid: every data file the config names is opened and parsed, format ×
backend × device are compatible, each gate's context fits the model's positions (read from its
config, no weights), and the data covers each budget (tokenizer only). `gate` runs the same checks
before any model loads, so each bad config below is exit 2 in seconds from both commands.

The model is tests/reliability/helpers.py's word-level folder (config.json and a tokenizer, no
weights): a command that got as far as loading it would fail differently."""

from __future__ import annotations

import time

import pytest
import torch

from qval import models, pipeline
from tests.conftest import write_config

from .helpers import cli, clean_error, word_config, word_text, write_jsonl


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model is a test failure: the preflight must stop the command first."""
    def refuse(cfg):  # noqa: ANN001, ANN202
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("qval.run_reference.load_model", refuse)
    monkeypatch.setattr(models, "load_model", refuse)  # qval sweep loads its reference from here


def both_refuse(tmp_path, cfg: dict, *expected: str) -> None:
    """validate and gate: exit 2, each `expected` text in the message, no traceback; gate in seconds
    without loading a model (the no_model_load fixture)."""
    path = write_config(tmp_path, cfg)
    out = clean_error("validate", "--config", path)
    for text in expected:
        assert text in out, out
    t0 = time.perf_counter()
    out = clean_error("gate", "--config", path, "--out", tmp_path / "runs", "-q")
    assert time.perf_counter() - t0 < 20, "gate took too long to refuse a bad config"
    for text in expected:
        assert text in out, out
    assert "a model was loaded" not in out and not (tmp_path / "runs" / cfg["name"] / "calibrate").exists()


def test_a_good_config_is_valid(tmp_path, no_model_load):
    code, out = cli("validate", "--config", write_config(tmp_path, word_config(tmp_path)))
    assert code == 0 and ": valid (words: fp8 weights" in out and "warning" not in out, out


def test_a_jsonl_line_that_is_not_json(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    bad = tmp_path / "heldout_bad.jsonl"
    bad.write_text('{"text": "alpha bravo"}\n{"text": "charlie\n', encoding="utf-8")
    cfg["gates"]["agreement"]["dataset"] = str(bad)
    both_refuse(tmp_path, cfg, f"{bad}:2: not valid JSON")


def test_an_empty_data_file(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    cfg["calibration"]["dataset"] = str(empty)
    both_refuse(tmp_path, cfg, f"{empty}: the dataset is empty")


def test_records_whose_text_is_empty(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["agreement"]["dataset"] = str(write_jsonl(tmp_path / "blank.jsonl", ["", "  "]))
    both_refuse(tmp_path, cfg, "blank.jsonl: its 2 records hold no text")


def test_a_record_without_the_text_field(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["agreement"]["dataset"] = str(write_jsonl(tmp_path / "body.jsonl", [word_text(500)], field="body"))
    both_refuse(tmp_path, cfg, "body.jsonl: record 0 has no text", "Its keys: body")


def test_longgen_prompts_without_a_prompt_field(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["longgen"] = {"enabled": True, "prompts": str(write_jsonl(tmp_path / "p.jsonl", ["alpha"], field="text")),
                               "new_tokens": 64, "window": 16, "edge": 16, "max_late_kld": 0.1}
    both_refuse(tmp_path, cfg, "p.jsonl: record 0 needs a non-empty string field 'prompt'")


def test_bleu_records_without_a_reference(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["quality"] = {"enabled": True, "max_ppl_ratio": 1.1,
                               "bleu_dataset": str(write_jsonl(tmp_path / "b.jsonl", ["alpha"], field="prompt"))}
    both_refuse(tmp_path, cfg, "b.jsonl: record 0 needs non-empty string fields prompt, reference and lang")


def test_a_disabled_gate_is_not_read(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["longgen"] = {"enabled": False, "prompts": str(tmp_path / "missing.jsonl")}
    code, out = cli("validate", "--config", write_config(tmp_path, cfg))
    assert code == 0, out


def test_ctx_beyond_the_models_positions(tmp_path, no_model_load):
    cfg = word_config(tmp_path)  # the model holds 4096 positions (its config.json)
    cfg["gates"]["depth"] = {"enabled": True, "dataset": cfg["gates"]["agreement"]["dataset"], "ctx": 8192,
                             "tokens": 8192, "piece": 512, "max_mean_kld": 0.1}
    cfg["gates"]["retrieval"] = {"enabled": True, "haystack": cfg["gates"]["agreement"]["dataset"], "lengths": [4096],
                                 "margin": 0.5}
    both_refuse(tmp_path, cfg,
                "gates.depth.ctx: 8192 tokens of context do not fit the model's 4096 positions (max_position_embeddings)",
                "gates.retrieval.lengths (the longest and 16 answer tokens): 4112 tokens of context do not fit")


def test_ctx_of_the_builtin_gguf_model_is_read_from_its_metadata(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    del cfg["model"]  # the built-in default: a GGUF whose metadata says 8192 positions
    cfg["gates"]["agreement"]["ctx"] = 16384
    cfg["gates"]["agreement"]["tokens"] = 16384
    both_refuse(tmp_path, cfg, "gates.agreement.ctx: 16384 tokens of context do not fit the model's 8192 positions")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_nvfp4_and_cuda_on_a_cpu(tmp_path, no_model_load):
    both_refuse(tmp_path, word_config(tmp_path, quant={"format": "nvfp4"}), "quant.format nvfp4 needs a CUDA GPU")
    both_refuse(tmp_path, word_config(tmp_path, model={"device": "cuda"}), "model.device is 'cuda' but torch sees no CUDA device")


def test_realquant_with_format_none(tmp_path, no_model_load):
    cfg = word_config(tmp_path, quant={"format": "none"}, engine={"backend": "realquant"})
    both_refuse(tmp_path, cfg, "engine realquant needs a quantized format")


def test_an_export_of_a_format_qval_cannot_read_back(tmp_path, no_model_load):
    cfg = word_config(tmp_path, quant={"format": "w4a8_awq", "awq_block_size": 64}, engine={"backend": "export"})
    both_refuse(tmp_path, cfg, "engine export: quant.format w4a8_awq cannot be gated as an export",
                "qval exports and reads back fp8, int4_awq, int8_sq")


def test_a_dataset_too_small_for_the_budget(tmp_path, no_model_load):
    # gate 1 asks for 1024 tokens in chunks of 128; 300 words hold 2 whole chunks (256 tokens): 75 % short
    cfg = word_config(tmp_path, agreement_words=300)
    both_refuse(tmp_path, cfg, "shortfall beyond max_shortfall = 0.5: gates.agreement.tokens: asked for 1024 tokens "
                               "in whole chunks of 128, the data holds 256 (75% short)")


def test_calibration_too_small_for_samples_times_seq_len(tmp_path, no_model_load):
    cfg = word_config(tmp_path, calib_words=200)  # 4 samples of 128 asked, 1 whole sample there
    both_refuse(tmp_path, cfg, "calibration.samples: asked for 4 samples of 128 tokens, the data holds 1 (75% short)")


def test_a_haystack_too_short_for_the_retrieval_matrix(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["retrieval"] = {"enabled": True, "haystack": str(write_jsonl(tmp_path / "hay.jsonl", [word_text(100)])),
                                 "lengths": [512], "depths": [0.5], "margin": 0.5}
    both_refuse(tmp_path, cfg, "gates.retrieval.haystack: ", "is less than a haystack of")


def test_every_problem_at_once(tmp_path, no_model_load):
    cfg = word_config(tmp_path, engine={"backend": "realquant"}, quant={"format": "none"})
    cfg["gates"]["agreement"]["ctx"] = 8192
    cfg["gates"]["agreement"]["tokens"] = 8192
    out = clean_error("validate", "--config", write_config(tmp_path, cfg))
    assert "engine realquant needs a quantized format" in out and "gates.agreement.ctx: 8192 tokens" in out


def test_a_shortfall_within_the_limit_is_a_warning(tmp_path, no_model_load):
    cfg = word_config(tmp_path, agreement_words=800)  # 6 chunks of 128 = 768 of 1024 tokens: 25 % short
    code, out = cli("validate", "--config", write_config(tmp_path, cfg))
    assert code == 0, out
    assert "qval: warning: shortfall: gates.agreement.tokens: asked for 1024 tokens in whole chunks of 128, " \
           "the data holds 768 (25% short)" in out


def test_sweep_refuses_before_loading_the_reference(tmp_path, no_model_load):
    """A sweep preflights every candidate first: when none can run, exit 2 with each one's reason."""
    a = word_config(tmp_path / "a", agreement_words=300)  # gate 1's data 75 % short
    b = word_config(tmp_path / "b", name="none-rq", quant={"format": "none"}, engine={"backend": "realquant"})
    b["model"] = a["model"]  # a sweep has one reference
    paths = [write_config(tmp_path, a, "a.yaml"), write_config(tmp_path, b, "b.yaml")]
    out = clean_error("sweep", *paths, "--out", tmp_path / "runs", "-q")
    assert "no candidate of the sweep can run here" in out
    assert "words: shortfall beyond max_shortfall = 0.5: gates.agreement.tokens" in out
    assert "none-rq: " in out and "engine realquant needs a quantized format" in out

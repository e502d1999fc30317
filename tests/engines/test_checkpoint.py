"""The checkpoint backend: a finished checkpoint is gated with no calibration; a candidate that
does not share the reference's vocabulary is refused before any gate runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qval.engines.checkpoint import PROBE
from tests.engines.calibrated import build_context, exported, gate_config

pytestmark = pytest.mark.slow


def _copy_without_weights(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file() and p.suffix != ".safetensors":
            shutil.copy(p, dst / p.name)
    return dst


def _build(default_model, folder: Path, tmp_path: Path, fmt: str = "fp8"):  # noqa: ANN001, ANN202
    from qval.engines import BUILDERS

    cfg = gate_config("ckpt", fmt, engine={"backend": "checkpoint", "path": str(folder)})
    return BUILDERS.get("checkpoint")(build_context(default_model, cfg, None, tmp_path))


def test_vocab_size_mismatch_is_refused(default_model, tmp_path):
    from qval.errors import ModelError

    folder = _copy_without_weights(exported(default_model, "fp8").folder, tmp_path / "c")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = 32000
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocab_size 32000 differs from the reference's 49152"):
        _build(default_model, folder, tmp_path)


def test_tokenizer_with_other_ids_is_refused(default_model, tmp_path):
    from qval.errors import ModelError

    folder = _copy_without_weights(exported(default_model, "fp8").folder, tmp_path / "c")
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = default_model.tokenizer(PROBE, add_special_tokens=False)["input_ids"][0]
    a, b = default_model.tokenizer.convert_ids_to_tokens(first), "Ġthe"  # the probe's first token, and one it lacks
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelError, match="splits a probe text differently"):
        _build(default_model, folder, tmp_path)


def test_declared_format_must_match_the_config(default_model, tmp_path):
    from qval.errors import ConfigError

    with pytest.raises(ConfigError, match="quant.format is int8_sq but .* declares FP8"):
        _build(default_model, exported(default_model, "fp8").folder, tmp_path, fmt="int8_sq")


def test_checkpoint_is_gated_without_calibration(patch_reference, tmp_path):
    """End to end: `qval gate` on an earlier run's export; no calibrate stage, a report, a verdict;
    the stage key follows the checkpoint's content, not only its path."""
    from qval.pipeline import run_gate

    folder = exported(patch_reference, "fp8").folder
    cfg = gate_config("from-export", "fp8", tokens=512, engine={"backend": "checkpoint", "path": str(folder)})
    r = run_gate(cfg, out_dir=str(tmp_path))
    assert "calibrate" not in r.report["stages"] and r.report["calibration"] is None
    assert r.report["gates"]["agreement"]["status"] == "ok"
    eng = r.report["candidate"]["engine"]
    assert eng["backend"] == "checkpoint" and eng["checkpoint"]["quant_algo"] == "FP8"
    assert any("not calibrated by qval" in n for n in eng["notes"])
    assert r.verdict.approved, r.verdict.checks  # FP8 of this model is well inside small_config's loose limits

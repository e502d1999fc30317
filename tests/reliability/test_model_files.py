"""Model folders qval will not or cannot load: pickle-only weights (refused by design, with the
conversion to safetensors spelt out) and a truncated .safetensors behind `engine: checkpoint`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from qval.errors import ModelError
from qval.model_files import check_safetensors
from tests.conftest import small_config, write_config

from .helpers import clean_error


def _folder(tmp_path, name: str = "cand"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 49152}), encoding="utf-8")
    return folder


def test_pickle_only_reference_folder_is_refused_with_the_conversion(tmp_path):
    folder = _folder(tmp_path, "ref")
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    cfg = write_config(tmp_path, small_config("pk", model={"source": "path", "path": str(folder)}))
    out = clean_error("validate", "--config", cfg)
    assert "holds only pickle weights (pytorch_model.bin)" in out and "does not load pickles, by design" in out
    assert "save_pretrained" in out and f"{folder}-safetensors" in out and "model.path" in out


def test_pickle_only_checkpoint_candidate_is_refused(tmp_path):
    folder = _folder(tmp_path)
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    cfg = write_config(tmp_path, small_config("pk", engine={"backend": "checkpoint", "path": str(folder)}))
    out = clean_error("gate", "--config", cfg, "--out", tmp_path / "r", "-q")
    assert "engine.path" in out and "only pickle weights" in out


def _truncated(folder, cut: int):
    path = folder / "model.safetensors"
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, str(path))
    full = path.read_bytes()
    path.write_bytes(full[: len(full) - cut])
    return path, len(full)


def test_truncated_safetensors_names_the_file_and_the_bytes_missing(tmp_path):
    path, size = _truncated(_folder(tmp_path), cut=100)
    with pytest.raises(ModelError, match=rf"truncated safetensors file: its header declares {size} bytes, the file holds "
                                         rf"{size - 100} \(100 missing\)"):
        check_safetensors(path)
    path.write_bytes(path.read_bytes()[:20])  # cut inside the header
    with pytest.raises(ModelError, match="its header is cut off"):
        check_safetensors(path)


def test_truncated_safetensors_behind_a_checkpoint_engine(tmp_path):
    folder = _folder(tmp_path)
    path, _ = _truncated(folder, cut=1)
    cfg = write_config(tmp_path, small_config("trunc", engine={"backend": "checkpoint", "path": str(folder)}))
    out = clean_error("gate", "--config", cfg, "--out", tmp_path / "r", "-q")
    assert f"{path}: truncated safetensors file" in out and "copy or export it again" in out
    assert f"{path}: truncated" in clean_error("validate", "--config", cfg)


def test_truncated_shard_of_an_export_is_named(tmp_path):
    from qval.export.reader import load_tensors

    path, _ = _truncated(_folder(tmp_path, "export"), cut=10)
    with pytest.raises(ModelError, match=rf"{path}: truncated safetensors file"):
        load_tensors(path.parent)

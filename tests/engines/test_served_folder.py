"""The reference written as a folder a server loads (`launch.model: reference`): float weights, declared as such."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from qval.engines.served_setup import reference_folder


class _Tokenizer:
    def save_pretrained(self, folder) -> None:  # noqa: ANN001 - the folder's tokenizer files are not this test's subject
        (folder / "tokenizer_config.json").write_text("{}", encoding="utf-8")


def _reference(quantization: dict | None) -> SimpleNamespace:
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    if quantization is not None:  # as transformers >= 5.15 leaves it on a model dequantized from a GGUF
        model.config.quantization_config = quantization
    return SimpleNamespace(model=model, tokenizer=_Tokenizer(), fingerprint=f"tiny-{quantization}")


def test_a_dequantized_gguf_reference_is_written_without_its_source_quantization(tmp_path):
    ref = _reference({"quant_method": "gguf"})
    folder = reference_folder(ref, tmp_path)
    written = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in written  # vLLM 0.26 refused the folder: "Unknown quantization method: gguf"
    assert ref.model.config.quantization_config == {"quant_method": "gguf"}  # the reference itself is untouched
    from safetensors.torch import load_file

    tensors = load_file(str(next(folder.glob("*.safetensors"))))
    state = ref.model.state_dict()
    assert all(torch.equal(tensors[k], state[k]) for k in tensors)


def test_the_folder_is_written_once_and_reused(tmp_path):
    ref = _reference(None)
    first = reference_folder(ref, tmp_path)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert reference_folder(ref, tmp_path) == first and (first / "config.json").stat().st_mtime_ns == stamp


def test_a_folder_edited_after_it_was_written_is_written_again(tmp_path):
    ref = _reference(None)
    folder = reference_folder(ref, tmp_path)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)  # a damaged shard
    damaged = weights.read_bytes()
    again = reference_folder(ref, tmp_path)
    assert again == folder and next(again.glob("*.safetensors")).read_bytes() != damaged

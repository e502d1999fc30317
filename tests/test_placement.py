"""qval.placement: one GPU when the model fits it, every visible GPU when it does not, host memory
as the last resort (with its warning), a clear error beyond that; and load_model passes the plan
to transformers (tested on CPU with the GPUs and the loader stood in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qval import devices, models
from qval.config import ModelConfig
from qval.errors import ModelError
from qval.placement import HEADROOM, Placement, checkpoint_bytes, plan

GiB = 2**30


def test_one_gpu_when_it_fits() -> None:
    assert plan(50 * GiB, [80 * GiB, 80 * GiB], 100 * GiB) == Placement()
    assert plan(None, [80 * GiB], None) == Placement()  # unknown size: as before, one device


def test_spread_when_one_gpu_is_not_enough() -> None:
    p = plan(120 * GiB, [80 * GiB, 80 * GiB], 100 * GiB)
    assert p.device_map == "auto" and p.max_memory == {0: int(80 * GiB * (1 - HEADROOM)), 1: int(80 * GiB * (1 - HEADROOM))}
    assert "spread over 2 GPUs" in p.note and "cpu" not in p.max_memory
    assert p.load_kwargs() == {"device_map": "auto", "max_memory": p.max_memory}


def test_host_memory_only_as_the_last_resort_and_said_so() -> None:
    p = plan(200 * GiB, [80 * GiB, 80 * GiB], 200 * GiB)
    assert p.device_map == "auto" and p.max_memory["cpu"] == int(200 * GiB * (1 - HEADROOM))
    assert p.note.startswith("CPU offload") and "slower" in p.note


def test_a_model_that_fits_nowhere_is_refused_with_the_sizes() -> None:
    with pytest.raises(ModelError, match=r"fit neither the GPUs .* nor with the host"):
        plan(900 * GiB, [80 * GiB, 80 * GiB], 100 * GiB)


def test_modes() -> None:
    assert plan(500 * GiB, [80 * GiB] * 4, None, mode="single") == Placement()  # the user asked for one GPU
    assert plan(1 * GiB, [80 * GiB] * 2, None, mode="spread").device_map == "auto"
    assert plan(1 * GiB, [], None, mode="spread") == Placement()  # no GPU: nothing to spread over


def test_checkpoint_size_from_the_safetensors_files(tmp_path: Path) -> None:
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "notes.txt").write_bytes(b"x" * 99999)
    assert checkpoint_bytes(tmp_path, {}, 2) == 4000 and checkpoint_bytes(tmp_path, {}, 4) == 8000
    assert checkpoint_bytes(tmp_path, {"gguf_file": "m.gguf"}, 2) is None and checkpoint_bytes("org/model", {}, 2) is None


def test_load_model_spreads_a_model_too_large_for_one_gpu(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")  # an empty, whole safetensors file
    calls: dict = {}

    class Model:
        config = None

        def to(self, device):  # noqa: ANN001, ANN202
            calls["to"] = device
            return self

        def eval(self):  # noqa: ANN202
            return self

        def requires_grad_(self, flag):  # noqa: ANN001, ANN202
            return self

    def from_pretrained(target, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls["kwargs"] = kwargs
        return Model()

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(devices, "pick_device", lambda requested: "cuda")
    monkeypatch.setattr(models.determinism, "configure", lambda device: None)
    monkeypatch.setattr(models, "visible_memory", lambda: ([10 * GiB, 10 * GiB], 64 * GiB))
    monkeypatch.setattr(models, "checkpoint_bytes", lambda target, kwargs, size: 12 * GiB)
    monkeypatch.setattr(models, "load_tokenizer", lambda cfg: object())
    loaded = models.load_model(ModelConfig(source="path", path=str(tmp_path), dtype="bfloat16"))
    assert calls["kwargs"]["device_map"] == "auto" and set(calls["kwargs"]["max_memory"]) == {0, 1}
    assert "to" not in calls  # accelerate placed it; no .to() on top
    assert any("spread over 2 GPUs" in n for n in loaded.notes)
    calls.clear()
    monkeypatch.setattr(models, "checkpoint_bytes", lambda target, kwargs, size: 2 * GiB)
    models.load_model(ModelConfig(source="path", path=str(tmp_path), dtype="bfloat16"))
    assert "device_map" not in calls["kwargs"] and calls["to"] == "cuda"  # fits one GPU: as before

"""qval.determinism: what it sets on CUDA, that it leaves a CPU run alone, and what it records.

torch's flags are process-wide, so every test here puts them back as it found them."""

from __future__ import annotations

import pytest
import torch

from qval import determinism


@pytest.fixture
def clean(monkeypatch):
    """No deterministic mode configured, no CUBLAS_WORKSPACE_CONFIG, torch's flags restored after."""
    cuda = torch.backends.cuda
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, cuda.matmul.allow_tf32,
             cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled())
    for var in ("CUBLAS_WORKSPACE_CONFIG", determinism.ENV_SWITCH, determinism.ENV_ATTENTION):
        monkeypatch.delenv(var, raising=False)
    determinism.reset_for_tests()
    yield
    determinism.reset_for_tests()
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.utils.deterministic.fill_uninitialized_memory = saved[2]
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved[3:6]
    cuda.matmul.allow_tf32 = saved[6]
    cuda.enable_cudnn_sdp(saved[7])
    cuda.enable_flash_sdp(saved[8])
    cuda.enable_mem_efficient_sdp(saved[9])
    cuda.enable_math_sdp(saved[10])


def flags() -> tuple:
    cuda = torch.backends.cuda
    return (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32, cuda.matmul.allow_tf32, cuda.cudnn_sdp_enabled())


def test_a_cpu_run_changes_nothing(clean):
    import os

    before = flags()
    assert determinism.configure("cpu") == {"mode": "cpu"}
    assert flags() == before and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert determinism.key("cpu") is None  # a CPU run's stage and cache keys stay what they were


def test_cuda_sets_every_setting_and_records_it(clean):
    import os

    d = determinism.configure("cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert d == {"mode": "on", "attention": "no-cudnn", "cublas_workspace_config": ":4096:8", "deterministic_algorithms": True,
                 "deterministic_warn_only": True, "fill_uninitialized_memory": False, "cudnn_deterministic": True,
                 "cudnn_benchmark": False, "tf32_matmul": False, "tf32_cudnn": False,
                 "sdpa_backends": {"cudnn": False, "flash": True, "efficient": True, "math": True}}
    assert determinism.describe() == d and determinism.configure("cuda") == d  # once per process: a second call is a no-op
    assert determinism.key("cuda") == {"deterministic": True, "attention": "no-cudnn"}


def test_switched_off_sets_nothing(clean, monkeypatch):
    import os

    monkeypatch.setenv(determinism.ENV_SWITCH, "0")
    before = flags()
    assert determinism.configure("cuda")["mode"] == "off"
    assert flags() == before and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert determinism.key("cuda") == {"deterministic": False, "attention": "torch-default"}


def test_a_callers_workspace_setting_is_kept_and_noted(clean, monkeypatch):
    import os

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    d = determinism.configure("cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert "was set by the caller and kept" in d["notes"][0]


def test_attention_choice_and_a_wrong_name(clean, monkeypatch):
    monkeypatch.setenv(determinism.ENV_ATTENTION, "math")
    d = determinism.configure("cuda")
    assert d["attention"] == "math" and d["sdpa_backends"] == {"cudnn": False, "flash": False, "efficient": False, "math": True}
    determinism.reset_for_tests()
    monkeypatch.setenv(determinism.ENV_ATTENTION, "fast")
    with pytest.raises(ValueError, match="QVAL_ATTENTION='fast': choose one of no-cudnn, math, torch-default"):
        determinism.configure("cuda")


def test_load_model_configures_before_loading(clean, monkeypatch):
    """The pipeline's one entry for models calls configure with the device, first."""
    from qval import model_location, models
    from qval.config import ModelConfig

    seen = []
    monkeypatch.setattr(determinism, "configure", lambda device, *a, **k: seen.append(device))
    monkeypatch.setattr(model_location, "locate", lambda cfg: (_ for _ in ()).throw(RuntimeError("stop after configure")))
    with pytest.raises(RuntimeError, match="stop after configure"):
        models.load_model(ModelConfig(device="cpu"))
    assert seen == []  # locate comes first: a bad model path fails before any setting changes
    monkeypatch.setattr(model_location, "locate", lambda cfg: ("x", {}, "x", "fp"))
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop at load")))
    with pytest.raises(Exception):
        models.load_model(ModelConfig(device="cpu"))
    assert seen == ["cpu"]


def test_report_md_states_gpu_numerics_and_leaves_a_cpu_report_as_it_was(clean):
    from qval.report.formatting import numerics_line

    assert numerics_line({"mode": "cpu"}) is None and numerics_line(None) is None
    line = numerics_line(determinism.configure("cuda"))
    assert line == "numerics: deterministic mode (attention no-cudnn, CUBLAS_WORKSPACE_CONFIG :4096:8; qval/determinism.py)"
    assert "may differ from run to run" in numerics_line({"mode": "off"})


def test_distinct_index_writes_lifts_the_switch_only_within_and_restores_it_exactly():
    """The static decoder's step runs its distinct-index writes outside torch's sorted index_put_;
    the switch and its warn-only flag come back as they were, also when the body raises, and
    outside deterministic mode nothing changes."""
    was, was_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with determinism.distinct_index_writes():
            assert not torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=False)
        with pytest.raises(RuntimeError, match="inside"):
            with determinism.distinct_index_writes():
                raise RuntimeError("inside")
        assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(False)
        with determinism.distinct_index_writes():
            assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn)

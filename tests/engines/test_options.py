"""engine.options are validated when the config loads, per backend, with the allowed keys named."""

from __future__ import annotations

import pytest

from qval.config import parse_config
from qval.errors import ConfigError
from tests.conftest import small_config


def test_export_options_are_typed():
    cfg = parse_config(small_config("x", engine={"backend": "export", "options": {"dtype": "float16", "trtllm_checkpoint": True}}))
    assert cfg.engine.options == {"dtype": "float16", "trtllm_checkpoint": True}


def test_unknown_option_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"options.dtpye: Extra inputs are not permitted.*allowed options for export: dtype, trtllm_checkpoint, tp_size"):
        parse_config(small_config("x", engine={"backend": "export", "options": {"dtpye": "float16"}}))


def test_bad_option_value():
    with pytest.raises(ConfigError, match=r"engine = .*options.tp_size"):
        parse_config(small_config("x", engine={"backend": "tensorrt_llm", "options": {"tp_size": 0}}))


def test_backend_options_name_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"options.gemm: Extra inputs are not permitted.*allowed options for fakequant: runtime"):
        parse_config(small_config("x", engine={"backend": "fakequant", "options": {"gemm": "fast"}}))
    with pytest.raises(ConfigError, match="cpu_fp8_gemm"):
        parse_config(small_config("x", engine={"backend": "realquant", "options": {"cpu_fp8_gemm": "fast"}}))


def test_every_in_process_backend_takes_the_runtime_and_defaults_to_qvals():
    """engine.options.runtime: "qval" (the default) or "transformers" (transformers' and ModelOpt's code
    only); a backend that does not run the model in this process (tensorrt_llm) refuses it."""
    from qval.backends import BACKENDS
    from qval.engines.runtime import option

    for backend in ("fakequant", "realquant", "export", "checkpoint"):
        extra = {"path": "some/folder"} if backend == "checkpoint" else {}
        cfg = parse_config(small_config("x", engine={"backend": backend, **extra}))
        assert option(cfg.engine) == "qval"
        cfg = parse_config(small_config("x", engine={"backend": backend, "options": {"runtime": "transformers"}, **extra}))
        assert option(cfg.engine) == "transformers"
        assert BACKENDS.get(backend).options_model.model_fields["runtime"].default == "qval"
    with pytest.raises(ConfigError, match=r"options.runtime: Input should be 'qval' or 'transformers'"):
        parse_config(small_config("x", engine={"backend": "fakequant", "options": {"runtime": "vllm"}}))
    with pytest.raises(ConfigError, match="options.runtime: Extra inputs"):
        parse_config(small_config("x", engine={"backend": "tensorrt_llm", "options": {"runtime": "qval"}}))


def test_checkpoint_needs_a_path_and_skips_calibration():
    from qval.engines import needs_calibration

    with pytest.raises(ConfigError, match="needs engine.path"):
        parse_config(small_config("x", engine={"backend": "checkpoint"}))
    assert not needs_calibration("checkpoint") and needs_calibration("export") and needs_calibration("realquant")


def test_api_servers_start_vllm_serve_with_that_many_front_ends(tmp_path):
    from qval.backends import LaunchOptions
    from qval.engines.server import VLLM_MODULE, vllm_command

    one = vllm_command(LaunchOptions(), "/venv/bin/python", tmp_path, "cand", 8000, 128)
    assert one[:3] == ["/venv/bin/python", "-m", VLLM_MODULE] and "--api-server-count" not in one
    many = vllm_command(LaunchOptions(api_servers=8, args=["--enforce-eager"]), "/venv/bin/python", tmp_path, "cand", 8000, 128)
    assert many[:4] == ["/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert many[many.index("--api-server-count") + 1] == "8" and many[-1] == "--enforce-eager"
    own = vllm_command(LaunchOptions(command=["vllm", "serve"], api_servers=2), None, tmp_path, "cand", 8000, 128)
    assert own[:2] == ["vllm", "serve"] and own[own.index("--api-server-count") + 1] == "2"


@pytest.mark.parametrize("launch, message", [
    ({"args": ["--api-server-count", "4"]}, "set launch.api_servers instead"),
    ({"args": ["--api-server-count=4"]}, "set launch.api_servers instead"),
    ({"api_servers": 0}, "api_servers"),
])
def test_api_servers_is_set_once_and_counted(launch, message):
    from qval.backends import LaunchOptions

    with pytest.raises(ValueError, match=message):
        LaunchOptions(**launch)

"""Config errors are caught when the YAML loads, before any model: each names the file, the
key, the bad value and what is allowed, and the CLI exits 2 without a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qval.cli import app
from qval.config import QuantFormat, load_config, parse_config
from qval.errors import ConfigError

from .conftest import ROOT, small_config, write_config

runner = CliRunner()


def cli_validate(path) -> tuple[int, str]:
    result = runner.invoke(app, ["validate", "--config", str(path)])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def test_every_shipped_check_validates():
    """Every shipped check is valid here, except a GPU-only format on a machine without CUDA:
    that is exit 2 before any model loads, saying so."""
    import torch

    import os

    for path in sorted((ROOT / "checks").glob("*.yaml")):
        code, out = cli_validate(path)
        cfg = load_config(path)
        if cfg.quant.format is QuantFormat.nvfp4 and not torch.cuda.is_available():
            assert code == 2 and "needs a CUDA GPU" in out and "Traceback" not in out, out
        elif cfg.engine.backend == "served" and not os.environ.get("QVAL_VLLM_PYTHON"):  # vLLM's Python: .ci/run sets it
            assert code == 2 and "QVAL_VLLM_PYTHON" in out and "Traceback" not in out, out
        else:
            assert code == 0, out


def test_every_shipped_check_runs_all_three_gates_with_thresholds():
    for path in sorted((ROOT / "checks").glob("**/*.yaml")):
        g = load_config(path).gates
        assert g.agreement.enabled and g.quality.enabled and g.longgen.enabled, path
        # the shipped default, not a shortened run — except the two FP8 CPU checks of the README's
        # main command, sized to its 15-minute CPU budget, whose GPU presets run the default, and the
        # served CPU checks that CI gates against a real vLLM server on two cores
        sized = {"fp8_kvfp16": 1024, "fp8_kvfp8": 1024, "served_vllm_cpu": 512, "served_vllm_cpu_kvfp8": 768}
        cpu_sized = path.parent.name == "checks" and path.stem in sized
        assert g.longgen.new_tokens == (sized[path.stem] if cpu_sized else 2048), path
    assert (ROOT / "checks/gpu/fp8_kvfp16.yaml").is_file() and (ROOT / "checks/gpu/fp8_kvfp8_long.yaml").is_file()


def test_every_shipped_check_gates_answers_with_the_three_built_in_suites():
    """Gate 4 is off in the schema and on in every shipped check; the identity check allows no flip
    (at 40 items one flip's exact upper bound, 0.132, is above its limit; none, 0.088, is below)."""
    from qval.metrics.paired import clopper_pearson

    for path in sorted((ROOT / "checks").glob("**/*.yaml")):
        t = load_config(path).gates.tasks
        assert t.enabled and sorted(s.builtin for s in t.suites) == ["choice", "cloze", "recall"], path
        assert all(s.size >= 40 and 0 < s.margin <= 0.2 for s in t.suites), path
        text = path.read_text(encoding="utf-8")
        assert "Gate 4" in text and "measured" in text.split("Gate 4", 1)[1].lower(), f"{path}: gate 4's figures in its comments"
    ident = load_config(ROOT / "checks/none_identity.yaml").gates.tasks.suites
    for s in ident:
        assert clopper_pearson(0, s.size)[1] <= s.max_flip_rate < clopper_pearson(1, s.size)[1]


def test_config_reference_example_is_a_valid_config():
    import yaml

    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = parse_config(yaml.safe_load(example), str(ROOT / "docs" / "config-example.yaml"))
    assert cfg.gates.quality.enabled and cfg.gates.longgen.enabled and cfg.gates.depth.enabled and cfg.gates.retrieval.enabled


def test_unknown_key_names_file_key_and_allowed(tmp_path):
    data = small_config("typo")
    data["quant"]["kv_cahce"] = "fp8"
    path = write_config(tmp_path, data)
    code, out = cli_validate(path)
    assert code == 2
    assert str(path) in out and "quant.kv_cahce" in out
    assert "Did you mean 'kv_cache'?" in out and "format" in out  # the allowed keys are listed
    assert "Traceback" not in out


def test_unknown_format_lists_the_formats(tmp_path):
    data = small_config("badfmt", fmt="fp6")
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 2
    assert "quant.format = 'fp6'" in out
    for f in QuantFormat:
        assert f"'{f.value}'" in out


def test_an_fp8_kv_cache_without_a_weight_format_is_a_kv_only_candidate(tmp_path):
    """Seen: format none + kv_cache fp8 on fakequant built the reference itself (gate 1 KLD exactly 0) and
    approved it as an FP8 KV cache. Now it is a KV-cache-only candidate (tests/quantize/test_kv_only.py) on the
    backends that build one, and refused on a backend that builds its candidate from quantized weights."""
    data = small_config("kvonly", fmt="none")
    data["quant"]["kv_cache"] = "fp8"
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 0 and "none weights, KV cache fp8, engine fakequant" in out
    data["engine"] = {"backend": "realquant"}
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 2 and "KV-cache-only candidate" in out and "Traceback" not in out
    assert load_config(str(ROOT / "checks/served_vllm_cpu_kvfp8.yaml")).quant.kv_only  # served: the server's FP8 KV cache


def test_bad_threshold_type(tmp_path):
    data = small_config("badthr")
    data["gates"]["agreement"]["max_mean_kld"] = "small"
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 2
    assert "gates.agreement.max_mean_kld = 'small'" in out and "valid number" in out


def test_every_problem_reported_at_once(tmp_path):
    data = small_config("many")
    data["seed"] = "zero"
    data["calibration"]["samples"] = -3
    with pytest.raises(ConfigError) as e:
        load_config(write_config(tmp_path, data))
    msg = str(e.value)
    assert "seed = 'zero'" in msg and "calibration.samples = -3" in msg


def test_gate_without_threshold_is_an_error():
    data = small_config("nothr")
    data["gates"]["agreement"] = {"tokens": 1024}
    with pytest.raises(ConfigError, match="could never fail"):
        parse_config(data)


def test_alpha_only_for_smoothquant_and_in_range():
    with pytest.raises(ConfigError, match="int8_sq only"):
        parse_config(small_config("a", quant={"smoothquant_alpha": 0.5}))
    with pytest.raises(ConfigError, match="outside"):
        parse_config(small_config("b", fmt="int8_sq", quant={"smoothquant_alpha": [0.5, 1.5]}))


def test_model_source_must_match_its_field():
    with pytest.raises(ConfigError, match="no gguf"):
        parse_config(small_config("m", model={"source": "gguf"}))
    with pytest.raises(ConfigError, match="set source: path"):
        parse_config(small_config("m", model={"path": "/models/x"}))


def test_unknown_engine_backend_suggests(tmp_path):
    code, out = cli_validate(write_config(tmp_path, small_config("e", engine={"backend": "fakequnt"})))
    assert code == 2 and "Did you mean 'fakequant'?" in out


def test_missing_dataset_is_exit_2(tmp_path):
    data = small_config("nodata")
    data["gates"]["agreement"]["dataset"] = str(tmp_path / "missing.jsonl")
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 2 and "missing.jsonl" in out and "no such file" in out


def test_not_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    code, out = cli_validate(bad)
    assert code == 2 and "not valid YAML" in out
    code, out = cli_validate(tmp_path / "nope.yaml")
    assert code == 2 and "no such config file" in out


def test_nvfp4_on_cpu_is_a_clear_error_not_a_crash(tmp_path):
    path = write_config(tmp_path, small_config("nv", fmt="nvfp4"))
    result = runner.invoke(app, ["calibrate", "--config", str(path), "--out", str(tmp_path / "r"), "-q"])
    out = result.output + result.stderr
    assert result.exit_code == 2, out
    assert "needs a CUDA GPU" in out and "Traceback" not in out


def test_an_unknown_backend_is_named_at_its_key_with_the_close_name(tmp_path):
    data = small_config("typo-backend")
    data["engine"] = {"backend": "tensorrt"}
    code, out = cli_validate(write_config(tmp_path, data))
    assert code == 2
    assert ("engine.backend = 'tensorrt': unknown engine backend 'tensorrt'. Did you mean 'tensorrt_llm'? "
            "Available: checkpoint, export, fakequant, realquant, served, tensorrt_llm.") in out and ".." not in out, out


def test_benchmark_checks_are_their_shipped_check_but_for_what_they_say():
    """benchmarks/checks/int8_sq_fallback.yaml measures the error rates of int8_sq's approving configuration
    (RESULTS §12): it must be checks/int8_sq.yaml with only the fallback's choice changed (α 0.8, every
    mlp.down_proj kept high), else a rate measured on it says nothing about the shipped check's limits."""
    from qval.diagnostics.scales import unit_glob

    shipped = load_config(ROOT / "checks/int8_sq.yaml")
    bench = load_config(ROOT / "benchmarks/checks/int8_sq_fallback.yaml")
    assert bench.gates == shipped.gates and bench.calibration == shipped.calibration and bench.model == shipped.model
    assert bench.engine == shipped.engine and bench.seed == shipped.seed
    assert bench.quant.smoothquant_alpha == 0.8 and 0.8 in shipped.quant.smoothquant_alpha
    assert bench.quant.exclude == [*shipped.quant.exclude, unit_glob("mlp.down_proj")]  # the glob the fallback writes
    assert bench.quant.model_copy(update={"smoothquant_alpha": None, "exclude": []}) == \
        shipped.quant.model_copy(update={"smoothquant_alpha": None, "exclude": []})


#: GPU preset -> (the check file whose limits it says it keeps, the gates' limits it sets on purpose otherwise)
PRESETS = {"gpu/fp8_kvfp16": ("fp8_kvfp16", set()),
           "gpu/served_vllm_fp8": ("fp8_kvfp8", set()),
           "gpu/served_vllm_fp8_kvfp16": ("fp8_kvfp16", set()),
           # 8k context: its own depth and retrieval design (20 trials a length), and a late-KLD limit of its own
           "gpu/fp8_kvfp8_long": ("fp8_kvfp8", {"depth", "retrieval", "longgen.max_late_kld"})}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_gpu_preset_keeps_its_parents_limits(preset: str) -> None:
    """The presets say their thresholds are a CPU check file's; a limit re-derived there (issue 29: late top-1, the
    judge-NLL centre, the retrieval margin, fp8_kvfp8's PPL ratio) must move here too — they had stayed behind."""
    parent, own = PRESETS[preset]
    a, b = load_config(ROOT / "checks" / f"{preset}.yaml").gates, load_config(ROOT / "checks" / f"{parent}.yaml").gates
    differ = []
    for gate in ("agreement", "quality", "longgen", "depth", "retrieval", "tasks"):
        if gate in own:
            continue
        da, db = getattr(a, gate).model_dump(), getattr(b, gate).model_dump()
        differ += [f"{gate}.{k}: {da.get(k)} (parent {db.get(k)})" for k in sorted(set(da) | set(db))
                   if (k.startswith(("min_", "max_", "margin")) or k == "suites") and da.get(k) != db.get(k)
                   and f"{gate}.{k}" not in own]
    assert not differ, f"{preset} differs from checks/{parent}.yaml: {differ}"

"""`validate` refuses what `gate` would refuse (issue 28), before any model loads: a config that
enables no gate (gate calibrated for minutes, then exited 1, REJECT, "no gate produced a check"),
a model whose config.json needs its own code when trust_remote_code is off (gate exited 2 only
once the load failed), a model folder that is not there (reported as a config.json without
JSON). With trust_remote_code on, validate still runs none of the model's code: config.json is
read as JSON, and the tokenizer is loaded without remote code."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import write_config

from .helpers import cli, clean_error, word_config
from .test_validate import both_refuse, no_model_load  # noqa: F401  (a fixture)


def custom_model(tmp_path: Path, *, auto_map: bool = True, trust: bool = False) -> tuple[dict, Path]:
    """word_config's model with a model_type transformers does not know; with `auto_map`, its own
    configuration code beside it, which leaves a marker file when it is imported."""
    cfg = word_config(tmp_path)
    folder = Path(cfg["model"]["path"])
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "qvaltoy"
    marker = tmp_path / "custom-code-was-imported"
    if auto_map:
        config["auto_map"] = {"AutoConfig": "configuration_qvaltoy.QvalToyConfig",
                              "AutoModelForCausalLM": "modeling_qvaltoy.QvalToyForCausalLM"}
        (folder / "configuration_qvaltoy.py").write_text(
            "from pathlib import Path\n"
            f"Path({str(marker)!r}).write_text('imported')\n"
            "from transformers import PretrainedConfig\n\n\n"
            "class QvalToyConfig(PretrainedConfig):\n"
            "    model_type = 'qvaltoy'\n", encoding="utf-8")
        (folder / "modeling_qvaltoy.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n",
                                                    encoding="utf-8")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    cfg["model"]["trust_remote_code"] = trust
    return cfg, marker


def test_a_config_that_enables_no_gate(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["gates"]["agreement"]["enabled"] = False
    both_refuse(tmp_path, cfg, "no gate is enabled", "gates.agreement")


def test_a_model_that_needs_its_own_code_without_trust_remote_code(tmp_path, no_model_load):
    cfg, marker = custom_model(tmp_path)
    both_refuse(tmp_path, cfg, "model_type 'qvaltoy'", "auto_map", "configuration_qvaltoy.QvalToyConfig",
                "trust_remote_code: true")
    assert not marker.exists()


def test_a_model_type_transformers_does_not_know_and_no_code_for_it(tmp_path, no_model_load):
    cfg, _ = custom_model(tmp_path, auto_map=False, trust=True)
    both_refuse(tmp_path, cfg, "model_type 'qvaltoy'", "names no code of its own (auto_map)")


def test_validate_runs_none_of_the_models_code_with_trust_remote_code(tmp_path, no_model_load):
    cfg, marker = custom_model(tmp_path, trust=True)
    code, out = cli("validate", "--config", write_config(tmp_path, cfg))
    assert code == 0 and ": valid (words:" in out, out
    assert not marker.exists(), "validate imported the model's own code"
    assert "runs its own code" in out  # said, not hidden: the gate will run it


def test_a_missing_model_folder_says_no_such_folder(tmp_path, no_model_load):
    cfg = word_config(tmp_path)
    cfg["model"]["path"] = str(tmp_path / "not-there")
    out = clean_error("validate", "--config", write_config(tmp_path, cfg))
    assert f"model.path: {tmp_path / 'not-there'}: no such folder" in out, out
    assert "has no config.json" not in out and "not readable JSON" not in out and "Errno" not in out, out

"""Config strictness: a key given twice, a NaN or infinite threshold, a folder where a file belongs.
Each is an exit-2 error before any model loads, naming the file, the key and what to do."""

from __future__ import annotations

import pytest

from qval.config import load_config
from qval.gates.agreement.config import AgreementGate
from qval.gates.longgen.config import LongGenGate
from qval.gates.quality.config import QualityGate
from qval.errors import ConfigError
from tests.conftest import small_config, write_config

from .helpers import clean_error

THRESHOLDS = [(gate, name) for gate, model in (("agreement", AgreementGate), ("quality", QualityGate), ("longgen", LongGenGate))
              for name in model.model_fields if name.startswith(("max_", "min_"))]


def test_every_gate_has_thresholds_to_check():
    assert len(THRESHOLDS) >= 14  # 3 + 3 + 8 today; a new one is covered automatically


def test_duplicate_keys_name_the_key_and_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\n"
                    "quant:\n"
                    "  format: fp8\n"
                    "  kv_cache: fp16\n"
                    "  format: int8_sq\n"
                    "seed: 1\n"
                    "seed: 2\n", encoding="utf-8")
    out = clean_error("validate", "--config", path)
    assert "key 'format' is given twice, on line 3 and line 5" in out
    assert "key 'seed' is given twice, on line 6 and line 7" in out
    assert str(path) in out


def test_duplicate_key_in_a_flow_mapping_names_the_columns(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\nquant: {format: fp8, format: fp8}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"key 'format' is given twice, on line 2 \(columns 9 and 22\)"):
        load_config(path)


def test_a_merge_key_override_is_not_a_duplicate(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("name: m\n"
                    "base: &base {format: fp8, kv_cache: fp16}\n"
                    "quant:\n"
                    "  <<: *base\n"
                    "  kv_cache: fp8\n", encoding="utf-8")
    from qval.config import load_yaml

    assert load_yaml(path)["quant"] == {"format": "fp8", "kv_cache": "fp8"}  # overriding a merged key is allowed


def _with_threshold(tmp_path, gate: str, key: str, value: str):
    """A valid small config with one threshold set to a YAML literal (.inf, -.inf, .nan)."""
    data = small_config("t")
    data["gates"].setdefault(gate, {})[key] = "VALUE_UNDER_TEST"
    path = write_config(tmp_path, data)
    text = path.read_text(encoding="utf-8").replace("'VALUE_UNDER_TEST'", value).replace("VALUE_UNDER_TEST", value)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("gate", "key"), THRESHOLDS)
@pytest.mark.parametrize(("value", "reason"), [
    (".nan", "NaN is not a limit"),
    (".inf", None),
    ("-.inf", None),
])
def test_nan_and_inf_rejected_in_every_threshold(tmp_path, gate, key, value, reason):
    path = _with_threshold(tmp_path, gate, key, value)
    if reason is None:  # +inf on a max_ and -inf on a min_ can never fail; the other way round nothing passes
        can_never_fail = (value == ".inf") == key.startswith("max_")
        reason = "a limit that can never fail" if can_never_fail else "a limit that no candidate can ever pass"
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"gates.{gate}.{key} = " in str(err.value) and reason in str(err.value)


def test_inf_threshold_through_the_cli(tmp_path):
    out = clean_error("validate", "--config", _with_threshold(tmp_path, "agreement", "max_mean_kld", ".inf"))
    assert "gates.agreement.max_mean_kld = inf: a limit that can never fail" in out


def test_nan_inside_a_sized_threshold(tmp_path):
    data = small_config("t", gates={"quality": {"max_bleu_drop": {"sized": True, "alpha": 0.01}}})
    path = write_config(tmp_path, data)
    path.write_text(path.read_text(encoding="utf-8").replace("alpha: 0.01", "alpha: .nan"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"gates\.quality\.max_bleu_drop\.alpha = nan"):
        load_config(path)


def test_folder_given_as_the_config(tmp_path):
    assert "is a folder, not a config file" in clean_error("validate", "--config", tmp_path)


def test_folder_given_as_a_dataset(tmp_path):
    data = small_config("d")
    (tmp_path / "heldout").mkdir()
    data["gates"]["agreement"]["dataset"] = str(tmp_path / "heldout")
    out = clean_error("validate", "--config", write_config(tmp_path, data))
    assert f"{tmp_path / 'heldout'}: is a folder, not a file" in out


def test_folder_given_as_a_gguf_and_file_as_a_model_folder(tmp_path):
    out = clean_error("validate", "--config", write_config(tmp_path, small_config("g", model={"source": "gguf", "gguf": str(tmp_path)})))
    assert "model.gguf" in out and "is a folder, not a file" in out
    (tmp_path / "weights.bin").write_bytes(b"x")
    out = clean_error("validate", "--config", write_config(tmp_path, small_config("p", model={"source": "path", "path": str(tmp_path / "weights.bin")})))
    assert "model.path" in out and "is a file, not a folder" in out

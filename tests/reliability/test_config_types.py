"""Config values whose type would change their meaning (issue 28): a boolean is not a number
(`max_mean_kld: true` was read as 1.0, `seed: true` as 1), and a string or a number is not a
boolean (`trust_remote_code: 'yes'` was read as true). Every numeric and every boolean setting of
every section, engine options included, is found by walking the schema, so a new field is covered
without a new test. A number stays a number: 0.5 and 1 are both valid limits."""

from __future__ import annotations

import copy
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from qval.config import GateConfig, parse_config
from qval.backends import BACKENDS
from qval.errors import ConfigError
from tests.conftest import small_config, write_config

from .helpers import clean_error


def _kinds(ann: Any) -> set[str]:
    """What a field's annotation takes: "bool", "number", "model", "list:<kind>" or "other"."""
    origin = get_origin(ann)
    if ann is bool:
        return {"bool"}
    if ann in (int, float):
        return {"number"}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return {"model"}
    if origin is Annotated:
        return _kinds(get_args(ann)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a) for a in get_args(ann)))
    if origin is list:
        return {f"list:{k}" for k in _kinds(get_args(ann)[0])}
    if origin is Literal:
        return {"bool" if isinstance(a, bool) else "other" for a in get_args(ann)}
    return {"other"}


def _model_of(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    return next((m for a in get_args(ann) if (m := _model_of(a)) is not None), None)


def leaves(model: type[BaseModel], path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], set[str]]]:
    """(path, kinds) of every setting under `model`; a list of sections is entered at index 0."""
    out = []
    for name, f in model.model_fields.items():
        if name == "source_file":
            continue
        kinds = _kinds(f.annotation)
        sub = _model_of(f.annotation)
        if sub is not None and "model" in kinds:  # a section, or a limit that is a number or {sized: true, ...}
            out += leaves(sub, (*path, name)) + ([((*path, name), kinds - {"model"})] if "number" in kinds else [])
        elif sub is not None and "list:model" in kinds:
            out += leaves(sub, (*path, name, 0))
        else:
            out.append(((*path, name), kinds))
    return out


OPTIONS = {name: b.options_model for name in BACKENDS.names() if (b := BACKENDS.get(name)).options_model is not None}
#: engine.options settings: (engine, options, <backend>, key, ...)
SETTINGS = leaves(GateConfig) + [(("engine", "options", backend, *sub), kinds) for backend, m in OPTIONS.items()
                                 for sub, kinds in leaves(m)]
NUMBERS = [p for p, kinds in SETTINGS if "bool" not in kinds and ("number" in kinds or "list:number" in kinds)]
BOOLEANS = [p for p, kinds in SETTINGS if kinds <= {"bool", "other"} and "bool" in kinds and p[-1] != "sized"]


def test_the_walk_finds_the_settings():
    keys = {key_of(p) for p in NUMBERS}
    assert {"gates.agreement.max_mean_kld", "seed", "max_shortfall", "calibration.samples", "gates.retrieval.depths",
            "gates.tasks.suites[0].margin", "quant.smoothquant_alpha", "engine.options.tp_size"} <= keys
    assert {"model.trust_remote_code", "gates.agreement.enabled", "snapshot.audit",
            "engine.options.trtllm_checkpoint"} <= {key_of(p) for p in BOOLEANS}
    assert len(NUMBERS) > 60 and len(BOOLEANS) > 10


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """small_config with the setting at `path` set to `value` (and what it needs to be reachable)."""
    data = small_config("types")
    if path[:2] == ("engine", "options"):  # (engine, options, backend, key, ...)
        data["engine"] = {"backend": path[2], "options": {}}
        node = data["engine"]
        path = ("options", *path[3:])
    else:
        node = data
    for i, key in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(nxt, int):
            node = node.setdefault(key, [{"builtin": "choice", "margin": 0.1}])
        elif isinstance(key, int):
            node = node[key]
        else:
            node = node.setdefault(key, {})
    last = path[-1]
    node[last] = [value] if last in ("depths", "lengths", "buckets", "exclude", "smoothquant_alpha") else value
    return data


def key_of(path: tuple[Any, ...]) -> str:
    """The key as the message names it: gates.tasks.suites[0].margin, engine.options.tp_size."""
    if path[:2] == ("engine", "options"):
        path = ("engine", "options", *path[3:])
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def ids(path: tuple[Any, ...]) -> str:
    return key_of(path) + (f"-{path[2]}" if path[:2] == ("engine", "options") else "")


@pytest.mark.parametrize("path", NUMBERS, ids=ids)
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_number(path, value):
    with pytest.raises(ConfigError) as err:
        parse_config(with_value(path, value), "types.yaml")
    msg = str(err.value)
    line = next((x for x in msg.splitlines() if key_of(path) in x), msg)
    assert line.startswith("types.yaml: ") and f"{value}" in line and "a boolean" in line and "give a number" in line, msg


@pytest.mark.parametrize("path", BOOLEANS, ids=ids)
@pytest.mark.parametrize("value", ["yes", "false", 1, 0])
def test_a_string_or_a_number_is_not_a_boolean(path, value):
    with pytest.raises(ConfigError) as err:
        parse_config(with_value(path, value), "types.yaml")
    msg = str(err.value)
    line = next((x for x in msg.splitlines() if key_of(path) in x), msg)
    assert line.startswith("types.yaml: ") and repr(value) in line and "give true or false" in line, msg


def test_whole_and_fractional_limits_are_both_numbers():
    for limits in ({"min_top1": 1, "max_mean_kld": 0.5}, {"min_top1": 0.5, "max_mean_kld": 1}):
        cfg = parse_config(small_config("t", gates={"agreement": limits}))
        assert cfg.gates.agreement.min_top1 == limits["min_top1"] and isinstance(cfg.gates.agreement.max_mean_kld, float)
    cfg = parse_config(small_config("t", gates={"quality": {"max_ppl_ratio": 2, "max_bleu_drop": 1.5}}))
    assert cfg.gates.quality.max_ppl_ratio == 2.0
    cfg = parse_config({**small_config("t"), "model": {"trust_remote_code": True}, "seed": 3})
    assert cfg.model.trust_remote_code is True and cfg.seed == 3


def test_through_the_cli_the_message_says_what_to_give(tmp_path):
    data = copy.deepcopy(small_config("t"))
    data["gates"]["agreement"]["max_mean_kld"] = True
    data["model"] = {"trust_remote_code": "yes"}
    out = clean_error("validate", "--config", write_config(tmp_path, data))
    assert "gates.agreement.max_mean_kld = True: a boolean (true/false) is not a number here; give a number" in out
    assert "model.trust_remote_code = 'yes': not a boolean; give true or false" in out

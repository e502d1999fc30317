"""Config values that would change their meaning, found in the raw config before pydantic reads it.

`non_finite`: NaN or ±inf anywhere (no setting takes one, and a threshold that is one cannot decide
or cannot fail).

pydantic's lax mode reads `max_mean_kld: true` as 1.0, `seed: true` as 1 and
`trust_remote_code: 'yes'` (or 1) as true: each a config that validates and means something else
than it says. `mistyped` walks the raw config beside the schema and names every boolean given
where a number belongs and every non-boolean given where only a boolean does. Numbers stay
numbers (an int for a float limit is fine, and a numeric string such as PyYAML's `1e-3` is left to
pydantic). The schema is read, not restated: every section, list of sections, `{sized: true}`
threshold and the backend's `engine.options` model is walked, so a new field is covered as it is
declared. `format_errors` turns pydantic's errors into one line each (file, key, bad value, what is
allowed, the nearest allowed key). Torch-free, like the rest of config validation.
"""

from __future__ import annotations

import difflib
import math
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from .backends import BACKENDS


def _kinds(ann: Any) -> set[str]:
    """What an annotation takes, as scalars: "bool", "number", "none", "other"; "model" and "list" for the rest."""
    origin = get_origin(ann)
    if ann is bool:
        return {"bool"}
    if ann in (int, float):
        return {"number"}
    if ann is type(None):
        return {"none"}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return {"model"}
    if origin is Annotated:
        return _kinds(get_args(ann)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a) for a in get_args(ann)))
    if origin is list:
        return {"list"}
    if origin is Literal:
        return {"bool" if isinstance(a, bool) else "other" for a in get_args(ann)}
    return {"other"}


def _members(ann: Any) -> list[Any]:
    """The alternatives of a union (through Annotated), or the annotation alone."""
    if get_origin(ann) is Annotated:
        return _members(get_args(ann)[0])
    if get_origin(ann) in (Union, types.UnionType):
        return [m for a in get_args(ann) for m in _members(a)]
    return [ann]


def _value(value: Any, ann: Any, where: str) -> list[str]:
    kinds = _kinds(ann)
    if isinstance(value, bool):
        if "bool" in kinds or "number" not in kinds:
            return []  # a boolean is welcome, or pydantic refuses it itself
        return [f"{where} = {value!r}: a boolean (true/false) is not a number here; give a number"]
    if value is not None and kinds - {"none"} == {"bool"}:
        return [f"{where} = {value!r}: not a boolean; give true or false (unquoted)"]
    members = _members(ann)
    if isinstance(value, dict):
        model = next((m for m in members if isinstance(m, type) and issubclass(m, BaseModel)), None)
        return mistyped(value, model, where) if model is not None else []
    if isinstance(value, list):
        item = next((get_args(m)[0] for m in members if get_origin(m) is list and get_args(m)), None)
        return [line for i, v in enumerate(value) for line in _value(v, item, f"{where}[{i}]")] if item is not None else []
    return []


def mistyped(data: Any, model: type[BaseModel], where: str = "") -> list[str]:
    """One line per value of `data` (a raw config section) whose type would change its meaning
    under `model`, as "key = value: what is wrong; what to give". Keys the model does not have are
    left to pydantic (it names them with the keys allowed). `engine.options` is checked against
    the options model its backend declares.

    >>> from qval.config import GateConfig
    >>> for line in mistyped({"seed": True, "model": {"trust_remote_code": "yes"}, "gates": {"agreement": {"min_top1": 1}}},
    ...                      GateConfig):
    ...     print(line)
    seed = True: a boolean (true/false) is not a number here; give a number
    model.trust_remote_code = 'yes': not a boolean; give true or false (unquoted)
    """
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            continue
        ann = field.annotation
        if key == "options" and "backend" in model.model_fields:  # engine.options: its backend's options model
            backend = data.get("backend", model.model_fields["backend"].default)
            ann = BACKENDS.get(backend).options_model if isinstance(backend, str) and backend in BACKENDS else None
            if ann is None:
                continue  # an unknown backend, or one without options: pydantic says so
        out += _value(value, ann, f"{where}.{key}" if where else key)
    return out


def non_finite(data: Any, where: str = "") -> list[str]:
    """One line per NaN or ±inf anywhere in the config: no setting takes one, and a threshold
    that is one cannot decide (NaN compares false with everything) or cannot fail (+inf on a
    max_, −inf on a min_).

    >>> non_finite({"gates": {"agreement": {"max_mean_kld": float("inf"), "min_top1": 0.9}}})
    ['gates.agreement.max_mean_kld = inf: a limit that can never fail; give a finite number']
    """
    if isinstance(data, dict):
        return [line for k, v in data.items() for line in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, list):
        return [line for i, v in enumerate(data) for line in non_finite(v, f"{where}[{i}]")]
    if not isinstance(data, float) or math.isfinite(data):
        return []
    leaf = where.rsplit(".", 1)[-1]
    if math.isnan(data):
        why = "NaN is not a limit: every comparison with it is false, so the check could never decide"
    elif leaf.startswith(("max_", "min_")):
        never_fails = (data > 0) == leaf.startswith("max_")
        why = "a limit that can never fail" if never_fails else "a limit that no candidate can ever pass"
    else:
        why = "must be a finite number"
    return [f"{where} = {data}: {why}; give a finite number"]


# --- pydantic's errors as one line each: file, key, bad value, what is allowed ------------------------------


def _loc_to_key(loc: tuple[Any, ...]) -> str:
    # pydantic puts the union member's type name in loc ("float", "Sized"); drop those
    parts = [str(x) for x in loc if not (isinstance(x, str) and x[:1].isupper()) and x not in ("float", "int")]
    return ".".join(parts) or "(top level)"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at the parent of `loc`, walking the nested models."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list of models (gates.tasks.suites.0)
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        if not isinstance(ann, type):  # list[Model]: the keys of its items
            ann = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if current is None:
            return []
    return [k for k in current.model_fields if k != "source_file"]


def format_errors(err: ValidationError, file: str, model: type[BaseModel]) -> list[str]:
    """One line per problem of `model`'s validation: file, key, bad value, what is allowed."""
    lines = []
    for e in err.errors():
        key = _loc_to_key(e["loc"])
        bad = e.get("input")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, e["loc"])
            close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            lines.append(f"{file}: unknown key {key!r}.{hint} Allowed here: {', '.join(allowed)}.")
            continue
        if e["type"] == "missing":
            lines.append(f"{file}: {key}: required key is missing.")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "enum":
            msg = f"must be one of {e['ctx']['expected']}"
        shown = repr(bad) if not isinstance(bad, dict) else "{...}"
        lines.append(f"{file}: {key} = {shown}: {msg}.")
    # unions report each branch; keep each distinct line once
    return list(dict.fromkeys(lines))

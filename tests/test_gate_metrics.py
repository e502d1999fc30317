"""The gate metric tables agree with the config sections one-to-one, and the cache key of every
gate leaves out exactly its limits: changing a limit re-decides from the stored result, changing
anything else re-measures."""

from __future__ import annotations

import doctest
import importlib
import re

import pytest

from qval.config import GatesConfig, parse_config
from qval.gates.tasks.config import TaskSuite
from qval.errors import ConfigError
from qval.gate_registry import TABLES
from qval.gate_metrics import GateMetrics, Metric
from qval.gates import GATES
from qval.gates.longgen.metrics import LONGGEN

#: fields named like a limit that are settings of the measurement, not limits
SETTINGS = {"max_prompts", "bleu_max_new_tokens", "max_new_tokens", "max_length"}

#: one measuring setting per gate and a second valid value for it
MEASURING = {"agreement": ("batch_size", 2), "quality": ("bootstrap", 200), "longgen": ("window", 128),
             "depth": ("window", 64), "retrieval": ("trials", 3), "tasks": ("piece", 512)}


def section(t: GateMetrics) -> type:
    return TaskSuite if t.per else GatesConfig.model_fields[t.gate].annotation  # type: ignore[return-value]


def minimal(t: GateMetrics) -> dict:
    """The smallest valid section (or suite) of the gate."""
    return {"builtin": "choice", "margin": 0.1} if t.per else {"enabled": False}


def inside(m: Metric, k: int) -> float:
    """The k-th of a few distinct valid limits of row `m`."""
    if m.integer:
        return m.lo + 1 + k
    return m.lo + (0.2 + 0.1 * k) * ((m.hi - m.lo) if m.hi is not None else 1.0)


@pytest.mark.parametrize("module", ["qval.gate_metrics", *(f"qval.gates.{t.gate}.metrics" for t in TABLES)])
def test_doctests(module):
    assert doctest.testmod(importlib.import_module(module)).failed == 0


def test_one_table_per_gate_section():
    assert [t.gate for t in TABLES] == list(GatesConfig.model_fields)
    assert all(t.gate in GATES for t in TABLES)


@pytest.mark.parametrize("t", TABLES, ids=lambda t: t.gate)
def test_rows_and_fields_agree_one_to_one(t):
    fields = section(t).model_fields
    assert len(set(t.fields)) == len(t.fields), "two rows of one gate name the same field"
    assert not set(t.fields) - set(fields), "a row names a field the section lacks"
    assert not set(t.verdict_only) - set(fields)
    looks_like_a_limit = {f for f, info in fields.items()
                          if f.startswith(("min_", "max_", "margin")) or "Sized" in str(info.annotation)}
    missing = looks_like_a_limit - set(t.fields) - set(t.verdict_only) - SETTINGS
    assert not missing, f"fields without a row in qval/gates/{t.gate}/metrics.py: {sorted(missing)}"
    for m in t.metrics:
        if m.field.startswith(("min_", "max_")):
            assert m.op == m.field[:3], m.field


@pytest.mark.parametrize("t", TABLES, ids=lambda t: t.gate)
def test_each_row_bounds_and_kinds_are_what_the_config_accepts(t):
    cls = section(t)

    def accepts(field: str, value) -> bool:
        try:
            cls.model_validate({**minimal(t), field: value})
        except ValueError:
            return False
        return True

    for m in t.metrics:
        assert accepts(m.field, inside(m, 0)), m.field
        assert not accepts(m.field, m.lo - 0.5), m.field
        assert m.hi is None or not accepts(m.field, m.hi + 0.5), m.field
        assert not m.integer or not accepts(m.field, m.lo + 1.5), m.field
        assert accepts(m.field, {"sized": True}) == ("sized" in m.kinds), m.field
        assert m.sizing is None or "sized" in m.kinds, m.field


def test_longgen_sizes_each_sized_row_by_its_rule():
    assert all((m.sizing is not None) == ("sized" in m.kinds) for m in LONGGEN.metrics)


def test_sets_no_threshold_names_the_table_fields():
    for t in TABLES:
        if t.gate in ("longgen", "tasks"):  # longgen sizes two limits by default; tasks needs suites
            continue
        with pytest.raises(ValueError, match=f"set {', '.join(t.fields[:-1])} or {t.fields[-1]}, or enabled: false"):
            section(t).model_validate({"enabled": True, **{f: None for f in t.fields}})


def _config(gate: str | None = None, field: str | None = None, value: object = None):
    """Every gate enabled with every limit set, and `field` of `gate` (of its suite, where the
    suite has it) set to `value`."""
    gates = {t.gate: {m.field: inside(m, 0) for m in t.metrics} for t in TABLES}
    gates["tasks"] = {"suites": [{"builtin": "choice", **gates["tasks"]}]}
    gates["agreement"].update(tokens=4096, ctx=512)
    gates["depth"].update(ctx=512, tokens=1024)
    gates["longgen"].update(suppress_eos=False)
    for g in gates.values():
        g["enabled"] = True
    if gate is not None:
        per_suite = gate == "tasks" and field in TaskSuite.model_fields
        (gates[gate]["suites"][0] if per_suite else gates[gate])[field] = value
    return parse_config({"name": "x", "quant": {"format": "fp8"}, "gates": gates})


@pytest.mark.parametrize("t", TABLES, ids=lambda t: t.gate)
def test_the_cache_key_leaves_out_the_limits_and_only_them(t):
    spec = GATES.get(t.gate)
    key = spec.inputs(_config())
    for k, f in enumerate((*t.fields, *t.verdict_only)):
        m = next((m for m in t.metrics if m.field == f), None)
        value = inside(m, 1) if m else 0.3 + 0.1 * k
        assert spec.inputs(_config(t.gate, f, value)) == key, f"changing {f} changed the cache key of {t.gate}"
    assert spec.inputs(_config(t.gate, *MEASURING[t.gate])) != key
    dumped = key["gate"]["suites"][0] if t.per else key["gate"]
    fields = section(t).model_fields
    assert set(dumped) == set(fields) - set(t.fields) - set(t.verdict_only) - {"enabled"}


def test_a_row_allowing_no_sized_limit_says_why():
    with pytest.raises(ConfigError, match=re.escape("gates.longgen.max_late_kld = {...}: cannot be sized")):
        parse_config({"name": "x", "quant": {"format": "fp8"},
                      "gates": {"agreement": {"min_top1": 0.5}, "longgen": {"max_late_kld": {"sized": True}}}})

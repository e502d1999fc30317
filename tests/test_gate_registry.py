"""Every gate is declared once (qval/gate_registry.py): the run order, the sets of gates each layer covers and
the report's titles are derived from it, and each layer's own table of modules must cover exactly the declared
gates (issue 52, "one gate, one place")."""

from __future__ import annotations

import doctest

import pytest

from qval import gate_registry
from qval.config_gates import GatesConfig
from qval.gate_metrics import TABLES
from qval.gate_registry import DECLARED, covered, names


def test_every_list_of_gates_follows_the_declaration():
    from qval.gates import GATES
    from qval.judges import JUDGES
    from qval.report import formatting, html, sections
    from qval.results import TYPES

    order = names()
    assert order[0] == "agreement" and order.index("quality") > order.index("agreement")  # quality reads gate 1's positions
    assert [s.name for s in GATES.ordered()] == order
    assert [j.gate for j in JUDGES] == order
    assert list(TYPES) == order and list(sections.MARKDOWN) == order
    assert list(formatting.TITLES) == order and list(html.TITLES) == order


def test_the_declared_tables_are_the_config_sections():
    with_table = {d.name: d.metrics for d in DECLARED.ordered() if d.metrics is not None}
    assert all(t.gate == name for name, t in with_table.items())
    assert set(with_table) == {t.gate for t in TABLES} == set(GatesConfig.model_fields)
    assert {with_table[t.gate] for t in TABLES} == set(TABLES)


def test_a_layer_that_misses_a_gate_or_has_an_undeclared_one_is_refused():
    full = dict.fromkeys(names(), 0)
    assert [n for n, _ in covered("judge", full, "x")] == names()
    with pytest.raises(ValueError, match="x has no judge for the declared gate.s. tasks"):
        covered("judge", {k: v for k, v in full.items() if k != "tasks"}, "x")
    with pytest.raises(ValueError, match="x has a judge for planted, which qval/gate_registry.py does not declare"):
        covered("judge", {**full, "planted": 0}, "x")


def test_the_module_doctest():
    assert doctest.testmod(gate_registry).failed == 0

"""Every gate is one package (`qval/gates/<name>/`), declared once in its `__init__` and registered once
(qval/gate_registry.py): the run order, the config sections and their order, the tables, the sweep's columns,
each layer's list of the gates' parts and the report's titles are all derived from the registry (issue 52, "one
gate, one place")."""

from __future__ import annotations

import doctest
import importlib

import pytest

from qval import gate_decl, gate_registry
from qval.config_gates import GatesConfig
from qval.gate_decl import PARTS, GateDecl
from qval.gate_registry import DECLARED, SWEEP_FIGURES, TABLES, names, sections
from qval.results.base import Details

#: the two orders, as the reports, docs/config.md and sweep.md show them
RUN_ORDER = ["agreement", "depth", "quality", "longgen", "retrieval", "tasks", "export_fidelity"]
SECTION_ORDER = ["agreement", "quality", "longgen", "depth", "retrieval", "tasks"]


def test_the_two_orders():
    assert names() == RUN_ORDER  # quality reads gate 1's positions: it runs after agreement
    assert [d.name for d in sections()] == SECTION_ORDER


def test_every_list_of_gates_follows_the_registry():
    from qval.gates import GATES
    from qval.judges import JUDGES
    from qval.report import formatting, html, sections as report_sections
    from qval.results import TYPES

    assert [s.name for s in GATES.ordered()] == RUN_ORDER
    assert [j.gate for j in JUDGES] == RUN_ORDER
    assert list(TYPES) == RUN_ORDER and list(report_sections.MARKDOWN) == RUN_ORDER
    assert list(formatting.TITLES) == RUN_ORDER and list(html.TITLES) == RUN_ORDER
    assert list(GatesConfig.model_fields) == SECTION_ORDER
    assert [t.gate for t in TABLES] == SECTION_ORDER
    assert [g for g, _, _ in SWEEP_FIGURES] == sorted((g for g, _, _ in SWEEP_FIGURES), key=SECTION_ORDER.index)


def test_a_gate_is_one_package_whose_declaration_names_its_parts():
    for d in DECLARED.ordered():
        package = importlib.import_module(f"qval.gates.{d.name}")
        assert package.GATE is d and d.package == package.__name__
        assert (d.config is None) == (d.section_order is None) == (d.metrics is None), d.name
        if d.metrics is not None:
            assert d.metrics.gate == d.name
            assert GatesConfig.model_fields[d.name].annotation is d.config
            assert d.config.__module__ == f"{d.package}.config" and d.metrics is importlib.import_module(
                f"{d.package}.metrics").__dict__[d.name.upper()]
        assert issubclass(importlib.import_module(d.part("result")).DETAILS, Details)
        judge = importlib.import_module(d.part("judge"))
        assert callable(judge.enabled) and callable(judge.thresholds)
        assert callable(importlib.import_module(d.part("section")).markdown)
        assert importlib.import_module(d.part("run")).SPEC.name == d.name


def test_a_section_left_out_is_on_only_where_its_gate_says_so():
    defaults = GatesConfig.model_validate({"agreement": {"min_top1": 0.5}})
    assert {n: getattr(defaults, n).enabled for n in SECTION_ORDER} == {n: n == "agreement" for n in SECTION_ORDER}
    assert [d.name for d in DECLARED.ordered() if d.enabled_by_default] == ["agreement"]


def test_a_part_the_gate_lacks_is_named():
    d = GateDecl("planted", "Planted", "qval.gates.planted")
    with pytest.raises(ValueError, match="a gate has no part 'report'; its parts are result, judge, section, run"):
        d.part("report")
    with pytest.raises(ModuleNotFoundError, match="qval.gates.planted"):
        importlib.import_module(d.part("judge"))
    assert PARTS == ("result", "judge", "section", "run")


@pytest.mark.parametrize("module", [gate_registry, gate_decl], ids=lambda m: m.__name__)
def test_the_module_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_a_package_that_declares_another_gate_s_name_is_refused(monkeypatch):
    """Registering is the package's name in `PACKAGES`: the name is the package's, and a declaration under another
    name (a copied package whose `GATE` was not renamed) would register the first gate twice."""
    copied = type("Module", (), {"GATE": DECLARED.get("depth")})
    monkeypatch.setattr(gate_registry, "import_module", lambda name: copied)
    with pytest.raises(TypeError, match=r"qval/gates/x/__init__.py declares the gate 'depth'"):
        gate_registry._declaration("x")

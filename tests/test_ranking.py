"""One ranking rule with named policies (issue 13 part 3): the sweep, the CLI's alpha sweep and the
fallback all pick their winner with qval.ranking."""

from __future__ import annotations

import doctest
import inspect
import math
from types import SimpleNamespace

import pytest

from qval import ranking
from qval.ranking import Standing, best, rank_key, standing

from .conftest import gate4_result


def _run(approved, failures=0, kld=None, drops=()):
    gates = {}
    if kld is not None:
        gates["agreement"] = {"measurements": {"mean_kld": {"value": kld}}}
    if drops:
        gates["tasks"] = gate4_result(drops)
    return SimpleNamespace(verdict=SimpleNamespace(approved=approved, failures=[object()] * failures), report={"gates": gates})


def test_doctests():
    assert doctest.testmod(ranking).failed == 0


def test_policies_order_by_their_figures_and_missing_figures_rank_last():
    a = _run(True, kld=0.04, drops=(0.1, -0.05))
    b = _run(True, kld=0.02, drops=(0.2,))
    c = _run(False, failures=1, kld=0.001)
    d = _run(False, failures=3, kld=0.0005)
    e = _run(True)  # no gate 1, no gate 4
    assert standing(a, 100) == Standing("APPROVE", 0, 100, 0.1, 0.04)
    assert standing(None, 7) == Standing("ERROR", size=7)
    runs = [c, d, e, a, b]
    assert runs[best(runs, "closest")] is b  # approved, lowest KLD
    assert runs[best(runs, "smallest", [10, 10, 10, 10, 50])] is a  # b is bigger
    assert runs[best(runs, "smallest", [10, 10, 5, 10, 10])] is e  # the smallest approved, figures or not
    assert runs[best([c, d], "closest")] is c  # fewer failed checks first, whatever their KLD
    assert rank_key(standing(e), "closest")[2] == math.inf
    with pytest.raises(ValueError, match="unknown ranking policy 'cheapest'"):
        rank_key(standing(a), "cheapest")


def test_sweep_cli_and_fallback_ask_the_ranking_module():
    from qval import cli, sweep
    from qval.diagnostics import fallback

    assert "rank_key(standing(" in inspect.getsource(sweep.SweepResult.ranked)
    assert 'best(runs, "closest")' in inspect.getsource(cli)
    src = inspect.getsource(fallback.search)
    assert src.count('"closest")]') == 2 and "min(" not in src

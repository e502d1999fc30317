"""A gate's memory sampler (qval/memory.PhaseMemory: a thread that samples the process's memory while
the gate runs) stops on every exit path: also when the gate fails before its own code runs, because
the candidate cannot be built or the reference engine cannot be had."""

from __future__ import annotations

import threading

import pytest

from qval import pipeline, preflight
from qval.errors import DataError
from tests.conftest import write_config

from .helpers import ByteTokenizer, clean_error, toy_reference
from .test_shortfall import toy_config


def samplers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "qval-memory" and t.is_alive()]


@pytest.mark.parametrize("where", ["build", "gate_reference"])
def test_a_gate_that_fails_before_it_runs_leaves_no_sampler(tmp_path, monkeypatch, where):
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: toy_reference())
    monkeypatch.setattr(preflight, "reference_tokenizer", lambda cfg: ByteTokenizer())

    def fails(*args, **kwargs):
        raise DataError(f"{where} failed (a test)")

    if where == "build":
        monkeypatch.setattr(pipeline, "build", fails)
    else:
        monkeypatch.setattr("qval.run_reference.RunReference.for_gates", fails)
    before = samplers()
    out = clean_error("gate", "--config", write_config(tmp_path, toy_config(tmp_path, 2000)), "--out", tmp_path / "r", "-q")
    assert f"{where} failed (a test)" in out
    assert samplers() == before == []

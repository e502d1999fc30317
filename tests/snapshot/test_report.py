"""The report names the snapshot its gates read and what reading it found (issue 28): entries
verified, recomputed and why, with a note naming each recomputed entry (report.json's
`model.snapshot` and `model.notes`, report.md's notes), through `qval gate` on the toy reference;
and a rerun that recalibrates and reuses every gate still names the snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qval import pipeline, preflight
from tests.conftest import write_config
from tests.reliability.helpers import ByteTokenizer, cli, tiny_calibration, toy_reference

from .test_integrity import halve_and_move_argmax, rewrite_npz


def toy_gate_config(tmp_path: Path, name: str, fmt: str = "none") -> Path:
    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps({"text": "some held-out text of the toy reference, read as bytes. " * 30}) + "\n",
                    encoding="utf-8")
    cfg = {"name": name, "quant": {"format": fmt}, "diagnostics": {"enabled": False},
           "gates": {"agreement": {"dataset": str(data), "tokens": 1024, "ctx": 128, "min_top1": 0.0, "batch_size": 2}}}
    if fmt != "none":
        cfg["calibration"] = tiny_calibration(tmp_path)
    return write_config(tmp_path, cfg, f"{name}.yaml")


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: toy_reference())
    monkeypatch.setattr(preflight, "reference_tokenizer", lambda cfg: ByteTokenizer())


def gate(tmp_path: Path, name: str, fmt: str = "none") -> dict:
    code, out = cli("gate", "--config", toy_gate_config(tmp_path, name, fmt), "--out", tmp_path / "r", "-q")
    assert code in (0, 1), out
    return json.loads((tmp_path / "r" / name / "report.json").read_text(encoding="utf-8"))


def test_the_report_lists_entries_verified_and_recomputed_and_why(tmp_path, toy):
    first = gate(tmp_path, "cand-a")
    snap_a = first["model"]["snapshot"]
    files = sorted((Path(snap_a["path"]) / "calls").rglob("*.npz"))
    assert snap_a["entries_written"] == len(files) >= 3 and snap_a["entries_verified"] == 0
    rewrite_npz(files[0], halve_and_move_argmax)
    files[1].write_bytes(files[1].read_bytes()[:200])
    second = gate(tmp_path, "cand-b")  # another candidate's run folder: the same snapshot, read back
    snap_b = second["model"]["snapshot"]
    assert snap_b["key"] == snap_a["key"]
    assert snap_b["entries_recomputed"] == 2 and snap_b["entries_verified"] == len(files) - 2
    assert snap_b["recomputed"] == {"edited": 1, "truncated": 1}
    notes = [n for n in second["model"]["notes"] if "snapshot entry" in n]
    assert len(notes) == 2 and files[0].name in notes[0] + notes[1] and files[1].name in notes[0] + notes[1]
    assert snap_b["notes"] == notes
    # the edited entry was not trusted: the candidate's figures are the first run's
    assert second["gates"]["agreement"]["measurements"] == first["gates"]["agreement"]["measurements"]
    md = (tmp_path / "r" / "cand-b" / "report.md").read_text(encoding="utf-8")
    assert files[0].name in md and "edited" in md


def test_a_rerun_after_recalibrating_still_names_the_snapshot(tmp_path, toy, monkeypatch):
    """Issue 28, 4: the calibration state truncated, the rerun recalibrates and reuses the gates
    (their inputs did not change): its report.json named no snapshot (`model.snapshot` null).
    (The toy cannot be built as an fp8 fake-quant model: the candidate is the toy as it is.)"""
    from qval.engines.hf import HFEngine
    from tests.diagnostics.toy import ToyLM

    def build(s, calib):  # noqa: ANN001, ANN202
        if s.candidate.engine is None:
            s.candidate.engine = HFEngine(ToyLM(seed=1).eval(), ByteTokenizer())  # not the reference: a KLD above 0
        return s.candidate.engine

    monkeypatch.setattr(pipeline, "build", build)
    first = gate(tmp_path, "cal", fmt="fp8")
    key = first["model"]["snapshot"]["key"]
    state = tmp_path / "r" / "cal" / "calibrate" / "quant_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    again = gate(tmp_path, "cal", fmt="fp8")
    assert not again["stages"]["calibrate"]["cached"] and again["stages"]["gate_agreement"]["cached"]
    assert again["model"].get("snapshot") is not None, "the report lost the snapshot the gates read"
    assert again["model"]["snapshot"]["key"] == key == again["gates"]["agreement"]["details"]["snapshot"]["key"]
    assert again["model"]["snapshot"]["reference_forward_calls"] == 0

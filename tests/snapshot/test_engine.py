"""qval.snapshot.engine / store: the reference computes each call once; every later candidate reads
it back (no reference forward pass), a changed input is a miss, a damaged entry is recomputed, and
the mirror candidate asks the reference exactly what a real candidate's gate run asks."""

from __future__ import annotations

from pathlib import Path

import torch

from qval.config import parse_config
from qval.engines import concurrent
from qval.gates.base import GateContext
from qval.gates.longgen import run as longgen
from qval.gates.base import candidate_dependent
from qval.logits import Compact
from qval.snapshot.engine import MirrorCandidate, SnapshotReference
from qval.snapshot.store import SnapshotStore

from ..gates.fakes import FakeEngine, FakeTokenizer, collapse_after, walk


class Counting(FakeEngine):
    """The fake reference, counting the forward passes it makes."""

    def __init__(self, rule=walk) -> None:  # noqa: ANN001
        super().__init__(rule)
        self.passes = 0

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.passes += 1
        return super().logits(input_ids)

    def logits_pieces(self, input_ids: torch.Tensor, piece: int):  # noqa: ANN201
        self.passes += 1
        yield from super().logits_pieces(input_ids, piece)


def snap(tmp_path: Path, real: FakeEngine, k: int | None = 8, **identity: str) -> SnapshotReference:
    return SnapshotReference(real, SnapshotStore(tmp_path / ".reference", {"reference": identity or {"fp": "a"}}), k, audit=True)


def test_a_second_candidate_reads_everything_back(tmp_path: Path) -> None:
    real = Counting()
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    first = snap(tmp_path, real)
    a = first.logits(x)
    pieces_a = list(first.logits_pieces(x, 4))
    gen_a = first.generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    assert isinstance(a, Compact) and a.source is not None  # computed here: the audit has the full logits
    assert (real.passes, real.generate_calls, first.forward_calls) == (2, 1, 3)
    second = snap(tmp_path, real)  # another candidate's run, another process: a fresh engine
    b = second.logits(x)
    pieces_b = list(second.logits_pieces(x, 4))
    gen_b = second.generate([[1, 2]], 5, suppress_eos=True, batch_size=1)
    assert (real.passes, real.generate_calls, second.forward_calls, second.reused_calls) == (2, 1, 0, 3)
    assert torch.equal(a.best, b.best) and torch.equal(a.next_logp.nan_to_num(), b.next_logp.nan_to_num()) and b.source is None
    assert [p.shape for p in pieces_a] == [p.shape for p in pieces_b] and gen_a.tokens == gen_b.tokens


def test_any_changed_input_is_a_new_entry(tmp_path: Path) -> None:
    real = Counting()
    s = snap(tmp_path, real)
    s.logits(torch.tensor([[1, 2, 3]]))
    s.logits(torch.tensor([[1, 2, 4]]))
    list(s.logits_pieces(torch.tensor([[1, 2, 3]]), 2))
    list(s.logits_pieces(torch.tensor([[1, 2, 3]]), 3))
    snap(tmp_path, real, fp="b").logits(torch.tensor([[1, 2, 3]]))  # another reference model
    snap(tmp_path, real, k=16).logits(torch.tensor([[1, 2, 3]]))  # another stored form
    assert real.passes == 6


def test_a_damaged_entry_is_recomputed_not_trusted(tmp_path: Path) -> None:
    real = Counting()
    s = snap(tmp_path, real)
    x = torch.tensor([[5, 6, 7, 8]])
    want = s.logits(x)
    for f in s.store.path.rglob("*.npz"):
        f.write_bytes(f.read_bytes()[:50])  # torn
    again = snap(tmp_path, real).logits(x)
    assert real.passes == 2 and torch.equal(want.top_logp, again.top_logp)
    assert snap(tmp_path, real).forward_calls == 0 and snap(tmp_path, real).logits(x) is not None and real.passes == 2


def test_calls_on_the_candidates_output_are_counted_apart(tmp_path: Path) -> None:
    s = snap(tmp_path, Counting())
    cfg = parse_config({"name": "r", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}}}, "r.yaml")
    ctx = GateContext(config=cfg, reference=s, candidate=FakeEngine(walk), tokenizer=FakeTokenizer(), folder=tmp_path)
    with candidate_dependent(ctx):
        s.logits(torch.tensor([[1, 2, 3]]))
    s.logits(torch.tensor([[3, 2, 1]]))
    assert s.usage()["candidate_dependent_calls"] == 1 and s.usage()["reference_forward_calls"] == 1


def test_gate_3_through_the_snapshot_matches_the_full_reference(tmp_path: Path, monkeypatch) -> None:
    """Gate 3 on the fakes (tests/gates/test_longgen.py's closed forms): the same figures with the
    reference in exact mode, then a second candidate reads every reference pass back; the mirror
    run (qval reference) stored exactly what the real run needed."""
    monkeypatch.setattr(concurrent, "can_pair", lambda engines: False)  # the fakes count in this process
    cfg = parse_config({"name": "r", "quant": {"format": "none"}, "gates": {
        "agreement": {"min_top1": 0.5}, "longgen": {"prompts": str(Path(__file__).parent.parent.parent / "calib_data/longgen_prompts.jsonl"),
                                                    "max_prompts": 2, "new_tokens": 64, "window": 16, "edge": 16, "piece": 8}}}, "r.yaml")

    def run(reference, candidate, folder: str):  # noqa: ANN001, ANN202
        ctx = GateContext(config=cfg, reference=reference, candidate=candidate, tokenizer=FakeTokenizer(),
                          folder=tmp_path / folder)
        (tmp_path / folder).mkdir()
        return longgen.run(ctx)

    real = Counting()
    plain = run(real, FakeEngine(collapse_after(40)), "plain")
    mirror_ref = SnapshotReference(real, SnapshotStore(tmp_path / ".reference", {"r": 1}), None, audit=False)
    run(mirror_ref, MirrorCandidate(mirror_ref), "fill")  # qval reference
    filled = real.passes
    s = SnapshotReference(real, SnapshotStore(tmp_path / ".reference", {"r": 1}), None, audit=False)
    viasnap = run(s, FakeEngine(collapse_after(40)), "cand")
    assert viasnap.status == plain.status == "ok"
    for k, e in plain.measurements.items():
        assert viasnap.measurements[k].value == e.value, k
    # every candidate-independent pass came from the snapshot; only the judge of the candidate's text ran
    assert s.usage()["reference_forward_calls"] == 0 and s.usage()["candidate_dependent_calls"] == 2
    assert real.passes == filled + 2


def test_an_entry_of_the_wrong_shape_is_a_miss(tmp_path: Path) -> None:
    """A whole, readable entry whose arrays do not have the call's shapes (tampered, or written by
    another version under the same key) is recomputed, never served."""
    real = Counting()
    x = torch.tensor([[1, 2, 3, 4]])
    s = snap(tmp_path, real)
    good = s.logits(x)
    key = s._key("logits", ids=x.tolist())
    s.store.put_logits(key, [good[:, :2]])  # same key, two positions instead of four
    again = snap(tmp_path, real).logits(x)
    assert real.passes == 2 and tuple(again.shape) == (1, 4, 64)


def test_qval_reference_refuses_a_config_without_a_snapshot(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from qval.cli import app

    from ..conftest import small_config, write_config

    cfg = small_config("nosnap")
    cfg["snapshot"] = {"enabled": False}
    result = CliRunner().invoke(app, ["reference", "--config", str(write_config(tmp_path, cfg)), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "snapshot.enabled is false" in (result.output + (result.stderr or ""))

"""qval.reference: the reference generates once per (model, prompts, settings, versions) and every later
candidate reads the stored tokens from the reference's store (qval/snapshot: the snapshot's, or
`LiveReference`'s where no snapshot is kept) under its one key; a changed input or a damaged entry is a
miss. A sequential run's candidate phase reads what its fill stored, with no reference in memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qval import stages
from qval.config import parse_config
from qval.engines import concurrent
from qval.gates.base import GateContext
from qval.reference import GenerationSettings, paired_generations, render_prompts
from qval.snapshot.engine import LiveReference, MirrorCandidate, SnapshotReference
from qval.snapshot.store import SnapshotStore

from .gates.fakes import FakeEngine, FakeTokenizer, walk

PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


@pytest.fixture(autouse=True)
def in_turn(request, monkeypatch):
    """The fakes count their calls in this process: run the pair in turn (the side-by-side tests
    below lift it; tests/engines/test_concurrent.py tests pairing itself)."""
    if "side_by_side" not in request.node.name:
        monkeypatch.setattr(concurrent, "can_pair", lambda engines: False)


def store(tmp_path: Path, fingerprint: str = "ref-a", versions: dict | None = None) -> SnapshotStore:
    """The store as RunReference.snapshot_inputs keys it: the reference's identity, the versions, the form."""
    return SnapshotStore(tmp_path / ".reference", {"reference": {"fingerprint": fingerprint, "device": "cpu", "dtype": "torch.float32"},
                                                   "versions": versions or stages.versions(), "topk": 8})


def live(tmp_path: Path, engine: FakeEngine, fingerprint: str = "ref-a", versions: dict | None = None) -> LiveReference:
    return LiveReference(engine, store(tmp_path, fingerprint, versions))


def ctx_for(tmp_path: Path, reference, candidate=None) -> GateContext:
    cfg = parse_config({"name": "r", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}}}, "r.yaml")
    return GateContext(config=cfg, reference=reference, candidate=candidate or FakeEngine(walk), tokenizer=FakeTokenizer(),
                       folder=tmp_path / "gate")


def cached_generations(ctx: GateContext, prompts: list[list[int]], settings: GenerationSettings):
    """The reference's half of paired_generations (the candidate's half is what any gate does)."""
    return paired_generations(ctx, prompts, settings, "test")[0]


def test_generates_once_then_reads_the_store(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    settings = GenerationSettings(new_tokens=12, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, settings)
    # another candidate, another process's reference object, the same store
    second = cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, settings)
    assert (first.hit, second.hit, ref.generate_calls) == (False, True, 1)
    assert second.generation.tokens == first.generation.tokens and second.seconds == 0.0
    assert first.path == second.path and first.path.is_file() and (tmp_path / ".reference" / "snapshot") in first.path.parents
    assert json.loads(first.path.read_text())["key"] == first.key == second.key
    assert second.describe()["cached"] is True and second.describe()["path"] == str(first.path)
    # gate 4 and retrieval ask the reference's generate directly: the same entry
    ref_live = live(tmp_path, ref)
    assert ref_live.generate(PROMPTS, 12, suppress_eos=True, batch_size=2).tokens == first.generation.tokens
    assert ref.generate_calls == 1 and ref_live.usage()["reused_calls"] == 1


def test_a_reference_without_a_store_generates_every_time(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=4, suppress_eos=True, batch_size=2)
    a, b = (cached_generations(ctx_for(tmp_path, ref), PROMPTS, s) for _ in range(2))
    assert (a.hit, b.hit, a.path, ref.generate_calls) == (False, False, None, 2) and a.describe()["path"] is None


def test_both_models_generate_side_by_side_then_the_candidate_alone(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=6, suppress_eos=True, batch_size=2)
    ctx = ctx_for(tmp_path, live(tmp_path, ref))
    first, cand, how = paired_generations(ctx, PROMPTS, s, "test")
    # the reference decoded in a forked process (its call count, and its write of the entry, stay there)
    assert not first.hit and how["side_by_side"] == concurrent.can_pair([ctx.reference, ctx.candidate])
    assert ctx.candidate.generate_calls == 1 and first.generation.tokens == ref.generate(PROMPTS, 6, suppress_eos=True, batch_size=2).tokens
    assert cand.tokens == ctx.candidate.generate(PROMPTS, 6, suppress_eos=True, batch_size=2).tokens
    calls = ref.generate_calls
    ctx2 = ctx_for(tmp_path, live(tmp_path, ref))
    second, cand2, how2 = paired_generations(ctx2, PROMPTS, s, "test")
    assert second.hit and not how2["side_by_side"] and cand2.tokens == cand.tokens and ref.generate_calls == calls
    # the thread count the reference decodes with is part of the key: asked with another count, a miss
    share = concurrent.share([ctx2.reference, ctx2.candidate])
    with concurrent._threads(share):
        assert ctx2.reference.stored_generation(PROMPTS, 6, suppress_eos=True, batch_size=2)[2] is not None
    if share is not None and share != torch.get_num_threads():
        assert ctx2.reference.stored_generation(PROMPTS, 6, suppress_eos=True, batch_size=2)[2] is None


def test_any_changed_input_is_a_miss(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=12, suppress_eos=True, batch_size=2)
    base = cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, s)
    variants = [
        cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, GenerationSettings(13, True, 2)),
        cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, GenerationSettings(12, False, 2)),
        cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, GenerationSettings(12, True, 1)),
        cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), [[1, 2, 3], [4, 5, 6, 8]], s),
        cached_generations(ctx_for(tmp_path, live(tmp_path, ref, fingerprint="ref-b")), PROMPTS, s),
    ]
    assert not any(v.hit for v in variants) and ref.generate_calls == 6
    assert len({(v.path, v.key) for v in [base, *variants]}) == 6
    # another gate asking the same call (gate 2 what gate 3 asked) reads the same entry
    assert cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, s).hit


def test_a_damaged_entry_is_regenerated_with_a_note_not_trusted(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=8, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, s)
    first.path.write_text(first.path.read_text()[:40])  # a torn write from an older, non-atomic tool
    reader = live(tmp_path, ref)
    again = cached_generations(ctx_for(tmp_path, reader), PROMPTS, s)
    assert not again.hit and again.generation.tokens == first.generation.tokens and ref.generate_calls == 2
    assert reader.store.integrity()["entries_recomputed"] == 1 and str(first.path) in reader.store.integrity()["notes"][0]
    assert cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, s).hit  # whole again


def test_a_sequential_candidate_phase_reads_what_the_fill_stored_side_by_side(tmp_path: Path) -> None:
    """The fill (the reference against its mirror) stores the generation under the key the candidate phase asks
    for — the same threads — so the candidate phase, with no reference in memory, finds it."""
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=6, suppress_eos=True, batch_size=2)
    snap = SnapshotReference(ref, store(tmp_path), 4, False)
    filled, _, _ = paired_generations(ctx_for(tmp_path, snap, MirrorCandidate(snap)), PROMPTS, s, "fill")
    snap.mirror(False)
    snap.detach()  # the reference leaves memory
    got, cand, _ = paired_generations(ctx_for(tmp_path, snap), PROMPTS, s, "candidate phase")
    assert not filled.hit and got.hit and got.path == filled.path and got.generation.tokens == filled.generation.tokens
    assert ref.generate_calls == 1  # the fill's one generation (the mirror answered from it)


def test_render_prompts_raw_without_a_chat_template() -> None:
    ids, how = render_prompts(FakeTokenizer(), ["ab", "c"])
    assert how == "raw" and ids == [[ord("a") % 60, ord("b") % 60], [ord("c") % 60]]


def test_library_versions_are_read_in_one_place_and_key_the_generations(tmp_path: Path) -> None:
    """The store's folder is keyed by the versions stages.versions reads (the reference's run reads the same
    through the session): another version of one of them is another folder, a miss."""
    import importlib.metadata as md

    assert stages.versions(("torch", "no-such-package-qval")) == {"torch": md.version("torch"), "no-such-package-qval": None}
    ref = FakeEngine(walk)
    settings = GenerationSettings(new_tokens=4, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, live(tmp_path, ref)), PROMPTS, settings)
    manifest = json.loads((first.path.parents[2] / "manifest.json").read_text())
    assert manifest["inputs"]["versions"] == stages.versions() and set(stages.KEY_PACKAGES) <= manifest["inputs"]["versions"].keys()
    other = {**stages.versions(), "transformers": "0.0-other"}
    assert cached_generations(ctx_for(tmp_path, live(tmp_path, ref, versions=other)), PROMPTS, settings).hit is False


def test_a_loaded_reference_names_its_vocabulary_and_eos_as_a_served_one_does() -> None:
    """What a served candidate's build reads from the reference (served_setup.build_served): `vocab` and `eos`,
    the same names on a loaded model (models.LoadedModel) and a served reference (engines/served_reference.py)."""
    from types import SimpleNamespace

    from qval.engines.served_reference import ServedReference
    from qval.models import LoadedModel

    class Tiny(torch.nn.Module):
        def __init__(self, eos) -> None:  # noqa: ANN001
            super().__init__()
            self.head = torch.nn.Linear(4, 37, bias=False)
            self.generation_config = SimpleNamespace(eos_token_id=eos)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    def loaded(eos, tok_eos=5):  # noqa: ANN001, ANN202
        return LoadedModel(Tiny(eos), SimpleNamespace(eos_token_id=tok_eos), "tiny", "fp", "cpu", "float32", "float32")

    assert loaded(2).vocab == 37 and loaded(2).eos == [2]
    assert loaded([2, 7]).eos == [2, 7] and loaded(None).eos == [5] and loaded(None, tok_eos=None).eos == []
    served = ServedReference(SimpleNamespace(vocab=37, eos=[2], device="server"), None, "s", "fp")
    assert (served.vocab, served.eos) == (loaded(2).vocab, loaded(2).eos)

"""qval.reference: the reference generates once per (model, prompts, settings, versions) and
every later candidate reads the stored tokens; a changed input or a damaged file is a miss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qval.config import parse_config
from qval.engines import concurrent
from qval.gates import GateContext
from qval.reference import GenerationSettings, paired_generations, render_prompts

from .gates.fakes import FakeEngine, FakeTokenizer, walk

PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


@pytest.fixture(autouse=True)
def in_turn(request, monkeypatch):
    """The fakes count their calls in this process: run the pair in turn (the side-by-side test
    below lifts it; tests/engines/test_concurrent.py tests pairing itself)."""
    if "side_by_side" not in request.node.name:
        monkeypatch.setattr(concurrent, "can_pair", lambda engines: False)


def cached_generations(ctx: GateContext, kind: str, prompts: list[list[int]], settings: GenerationSettings):
    """The reference's half of paired_generations (the candidate's half is what any gate does)."""
    return paired_generations(ctx, kind, prompts, settings, "test")[0]


def ctx_for(tmp_path: Path, reference: FakeEngine, fingerprint: str = "ref-a") -> GateContext:
    cfg = parse_config({"name": "r", "quant": {"format": "none"}, "gates": {"agreement": {"min_top1": 0.5}}}, "r.yaml")
    return GateContext(config=cfg, reference=reference, candidate=FakeEngine(walk), tokenizer=FakeTokenizer(),
                       folder=tmp_path / "gate", shared_cache=tmp_path / ".reference", reference_fingerprint=fingerprint)


def test_generates_once_then_reads_the_cache(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    settings = GenerationSettings(new_tokens=12, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, settings)
    second = cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, settings)  # another candidate, same reference
    assert (first.hit, second.hit, ref.generate_calls) == (False, True, 1)
    assert second.generation.tokens == first.generation.tokens and second.seconds == 0.0
    assert first.path == second.path and first.path.parent.parent == tmp_path / ".reference"
    stored = json.loads(first.path.read_text())
    assert stored["key"] == first.key and stored["inputs"]["settings"] == {"new_tokens": 12, "suppress_eos": True, "batch_size": 2}
    assert second.describe()["cached"] is True


def test_both_models_generate_side_by_side_then_the_candidate_alone(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=6, suppress_eos=True, batch_size=2)
    ctx = ctx_for(tmp_path, ref)
    first, cand, how = paired_generations(ctx, "longgen", PROMPTS, s, "test")
    # the reference decoded in a forked process (its call count stays there), the candidate here
    assert not first.hit and how["side_by_side"] == concurrent.can_pair([ref, ctx.candidate])
    assert ctx.candidate.generate_calls == 1 and first.generation.tokens == ref.generate(PROMPTS, 6, suppress_eos=True, batch_size=2).tokens
    assert cand.tokens == ctx.candidate.generate(PROMPTS, 6, suppress_eos=True, batch_size=2).tokens
    calls = ref.generate_calls
    second, cand2, how2 = paired_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, s, "test")
    assert second.hit and not how2["side_by_side"] and cand2.tokens == cand.tokens and ref.generate_calls == calls
    # the thread count both compute with is part of the key: numbers depend on it
    stored = json.loads(first.path.read_text())
    assert stored["inputs"]["compute"]["threads"] == max(1, torch.get_num_threads() // 2)


def test_any_changed_input_is_a_miss(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=12, suppress_eos=True, batch_size=2)
    base = cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, s)
    variants = [
        cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, GenerationSettings(13, True, 2)),
        cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, GenerationSettings(12, False, 2)),
        cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, GenerationSettings(12, True, 1)),
        cached_generations(ctx_for(tmp_path, ref), "longgen", [[1, 2, 3], [4, 5, 6, 8]], s),
        cached_generations(ctx_for(tmp_path, ref, fingerprint="ref-b"), "longgen", PROMPTS, s),
        cached_generations(ctx_for(tmp_path, ref), "bleu", PROMPTS, s),
    ]
    assert not any(v.hit for v in variants)
    assert len({base.key, *(v.key for v in variants)}) == 7 and ref.generate_calls == 7


def test_a_damaged_file_is_regenerated_not_trusted(tmp_path: Path) -> None:
    ref = FakeEngine(walk)
    s = GenerationSettings(new_tokens=8, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, s)
    first.path.write_text(first.path.read_text()[:40])  # a torn write from an older, non-atomic tool
    again = cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, s)
    assert not again.hit and again.generation.tokens == first.generation.tokens and ref.generate_calls == 2
    assert cached_generations(ctx_for(tmp_path, ref), "longgen", PROMPTS, s).hit  # whole again


def test_render_prompts_raw_without_a_chat_template() -> None:
    ids, how = render_prompts(FakeTokenizer(), ["ab", "c"])
    assert how == "raw" and ids == [[ord("a") % 60, ord("b") % 60], [ord("c") % 60]]


def test_library_versions_are_read_in_one_place_and_key_the_generations(tmp_path: Path, monkeypatch) -> None:
    """The generation cache, the stage keys and the report read versions through stages.versions: the
    reference's generations are keyed by torch, transformers and qval (not ModelOpt, which it never runs),
    and another version of one of them is a miss."""
    import importlib.metadata as md

    from qval import stages

    assert stages.versions(("torch", "no-such-package-qval")) == {"torch": md.version("torch"), "no-such-package-qval": None}
    ref = FakeEngine(walk)
    settings = GenerationSettings(new_tokens=4, suppress_eos=True, batch_size=2)
    first = cached_generations(ctx_for(tmp_path, ref), "bleu", PROMPTS, settings)
    assert json.loads(first.path.read_text())["inputs"]["versions"] == stages.versions(("torch", "transformers", "qval"))
    real = md.version
    monkeypatch.setattr(md, "version", lambda pkg: "0.0-other" if pkg == "transformers" else real(pkg))
    assert cached_generations(ctx_for(tmp_path, ref), "bleu", PROMPTS, settings).hit is False

"""The reference's greedy generations beside the candidate's (gate 2's BLEU prompts, gate 3's long
generations): the candidate's computed every run, the reference's read from the reference's store.

The reference's generations cost minutes on a CPU and do not depend on the candidate, so the reference
the gates see (qval/snapshot/engine.py: its snapshot, or `LiveReference` where no snapshot is kept) stores
each generation call under `<report dir>/.reference/snapshot/<folder key>/` and every later candidate,
run and sweep process reads it back. The one key is the store's: the folder's (the reference's
fingerprint, dtype, device and CUDA numerics; the library versions that run it) and the call's (prompt
token ids, generation settings and, on a CPU, the intra-op thread count it decodes with). Asked here
with the thread count the reference will decode with (paired on a CPU: engines/concurrent.py), a hit lets
the candidate decode alone; a miss decodes both, side by side where they pair. Entries carry a digest;
a damaged one is a miss, recomputed with a note (snapshot/store.py), never a wrong answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .engines import concurrent  # its functions looked up at call time (tests replace concurrent.can_pair)
from .engines.base import Generation
from .errors import DataError
from .progress import SILENT

if TYPE_CHECKING:
    from .gates.base import GateContext


@dataclass(frozen=True)
class GenerationSettings:
    """How both models decode: greedy, `new_tokens` at most, EOS suppressed or a stop."""

    new_tokens: int
    suppress_eos: bool
    batch_size: int


@dataclass(frozen=True)
class CachedGeneration:
    """The reference's generations and whether they came from its store (`hit`); `key` and `path` name the
    store's entry (None for a reference without a store: a test's bare engine)."""

    generation: Generation
    hit: bool
    key: str | None
    path: Path | None
    seconds: float  # time the reference spent generating; 0.0 on a hit

    def describe(self) -> dict[str, Any]:
        return {"cached": self.hit, "key": self.key, "path": None if self.path is None else str(self.path),
                "seconds": round(self.seconds, 2)}


def render_prompts(tokenizer: Any, prompts: list[str]) -> tuple[list[list[int]], str]:
    """Token ids of each prompt as a user turn of the tokenizer's chat template (with the
    assistant's opening, so the model answers), or the raw text when there is no template.

    Instruct models answer a bare prompt badly (they continue it as if it were their own
    text), so the template decides whether BLEU measures the model or the prompt format.
    Returns the ids and "chat_template" or "raw", which the report states.
    """
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                 for p in prompts]
        how = "chat_template"
    else:
        texts, how = list(prompts), "raw"
    ids = [list(tokenizer(t, add_special_tokens=how == "raw")["input_ids"]) for t in texts]
    for i, row in enumerate(ids):
        if not row:
            raise DataError(f"prompt {i} tokenizes to nothing; remove the empty prompt from the prompt file.")
    return ids, how


def paired_generations(ctx: "GateContext", prompts: list[list[int]], settings: GenerationSettings,
                       label: str) -> tuple[CachedGeneration, "Generation", dict[str, Any]]:
    """The reference's greedy generations for `prompts` (read from its store, or computed now and stored for
    every later candidate) and the candidate's, with the same settings; `label` names the gate in the progress
    lines. When both engines are on the CPU and the reference's must be computed,
    the two decode side by side (engines/concurrent.py), in about the time of one. Returns both, and how they
    ran ({"side_by_side", "candidate_seconds"})."""
    progress = ctx.progress or SILENT
    engines = [ctx.reference, ctx.candidate]
    key: str | None = None
    path: Path | None = None
    stored = None
    if (lookup := getattr(ctx.reference, "stored_generation", None)) is not None:
        # asked with the threads the reference decodes with beside the candidate (its key holds them)
        key, path, stored = concurrent.alone(lambda: lookup(prompts, settings.new_tokens, suppress_eos=settings.suppress_eos,
                                                            batch_size=settings.batch_size), engines)

    def run(engine: Any, advance: Any) -> tuple["Generation", float]:
        t0 = time.perf_counter()
        gen = engine.generate(prompts, settings.new_tokens, suppress_eos=settings.suppress_eos,
                              batch_size=settings.batch_size, progress=advance)
        return gen, time.perf_counter() - t0

    if stored is not None:
        ref = CachedGeneration(stored, hit=True, key=key, path=path, seconds=0.0)
        with progress.task(f"{label}: candidate generates ({len(prompts)} × {settings.new_tokens} tokens)", len(prompts)) as advance:
            cand, cand_s = concurrent.alone(lambda: run(ctx.candidate, advance), engines)
        return ref, cand, {"side_by_side": False, "candidate_seconds": round(cand_s, 2)}
    how = "side by side on the CPU" if concurrent.can_pair(engines) else "one after the other"
    with progress.task(f"{label}: reference and candidate generate, {how} ({len(prompts)} × {settings.new_tokens} tokens)",
                       2 * len(prompts)) as advance:
        # the reference's job may run in a forked process: it reports no progress of its own, and stores its
        # generation there (the store's entry, under the key asked above)
        ((ref_gen, ref_s), (cand, cand_s)), paired = concurrent.side_by_side([lambda: run(ctx.reference, None), lambda: run(ctx.candidate, advance)],
                                                                              engines)
        advance(len(prompts))
    ref = CachedGeneration(ref_gen, hit=False, key=key, path=path, seconds=ref_s)
    return ref, cand, {"side_by_side": paired, "candidate_seconds": round(cand_s, 2)}

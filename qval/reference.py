"""Reference outputs, computed once and shared by every candidate (the design's stage 4).

The reference's greedy generations for gate 2 (BLEU prompts) and gate 3 (2048-token long
generation) cost minutes on a CPU and do not depend on the candidate at all, so they are
stored under `<report dir>/.reference/<key>/<kind>.json` and reused by every candidate, every
later run and every process of a sweep. The key hashes everything the tokens depend on:

- the reference model's fingerprint and the dtype/device it computes in (and, on a CPU, the
  intra-op thread count it decodes with beside the candidate: engines/concurrent.py),
- the prompt token ids themselves (the data, the tokenizer and its chat template in one),
- the generation settings (new tokens, EOS handling, batch size: left padding changes numerics),
- the library versions that run the model (torch, transformers, qval).

Writes are atomic, so two processes that miss at once both generate and the last rename wins
with identical content; a half-written or unreadable file is a miss, never a wrong answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import determinism
from .engines import concurrent  # its functions looked up at call time (tests replace concurrent.can_pair)
from .engines.base import Generation
from .errors import DataError
from .io import atomic_write_json, hash_json
from .progress import SILENT
from .stages import versions

if TYPE_CHECKING:
    from .gates.base import GateContext

CACHE_VERSION = 1


@dataclass(frozen=True)
class GenerationSettings:
    """How both models decode: greedy, `new_tokens` at most, EOS suppressed or a stop."""

    new_tokens: int
    suppress_eos: bool
    batch_size: int


@dataclass(frozen=True)
class CachedGeneration:
    """The reference's generations and whether they came from the cache (`hit`)."""

    generation: Generation
    hit: bool
    key: str
    path: Path
    seconds: float  # time the reference spent generating; 0.0 on a hit

    def describe(self) -> dict[str, Any]:
        return {"cached": self.hit, "key": self.key, "path": str(self.path), "seconds": round(self.seconds, 2)}


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


def generation_inputs(ctx: "GateContext", kind: str, prompts: list[list[int]], settings: GenerationSettings) -> dict[str, Any]:
    """Everything the reference's tokens depend on; its hash is the cache key."""
    engine = ctx.reference.describe()
    # a served reference's device names its URL, whose port a launched server picks anew each run: its identity is
    # the fingerprint's (qval/engines/served_reference.py)
    device = "server" if engine.get("backend") == "served" else engine.get("device")
    compute = {"device": device, "dtype": engine.get("dtype"), "backend": engine.get("backend"),
               # intra-op threads change a CPU product's rounding: the count the pair computes with (concurrent.py)
               "threads": concurrent.share([ctx.reference, ctx.candidate])}
    if (numerics := determinism.key(str(engine.get("device")))) is not None:  # CUDA only: CPU keys are unchanged
        compute["numerics"] = numerics
    return {
        "cache_version": CACHE_VERSION,
        "kind": kind,
        "reference": ctx.reference_fingerprint,
        "compute": compute,
        "prompts": hash_json(prompts),
        "prompt_count": len(prompts),
        "settings": asdict(settings),
        # the reference decodes without ModelOpt: its generations are keyed by the libraries that run it
        "versions": versions(("torch", "transformers", "qval")),
    }


def _read(path: Path, key: str) -> Generation | None:
    """The stored generation when the file is whole and holds this key; else None (a miss)."""
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
        if blob.get("key") != key:
            return None
        return Generation.from_dict(blob["generation"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _lookup(ctx: "GateContext", kind: str, prompts: list[list[int]],
            settings: GenerationSettings) -> tuple[dict[str, Any], str, Path, "Generation | None"]:
    """The cache key's inputs, the key, the file, and the stored generation when it is whole."""
    inputs = generation_inputs(ctx, kind, prompts, settings)
    key = hash_json(inputs)
    path = Path(ctx.shared_cache) / key[:16] / f"{kind}.json"
    stored = _read(path, key) if path.is_file() else None
    return inputs, key, path, stored if stored is not None and len(stored.tokens) == len(prompts) else None


def paired_generations(ctx: "GateContext", kind: str, prompts: list[list[int]], settings: GenerationSettings,
                       label: str) -> tuple[CachedGeneration, "Generation", dict[str, Any]]:
    """The reference's greedy generations for `prompts` (read from the shared cache, or computed
    now and stored for every later candidate) and the candidate's, with the same settings. `kind`
    names the use ("bleu", "longgen") and keeps the files apart. When both engines are on the CPU
    and the reference's must be computed, the two decode side by side (engines/concurrent.py),
    in about the time of one. Returns both, and how they ran ({"side_by_side", "candidate_seconds"})."""
    inputs, key, path, stored = _lookup(ctx, kind, prompts, settings)
    progress = ctx.progress or SILENT

    def run(engine: Any, advance: Any) -> tuple["Generation", float]:
        t0 = time.perf_counter()
        gen = engine.generate(prompts, settings.new_tokens, suppress_eos=settings.suppress_eos,
                              batch_size=settings.batch_size, progress=advance)
        return gen, time.perf_counter() - t0

    engines = [ctx.reference, ctx.candidate]
    if stored is not None:
        ref = CachedGeneration(stored, hit=True, key=key, path=path, seconds=0.0)
        with progress.task(f"{label}: candidate generates ({len(prompts)} × {settings.new_tokens} tokens)", len(prompts)) as advance:
            cand, cand_s = concurrent.alone(lambda: run(ctx.candidate, advance), engines)
        return ref, cand, {"side_by_side": False, "candidate_seconds": round(cand_s, 2)}
    how = "side by side on the CPU" if concurrent.can_pair(engines) else "one after the other"
    with progress.task(f"{label}: reference and candidate generate, {how} ({len(prompts)} × {settings.new_tokens} tokens)",
                       2 * len(prompts)) as advance:
        # the reference's job may run in a forked process: it reports no progress of its own
        ((ref_gen, ref_s), (cand, cand_s)), paired = concurrent.side_by_side([lambda: run(ctx.reference, None), lambda: run(ctx.candidate, advance)],
                                                                              engines)
        advance(len(prompts))
    atomic_write_json(path, {"key": key, "inputs": inputs, "seconds": round(ref_s, 2), "generation": ref_gen.to_dict()})
    ref = CachedGeneration(ref_gen, hit=False, key=key, path=path, seconds=ref_s)
    return ref, cand, {"side_by_side": paired, "candidate_seconds": round(cand_s, 2)}

"""The reference as every gate sees it: an `Engine` that answers from the snapshot.

Each call (chunk logits, logits piece by piece through the KV cache, answer logits, greedy
generations) is keyed by its method and arguments. A stored answer is returned as it is; a
missing one is computed by the real reference engine, compressed (`compact.compress`) and
stored. Logits always come back compact (`Compact`), whether computed now or read back, so a
figure is the same number in the run that filled the snapshot and in every later one; the gates'
metric functions (`metrics.tokens`, the task scorers) take the compact form where they took logits.

`forward_calls` counts the calls that ran the reference model in this process on inputs that do
not depend on the candidate (a second candidate against a full snapshot makes none; the tests
hold it to that); `dependent_calls` those on what the candidate produced (the judge of its
long generations, the reference's own answer text where the two disagree), which no snapshot
can hold in advance: the gates mark them (`candidate_dependent`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import torch

from ..engines.base import Engine, Generation, Logits
from ..io import hash_json
from ..logits import Compact
from ..metrics.compact import TAIL_POINTS, compress
from .store import SnapshotStore


def _ids(x: Any) -> list[Any]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


#: shown where the reference's own answer text was not computed (sequential runs: not in memory)
NOT_IN_MEMORY = "(not computed: the reference was not in memory in this sequential run)"


class ReferenceAbsent(Exception):
    """A call the snapshot does not hold, asked while the reference is not in memory (a sequential
    run's candidate phase): the gate defers it (the judge of the candidate's text) or goes without
    (the reference's answer text on a disagreement)."""


class StoredReference(Engine):
    """The reference as the gates see it, over the reference's store (store.py): its greedy generations are
    stored and read back under one key (`stored_generation`); its logits are the subclass's — the snapshot's
    compact blocks (`SnapshotReference`) or the engine's own (`LiveReference`). `real`: the reference's engine,
    or None while the reference is not in memory (then `description` and `config` stand for it, and a call the
    store lacks raises ReferenceAbsent)."""

    #: its logits are the snapshot's (the gates' details name the snapshot and their use of it)
    keeps_snapshot = False

    def __init__(self, real: Engine | None, store: SnapshotStore, *, description: dict[str, Any] | None = None,
                 config: Any = None) -> None:
        if real is None and description is None:
            raise ValueError("a stored reference without its engine needs the engine's description")
        self.real = real
        self.store = store
        self._description = description
        self._config = config
        self.forward_calls = 0
        self.reused_calls = 0
        self.compute_seconds = 0.0
        #: reference passes on what the candidate produced (the judge of its text, the reference's own
        #: answer where the two disagree): no snapshot can hold them in advance
        self.dependent_calls = 0
        self._dependent = 0

    @contextlib.contextmanager
    def candidate_dependent(self) -> Iterator[None]:
        """Calls inside read what the candidate produced: counted apart (`usage`)."""
        self._dependent += 1
        try:
            yield
        finally:
            self._dependent -= 1

    # what the gates read besides model outputs: the real engine's (no forward pass), kept for when it leaves
    @property
    def description(self) -> dict[str, Any]:
        if self._description is None:
            self._description = self.real.describe()  # type: ignore[union-attr]
        return self._description

    @property
    def config(self) -> Any:
        if self._config is None and self.real is not None:
            self._config = getattr(getattr(self.real, "model", None), "config", None)
        return self._config

    @property
    def backend(self) -> str:  # type: ignore[override]
        return str(self.description.get("backend", "hf"))

    @property
    def device(self) -> str:
        return str(self.description.get("device"))

    @property
    def model_config(self) -> Any:
        return self.config

    def attach(self, real: Engine) -> None:
        """The reference is in memory (again): calls the snapshot lacks are computed by `real`."""
        self.real = real

    def detach(self) -> None:
        """The reference leaves memory (a sequential run): what stands for it is kept, calls the snapshot
        lacks raise ReferenceAbsent from now on."""
        _ = self.description, self.config
        self.real = None

    def describe(self) -> dict[str, Any]:
        return self.real.describe() if self.real is not None else dict(self.description)

    def _engine(self, method: str) -> Engine:
        if self.real is None:
            raise ReferenceAbsent(f"the reference snapshot holds no answer for this {method} call and the reference is "
                                  "not in memory")
        return self.real

    def _hit(self) -> None:
        self.reused_calls += 1

    def _computed(self, t0: float) -> None:
        if self._dependent:
            self.dependent_calls += 1
        else:
            self.forward_calls += 1
        self.compute_seconds += time.perf_counter() - t0

    def stored_generation(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool,
                          batch_size: int) -> tuple[str, Path, Generation | None]:
        """The key of a `generate` call made now, its entry's file, and the stored generation when the entry
        is whole (else None). The one key of the reference's generations: the call (token ids, settings) and,
        on a CPU, the intra-op thread count at the call — it changes a product's rounding, and a side-by-side
        job runs with its share (engines/concurrent.py), so ask inside the same thread setting as the call."""
        key = hash_json({"method": "generate", "prompts": [list(p) for p in prompts], "new_tokens": max_new_tokens,
                         "suppress_eos": suppress_eos, "batch_size": batch_size,
                         "threads": torch.get_num_threads() if self.device.startswith("cpu") else None})
        got = self.store.get_generation(key)
        return key, self.store.generation_path(key), got if got is not None and len(got.tokens) == len(prompts) else None

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        key, _, got = self.stored_generation(prompts, max_new_tokens, suppress_eos=suppress_eos, batch_size=batch_size)
        if got is not None:
            self._hit()
            if progress is not None:
                progress(len(prompts))
            return got
        t0 = time.perf_counter()
        gen = self._engine("generate").generate(prompts, max_new_tokens, suppress_eos=suppress_eos, batch_size=batch_size, progress=progress)
        self.store.put_generation(key, gen)
        self._computed(t0)
        return gen

    def usage(self) -> dict[str, Any]:
        """This process's use of the snapshot (a forked side-by-side job's calls are not counted)."""
        return {"reference_forward_calls": self.forward_calls, "candidate_dependent_calls": self.dependent_calls,
                "reused_calls": self.reused_calls,
                "reference_seconds": round(self.compute_seconds, 2), "entries_written": self.store.written,
                "bytes_written": self.store.bytes_written}


class SnapshotReference(StoredReference):
    """The reference answering from the snapshot: each logits call compact (`compact.compress`), read back or
    computed by the real engine and stored."""

    full_logits = False
    keeps_snapshot = True

    def __init__(self, real: Engine | None, store: SnapshotStore, topk: int | None, audit: bool, *,
                 description: dict[str, Any] | None = None, config: Any = None) -> None:
        super().__init__(real, store, description=description, config=config)
        self.topk = topk
        self.audit = audit
        #: the blocks of the latest call of each method, as they are produced (`MirrorCandidate` reads them)
        self.live: dict[str, tuple[str, list[Compact]]] = {}
        self._mirrored = False  # a MirrorCandidate reads the full logits of what is computed

    def detach(self) -> None:
        super().detach()
        self.live.clear()

    def mirror(self, on: bool) -> None:
        """While a `MirrorCandidate` answers from this reference's own outputs (the snapshot being filled):
        each call's blocks are kept for it, with their full logits; off again, nothing is kept."""
        self._mirrored = on
        if not on:
            self.live.clear()

    def _key(self, method: str, **args: Any) -> str:
        # the stored form is part of every entry's key (the folder's too, in the pipeline)
        return hash_json({"method": method, "form": {"topk": self.topk, "tail_points": TAIL_POINTS}, **args})

    def _live(self, method: str, key: str, blocks: list[Compact]) -> list[Compact]:
        if self._mirrored:  # held for the mirror only (with their full logits: never otherwise)
            self.live[method] = (key, blocks)
        return blocks

    def _stored(self, key: str, rows: list[tuple[int, ...]]) -> list[Compact] | None:
        """The stored blocks of a call when they have the shapes the call produces (leading
        dimensions `rows`, one vocabulary); anything else is a miss, recomputed and rewritten."""
        got = self.store.get_logits(key)
        if got is None or [tuple(b.best.shape) for b in got] != rows or len({b.vocab for b in got}) != 1:
            return None
        return got

    def logits(self, input_ids: torch.Tensor) -> Compact:
        key = self._key("logits", ids=_ids(input_ids))
        if (got := self._stored(key, [tuple(input_ids.shape)])) is not None:
            self._hit()
            return self._live("logits", key, got)[0]
        t0 = time.perf_counter()
        x = input_ids.cpu()
        nxt = torch.cat([x[:, 1:], torch.full((x.shape[0], 1), -1, dtype=x.dtype)], dim=1)
        block = compress(self._engine("logits").logits(input_ids), nxt, self.topk, keep_source=self.audit or self._mirrored)
        self.store.put_logits(key, [block])
        self._computed(t0)
        return self._live("logits", key, [block])[0]

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Compact]:
        key = self._key("logits_pieces", ids=_ids(input_ids), piece=piece)
        n, t = input_ids.shape
        if (got := self._stored(key, [(n, min(piece, t - s)) for s in range(0, t, piece)])) is not None:
            self._hit()
            yield from self._live("logits_pieces", key, got)
            return
        t0 = time.perf_counter()
        x = input_ids.cpu()
        nxt = torch.cat([x[:, 1:], torch.full((x.shape[0], 1), -1, dtype=x.dtype)], dim=1)
        blocks: list[Compact] = self._live("logits_pieces", key, [])
        start = 0
        for logits in self._engine("logits_pieces").logits_pieces(input_ids, piece):
            end = start + logits.shape[1]
            block = compress(logits, nxt[:, start:end], self.topk, keep_source=self.audit or self._mirrored)
            # kept for the store (and the mirror, which takes each block's full logits in step); without
            # a mirror a piece's full logits live only while the gate holds the piece, as before
            blocks.append(block if self._mirrored else replace(block, source=None))
            start = end
            yield block
        self.store.put_logits(key, blocks)
        self._computed(t0)

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Compact:
        key = self._key("answer_logits", prompt=list(prompt), answer=list(answer))
        if (got := self._stored(key, [(len(answer),)])) is not None:
            self._hit()
            return self._live("answer_logits", key, got)[0]
        t0 = time.perf_counter()
        block = compress(self._engine("answer_logits").answer_logits(prompt, answer), torch.tensor(list(answer)), self.topk,
                         keep_source=self.audit or self._mirrored)
        self.store.put_logits(key, [block])
        self._computed(t0)
        return self._live("answer_logits", key, [block])[0]


class LiveReference(StoredReference):
    """The reference when no snapshot is kept (`snapshot.enabled: false`, or a served reference, whose answers
    are its server's): logits come from the engine itself, in full (or as its server's top K), each call
    computed; its greedy generations are stored and read back as the snapshot's are (the same store, the same
    key), so every later candidate and run reads them. Anything else (tokenizer, model) is the engine's."""

    def __init__(self, real: Engine, store: SnapshotStore) -> None:
        super().__init__(real, store)

    def __getattr__(self, name: str) -> Any:
        if name == "real" or name.startswith("__"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.real, name)

    @property
    def full_logits(self) -> bool:  # type: ignore[override]  # the engine's (a class attribute on Engine)
        return bool(getattr(self.real, "full_logits", True))

    @property
    def model_config(self) -> Any:
        return getattr(self.real, "model_config", None)

    def logits(self, input_ids: torch.Tensor) -> Logits:
        t0 = time.perf_counter()
        out = self._engine("logits").logits(input_ids)
        self._computed(t0)
        return out

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Logits]:
        t0 = time.perf_counter()
        yield from self._engine("logits_pieces").logits_pieces(input_ids, piece)
        self._computed(t0)

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Logits:
        t0 = time.perf_counter()
        out = self._engine("answer_logits").answer_logits(prompt, answer)
        self._computed(t0)
        return out


def expand(block: Compact) -> torch.Tensor:
    """Full logits for a compact block: its own full logits when they were computed in this
    process (handed over: the block keeps none, so no audit is computed for a mirror), else
    log-probabilities rebuilt from it (top k exact, the tail spread evenly; finite)."""
    if block.source is not None:
        src, block.source = block.source, None
        return src
    if block.full is not None:
        return block.full
    lead, k = block.best.shape, block.top_logp.shape[-1]
    rest = block.vocab - k
    fill = torch.where(torch.isfinite(block.log_tail), block.log_tail - torch.log(torch.tensor(float(max(rest, 1)))),
                       torch.full_like(block.log_tail, -100.0))
    out = fill.unsqueeze(-1).expand(*lead, block.vocab).clone()
    return out.scatter_(-1, block.top_idx.long(), block.top_logp)


class MirrorCandidate(Engine):
    """The reference standing in for the candidate while the snapshot is filled (`qval reference`):
    every gate runs its reference work as it would against a real candidate, and the "candidate"
    answers with the reference's own outputs of the same call, computing nothing. Its figures mean
    nothing (the reference against itself) and are thrown away."""

    backend = "mirror"
    mirrors = True  # engines/concurrent.py runs a mirror's jobs in turn, with a paired run's threads

    def __init__(self, ref: SnapshotReference) -> None:
        self.ref = ref
        ref.mirror(True)

    @property
    def device(self) -> str:
        return self.ref.device

    def _blocks(self, method: str, key: str) -> list[Compact] | None:
        live = self.ref.live.get(method)
        return live[1] if live is not None and live[0] == key else None

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        got = self._blocks("logits", self.ref._key("logits", ids=_ids(input_ids)))
        block = got[0] if got else self.ref.logits(input_ids)
        self.ref.live.pop("logits", None)
        return expand(block)

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[torch.Tensor]:
        key = self.ref._key("logits_pieces", ids=_ids(input_ids), piece=piece)
        got = self._blocks("logits_pieces", key)
        if got is None:  # the reference was not asked first (or asked something else): ask it now
            for block in self.ref.logits_pieces(input_ids, piece):
                yield expand(block)
            return
        i = 0
        while i < len(got):  # in step with the reference's generator: block i exists once it yielded it
            yield expand(got[i])
            i += 1

    def answer_logits(self, prompt: list[int], answer: list[int]) -> torch.Tensor:
        got = self._blocks("answer_logits", self.ref._key("answer_logits", prompt=list(prompt), answer=list(answer)))
        block = got[0] if got else self.ref.answer_logits(prompt, answer)
        self.ref.live.pop("answer_logits", None)
        return expand(block)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        from ..engines import concurrent

        # the reference's generation of the same call, with the threads a paired run gives it (the
        # entry a real candidate's run reads back), read from the snapshot or computed there
        with concurrent._threads(concurrent.share([self.ref, self])):
            return self.ref.generate(prompts, max_new_tokens, suppress_eos=suppress_eos, batch_size=batch_size, progress=progress)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "executed": True}

"""The one interface every gate runs a model through.

A gate never touches a model directly: it asks an `Engine` for the logits of one chunk, for
the logits of one long sequence piece by piece (with the KV cache, so a quantized KV cache is
exercised the way decoding exercises it), or for greedy generations. Engines register by name
in `qval.engines.builders.BUILDERS`; the config's `engine.backend` picks the candidate's, and its
builder receives a `BuildContext`.

Scoring methods answer `Logits` (qval/logits.py): raw logits [..., V] from an engine that computes
in this process, or a `Compact` block [...] where only part of each distribution is known — the
reference snapshot's stored form, a served engine's top K. Both index, reshape and move alike,
and every metric function takes either on either side.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ..logits import Logits, cat

if TYPE_CHECKING:
    from ..config import GateConfig
    from ..models import LoadedModel


@dataclass
class BuildContext:
    """What a backend's builder gets: the config, the loaded reference and the calibration."""

    config: "GateConfig"
    reference: "LoadedModel"
    calib_state: Path | None  # the calibrate stage's saved quantizer state
    run_dir: Path
    log: Callable[[str], Any] = print
    #: a sequential run: the builder may take the reference's weights as the candidate's (no copy);
    #: the reference is reloaded when it is needed again
    consume_reference: bool = False

    def reference_weights(self) -> "torch.nn.Module":
        """The reference model for the candidate to be built from: itself when it may be consumed, else a copy."""
        import copy

        return self.reference.model if self.consume_reference else copy.deepcopy(self.reference.model)


@dataclass
class Generation:
    """Greedy continuations of a batch of prompts (new tokens only)."""

    tokens: list[list[int]]
    #: per sequence: steps whose logits held a NaN/Inf (the first such step, or None)
    first_nonfinite_step: list[int | None]
    #: per sequence: where EOS was produced (None: never, or suppressed)
    eos_step: list[int | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "first_nonfinite_step": self.first_nonfinite_step, "eos_step": self.eos_step}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Generation":
        return cls(tokens=d["tokens"], first_nonfinite_step=d["first_nonfinite_step"], eos_step=d.get("eos_step", []))


class Engine(ABC):
    """A model as a gate sees it."""

    backend: str = "?"
    executed: bool = True  # False only for adapters that could not be run where the report was made
    #: whether scoring answers raw logits (False: `Compact` blocks, which hold the input's next tokens'
    #: log-probabilities exactly but not every token's: a caller scoring a continuation puts it in the input)
    full_logits: bool = True

    @property
    @abstractmethod
    def device(self) -> str: ...

    @abstractmethod
    def logits(self, input_ids: torch.Tensor) -> Logits:
        """[B, T] token ids -> [B, T, V] logits (or a [B, T] compact block) for one chunk (teacher forcing)."""

    @abstractmethod
    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Logits]:
        """Long [B, T] sequences scored `piece` positions at a time through the KV cache;
        yields [B, piece, V] logits, so memory stays O(piece × V) whatever T is."""

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Logits:
        """[len(answer), V] logits that predict each token of `answer` after `prompt`: the prompt
        prefilled into the KV cache, the answer then read through the cache as decoding would.
        Engines that can skip the prompt's own logits (most of a long prompt's output) override it."""
        ids = torch.tensor([prompt + answer])
        first, last = len(prompt) - 1, len(prompt) + len(answer) - 1
        rows, start = [], 0
        for logits in self.logits_pieces(ids, len(prompt)):
            end = start + logits.shape[1]
            lo, hi = max(start, first), min(end, last)
            if lo < hi:
                rows.append(logits[0, lo - start : hi - start])
            start = end
        return cat(rows)

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int, progress: Any = None
    ) -> Generation:
        """Greedy decoding with a KV cache, batched; EOS optionally suppressed."""

    @property
    def model_config(self) -> Any:
        """The model's configuration (transformers' `PretrainedConfig`) where the engine knows it, else None:
        what a gate reads besides outputs (the positions a model holds)."""
        return getattr(getattr(self, "model", None), "config", None)

    def close(self) -> None:
        """Give back what the engine holds outside this process (a server it started); idempotent."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "executed": self.executed}

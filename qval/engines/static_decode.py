"""Greedy decoding of a fixed-shape batch through a static KV cache, as CUDA graphs on a GPU.

One graph per cache-length bucket: a step sees only the cache slots filled so far, rounded up to
`BUCKET` (decode_attention.py: the filled slots, K/V heads read once per GQA group), so a step's
attention traffic grows with the context instead of being the whole cache's from the first step.
Part of qval's decode runtime (runtime.py): it runs only on an engine whose runtime is on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from .. import determinism
from . import decode_attention
from .fused_step import FusedStep

if TYPE_CHECKING:
    from .runtime import DecodeRuntime

BUCKET = 256  # cache slots per bucket: one CUDA graph each (a 2,048-token generation: ~9)


class StaticDecoder:
    """Greedy decoding of a fixed-shape batch (`batch` rows, cache of `max_len` slots, up to
    `new_tokens` tokens) through a transformers `StaticCache`.

    Each emitted token follows the plain path exactly: positions count real tokens only
    (transformers' `cumsum(mask) − 1`), a query sees the real prompt slots and every decoded
    slot up to its own, logits are checked for NaN/Inf before EOS is suppressed, argmax in
    float32. All per-step state lives in device buffers that the step updates in place, which
    is what lets a CUDA graph replay it; the decoder, its cache and its graph are reused for
    every batch of the same shape.

    With `filled` (and the runtime's attention on the model: decode_attention.py) a step attends
    over the first `_length(...)` slots only (the slots it can see, rounded up to `BUCKET`), one
    graph per length; without, over the whole cache, one graph. With `fused`, a step's RMSNorms,
    rotary embeddings and SiLU·mul run as compiled kernels and its products through gemv.py
    (fused_step.py; the prefill stays eager). `runtime` (the engine's) holds the switches for the
    Triton kernels and receives what could not run here.
    """

    # a step's index writes (the cache's slot, the output's column) go to distinct indices: in
    # deterministic mode they need not take torch's sorted index_put_ (determinism.distinct_index_writes)
    distinct_writes = True

    def __init__(self, model: torch.nn.Module, batch: int, max_len: int, new_tokens: int, eos: list[int],
                 suppress_eos: bool, use_graph: bool, filled: bool = True, fused: bool = False,
                 runtime: "DecodeRuntime | None" = None) -> None:
        from transformers import StaticCache

        self.model, self.batch, self.max_len, self.new_tokens = model, batch, max_len, new_tokens
        self.suppress_eos, self.use_graph = suppress_eos, use_graph
        p = next(model.parameters())
        self.device = p.device
        self.cache = StaticCache(config=model.config, max_cache_len=max_len)
        self.eos = torch.tensor(eos, device=self.device)
        # eager attention adds its mask to the scores; sdpa takes a boolean one
        self.additive = model.config._attn_implementation == "eager"
        self.hidden = torch.finfo(p.dtype).min if self.additive else False
        self.visible = 0.0 if self.additive else True
        mask_dtype = p.dtype if self.additive else torch.bool
        dev = self.device
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)  # the token fed to the next step
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)  # its position id
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)  # its cache slot
        self.step = torch.zeros(1, dtype=torch.long, device=dev)  # index of the next emitted token
        self.mask = torch.full((batch, 1, 1, max_len), self.hidden, dtype=mask_dtype, device=dev)
        self.out = torch.zeros(batch, new_tokens, dtype=torch.long, device=dev)
        self.bad = torch.zeros(batch, new_tokens, dtype=torch.bool, device=dev)
        self.failures: dict[str, str] = runtime.failures if runtime is not None else {}
        self.split_kv = runtime.split_kv if runtime is not None else True
        self.requested_filled = filled
        self.filled = filled and decode_attention.implementation(model) == decode_attention.NAME
        self.requested_fused = fused
        self._fused = FusedStep(model, self.failures, runtime.gemv if runtime is not None else True) if fused else None
        self.fused = self._fused.counts if self._fused is not None else None  # what runs fused (None: not fused)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # by attended length
        self.graph_error: str | None = None
        self.on_step: Callable[[int], None] | None = None  # called on the host after each step with the tokens done (benchmarks)

    def fits(self, batch: int, max_len: int, new_tokens: int, eos: list[int], suppress_eos: bool, filled: bool = True,
             fused: bool = False) -> bool:
        return (batch, new_tokens, suppress_eos, eos, filled, fused) == (
            self.batch, self.new_tokens, self.suppress_eos, self.eos.tolist(), self.requested_filled, self.requested_fused
        ) and max_len <= self.max_len

    def _emit(self, logits: torch.Tensor) -> None:
        scores = logits.float()
        finite = torch.isfinite(scores).all(dim=-1)
        if self.suppress_eos:
            scores = scores.index_fill(1, self.eos, float("-inf"))
        nxt = scores.argmax(dim=-1, keepdim=True)
        self.out.index_copy_(1, self.step, nxt)
        self.bad.index_copy_(1, self.step, (~finite).unsqueeze(1))
        self.tok.copy_(nxt)
        self.step.add_(1)

    def _length(self, seen: int) -> int:
        """The slots a step that sees `seen` of them attends over."""
        return min(self.max_len, -(-seen // BUCKET) * BUCKET) if self.filled else self.max_len

    def _step(self, length: int) -> None:
        """One decode step over `length` cache slots, device operations only (the body of a CUDA graph)."""
        step: dict[str, Any] = {}
        if self.filled:
            step[decode_attention.STEP] = decode_attention.StepAttention(length, self.split_kv, self.failures)
        with (self._fused.installed() if self._fused is not None else nullcontext(),
              determinism.distinct_index_writes() if self.distinct_writes and self.device.type == "cuda" else nullcontext()):
            out = self.model(input_ids=self.tok, position_ids=self.pos, cache_position=self.slot, attention_mask=self.mask,
                             past_key_values=self.cache, use_cache=True, **step)
            self._emit(out.logits[:, -1, :])
            self.pos.add_(1)
            self.slot.add_(1)
            self.mask.index_fill_(3, self.slot, self.visible)  # the next token's own slot becomes visible

    def _prefill(self, ids: torch.Tensor, attn: torch.Tensor) -> None:
        self.cache.reset()
        width = ids.shape[1]
        real = torch.zeros(self.batch, self.max_len, dtype=torch.bool, device=self.device)
        real[:, :width] = attn.bool()
        key = torch.arange(self.max_len, device=self.device)
        query = torch.arange(width, device=self.device)
        # causal over real keys; a padding query also sees itself, so no row is fully masked (NaN)
        seen = (key[None, :] <= query[:, None])[None] & (real[:, None, :] | (key[None, :] == query[:, None])[None])
        prefill_mask = torch.where(seen, self.visible, self.hidden).to(self.mask.dtype).unsqueeze(1)
        positions = (attn.long().cumsum(-1) - 1).masked_fill(attn == 0, 0)
        out = self.model(input_ids=ids, position_ids=positions, cache_position=query, attention_mask=prefill_mask,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.step.zero_()
        self._emit(out.logits[:, -1, :])
        self.pos.copy_(attn.long().sum(-1, keepdim=True))
        self.slot.fill_(width)
        real[:, width] = True
        self.mask.copy_(torch.where(real, self.visible, self.hidden).to(self.mask.dtype)[:, None, None, :])

    def _capture(self, length: int) -> bool:
        """Record the step over `length` slots as a graph (all graphs share one memory pool: they
        never run at once). The first capture runs one real step on a side stream first (warm-up:
        cuBLAS workspaces, lazy inits) and returns True: that step was taken. A model whose step
        cannot be captured keeps running eagerly."""
        warm = not self.graphs
        if warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(length)
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        pool = next(iter(self.graphs.values())).pool() if self.graphs else None
        try:
            with torch.cuda.graph(graph, pool=pool):
                self._step(length)
        except RuntimeError as err:  # e.g. a host sync inside the model's forward
            self.use_graph, self.graph_error = False, str(err).splitlines()[0]
            return warm
        self.graphs[length] = graph
        return warm

    @torch.no_grad()
    def run(self, ids: torch.Tensor, attn: torch.Tensor, eos_check_every: int = 32) -> tuple[list[list[int]], list[int | None]]:
        """Greedy tokens [batch][new_tokens] of one left-padded batch, and each row's first
        non-finite step. Without EOS suppression the batch stops early once every row has an EOS."""
        width = ids.shape[1]
        if width + self.new_tokens > self.max_len:
            raise ValueError(f"prompt width {width} + {self.new_tokens} new tokens exceeds the cache ({self.max_len})")
        self._prefill(ids, attn)
        done = 1
        while done < self.new_tokens:
            length = self._length(width + done)  # this step writes slot width + done − 1 and sees all before it
            if self.use_graph and length not in self.graphs and (self.graphs or self.new_tokens - done >= 2):
                if self._capture(length):
                    done += 1  # the warm-up step was a real one
                    continue
            if length in self.graphs:
                self.graphs[length].replay()
            else:
                self._step(length)
            done += 1
            if self.on_step is not None:
                self.on_step(done)
            if not self.suppress_eos and done % eos_check_every == 0:
                if bool(torch.isin(self.out[:, :done], self.eos).any(dim=1).all()):
                    break
        rows = self.out[:, :done].tolist()
        bad = self.bad[:, :done]
        first = [int(r.nonzero()[0, 0]) if bool(r.any()) else None for r in bad.cpu()]
        return rows, first

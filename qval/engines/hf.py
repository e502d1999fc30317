"""A transformers causal LM as an engine: the reference, and the base of simulated candidates.

Greedy decoding has two paths that give the same tokens (tests/engines/test_hf.py checks it):

- "plain": transformers' `generate` with a dynamic KV cache. It works for every model, but it
  spends most of each step on the host (Python, logits processors, one device sync per step):
  on an H200 a 1B model decoded at batch 1 in 19× the time its weights take to stream from
  memory, an FP8 fake-quant 8B candidate in 33× (benchmarks/RESULTS.md).
- "static": `StaticDecoder` (static_decode.py) — a static KV cache of fixed shape and a decode step made
  only of device operations on fixed buffers (forward, finiteness check, EOS suppression,
  argmax, next position and mask), so on a GPU the step is captured as CUDA graphs (one per
  256-slot bucket of the filled cache, which is all a step attends over: decode_attention.py)
  and replayed with no host work and no sync until the batch ends.

`decode="auto"` picks "static" on CUDA for models transformers marks as static-cache capable
(`_can_compile_fullgraph`) with an attention that takes a 4D mask, and "plain" otherwise
(on CPU the host overhead is small next to the forward, and plain is the proven path).

`runtime="qval"` (the default; `engine.options.runtime`) runs the model through qval's decode
runtime (runtime.py: its attention, KV cache and static decoder); `runtime="transformers"` through
transformers' `generate` and forward with their own cache and attention only (decode "plain").
"""

from __future__ import annotations

from typing import Any, Iterator, Literal

import torch

from ..memory import empty_tensors
from .base import Engine, Generation
from .kvcache import install_prequantized_kv
from . import decode_attention, decode_kernel, gemv, runtime as decode_runtime
from .runtime import DecodeRuntime, Runtime
from .static_decode import StaticDecoder

DecodeMode = Literal["auto", "plain", "static"]
_MASKED_ATTENTION = ("sdpa", "eager", decode_attention.NAME)  # attentions that accept a ready 4D mask
CACHE_ROUND = 256  # the static cache length is rounded up to this, so similar calls share a decoder


class _StepWatch:
    """A logits processor that records, per sequence, the first decoding step whose logits
    were not all finite. It must see the model's own logits, so `generate` is given no
    processor of its own (EOS suppression runs after this one, in our list)."""

    def __init__(self, batch: int) -> None:
        self.step = 0
        self.first_bad: list[int | None] = [None] * batch

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bad = (~torch.isfinite(scores).all(dim=-1)).tolist()
        for i, b in enumerate(bad):
            if b and self.first_bad[i] is None:
                self.first_bad[i] = self.step
        self.step += 1
        return scores


class _SuppressTokens:
    """Set the given tokens' scores to −inf (EOS suppression, after `_StepWatch` has looked)."""

    def __init__(self, ids: list[int], device: str) -> None:
        self.ids = torch.tensor(ids, device=device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores.index_fill(1, self.ids, float("-inf"))


def left_pad(group: list[list[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, W] ids and attention mask, padded on the left so every next token is in the last column.

    >>> ids, mask = left_pad([[5, 6], [7]], 0, "cpu")
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(len(p) for p in group)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=device)
    return ids, mask


def split_rows(rows: list[list[int]], eos: list[int], suppress_eos: bool) -> tuple[list[list[int]], list[int | None]]:
    """Cut each row after its first EOS (kept); EOS steps are None when EOS was suppressed.

    >>> split_rows([[4, 2, 9], [4, 4, 4]], [2], False)
    ([[4, 2], [4, 4, 4]], [1, None])
    """
    tokens, eos_at = [], []
    for row in rows:
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        eos_at.append(None if suppress_eos else stop)
        tokens.append(row if stop is None else row[: stop + 1])
    return tokens, eos_at


def probe_ids(model: torch.nn.Module, tokens: int, batch: int = 2) -> torch.Tensor:
    """Fixed random token ids on the model's device, for the bit-identity self-checks that
    guard qval's own forwards (leanfp8.install, kvcache.install_prequantized_kv)."""
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(0))
    return ids.to(next(model.parameters()).device)


class HFEngine(Engine):
    backend = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, notes: list[str] | None = None,
                 decode: DecodeMode = "auto", runtime: Runtime = "qval") -> None:
        if runtime == "transformers" and decode == "static":
            raise ValueError("static decoding is qval's runtime: runtime='transformers' decodes through transformers' generate")
        self.model = model
        self.tokenizer = tokenizer
        self.notes = list(notes or [])
        self.decode = decode
        self._decoder: StaticDecoder | None = None
        #: qval's decode runtime on this engine's model (None: transformers' code only)
        self.runtime: DecodeRuntime | None = DecodeRuntime(model) if runtime == "qval" else None
        self._own()
        self.kv_quantizers: dict[int, tuple[Any, Any]] = {}  # set by prequantize_kv()

    def _own(self) -> None:
        """The model's attention as this engine runs it (the runtime's, or transformers' own)."""
        if self.runtime is not None:
            self.runtime.own()
        else:
            decode_runtime.plain(self.model)

    @property
    def static_filled(self) -> bool:
        """Static decode attends over the filled cache slots only (the runtime's switch)."""
        return self.runtime is not None and self.runtime.filled

    @static_filled.setter
    def static_filled(self, on: bool) -> None:
        if self.runtime is not None:
            self.runtime.filled = on

    @property
    def static_fused(self) -> bool | None:
        """The static step's small kernels fused (fused_step.py; the runtime's switch); None: on a GPU."""
        return self.runtime.fused if self.runtime is not None else False

    @static_fused.setter
    def static_fused(self, on: bool | None) -> None:
        if self.runtime is not None:
            self.runtime.fused = on

    def prequantize_kv(self, on_gpu: bool = False) -> None:
        """Quantize the KV cache once per token, on entry, instead of ModelOpt's whole-cache pass
        per step (kvcache.py); checked bit-identical here, else ModelOpt's path stays (noted).
        CPU only: on the H200 it was not faster and changed greedy tokens (kvcache.py);
        `on_gpu` is for benchmarks/kv_prequant_cpu.py --device cuda, which measured that."""
        if (not self.device.startswith("cpu") and not on_gpu) or self.runtime is None:
            return
        self._own()
        self.kv_quantizers, why = install_prequantized_kv(self.model, probe_ids(self.model, 268))
        if self.kv_quantizers:
            self.notes.append(f"KV cache of {len(self.kv_quantizers)} layers quantized once per token as it enters the cache "
                              "(ModelOpt's plugin re-quantizes the whole cache every step); the same logits, checked bit for "
                              "bit when the engine was built")
        elif why:
            self.notes.append(why)

    @property
    def device(self) -> str:
        return str(next(self.model.parameters()).device)

    def decode_path(self) -> str:
        """The greedy-decoding path this engine takes: "plain" or "static" ("auto" resolved)."""
        if self.runtime is None:
            return "plain"
        if self.decode != "auto":
            return self.decode
        ok = getattr(self.model, "_can_compile_fullgraph", False) and self.model.config._attn_implementation in _MASKED_ATTENTION
        return "static" if ok and self.device.startswith("cuda") else "plain"

    def _cache(self) -> Any:
        """A KV cache for one call: the runtime's (same logits as DynamicCache, without copying the
        cache every token), or transformers' own."""
        if self.runtime is not None:
            return self.runtime.cache(self.kv_quantizers)
        from transformers import DynamicCache

        return DynamicCache()

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._own()
        return self.model(input_ids=input_ids.to(self.device), use_cache=False).logits

    @torch.no_grad()
    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[torch.Tensor]:
        self._own()
        cache = self._cache()
        ids = input_ids.to(self.device)
        for start in range(0, ids.shape[1], piece):
            out = self.model(input_ids=ids[:, start : start + piece], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            yield out.logits

    @torch.no_grad()
    def answer_logits(self, prompt: list[int], answer: list[int]) -> torch.Tensor:
        """The prompt prefilled through the KV cache computing only its last position's logits
        (`logits_to_keep=1`: a long prompt's other logits are most of the lm_head's work), then
        the answer read through the cache: the numbers of `Engine.answer_logits` without its unused rows."""
        self._own()
        head = self.model(input_ids=torch.tensor([prompt], device=self.device), past_key_values=self._cache(), use_cache=True,
                          logits_to_keep=1)
        # the whole answer in one piece, its last row unused: the same shapes (and so the same
        # numbers, bit for bit in the decoder) as the interface's definition through logits_pieces
        tail = self.model(input_ids=torch.tensor([answer], device=self.device), past_key_values=head.past_key_values,
                          use_cache=True)
        return torch.cat([head.logits[0, -1:], tail.logits[0, :-1]])

    def eos_ids(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [int(i) for i in ids if i is not None]

    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids()[0]

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int, progress: Any = None
    ) -> Generation:
        self._own()
        if self.decode_path() == "static":
            try:
                return self._generate_static(prompts, max_new_tokens, suppress_eos, batch_size, progress)
            except (RuntimeError, TypeError, ValueError) as err:
                if self.decode != "auto":
                    raise
                # a model/transformers combination the static path does not fit: the plain path
                # computes the same tokens, so fall back to it for good and say so in the report
                self._decoder, self.decode = None, "plain"
                self.notes.append(f"static decode unavailable ({type(err).__name__}: {str(err).splitlines()[0][:200]}); used plain")
        return self._generate_plain(prompts, max_new_tokens, suppress_eos, batch_size, progress)

    def _generate_plain(self, prompts: list[list[int]], max_new_tokens: int, suppress_eos: bool, batch_size: int,
                        progress: Any) -> Generation:
        from transformers import LogitsProcessorList

        eos, pad = self.eos_ids(), self.pad_id()
        tokens: list[list[int]] = []
        bad: list[int | None] = []
        eos_at: list[int | None] = []
        for b0 in range(0, len(prompts), batch_size):
            group = prompts[b0 : b0 + batch_size]
            ids, mask = left_pad(group, pad, self.device)
            watch = _StepWatch(len(group))
            # EOS suppression is our own processor after the watch: generate's suppress_tokens /
            # min_new_tokens would run first and make the watch see −inf for every step
            processors = [watch] + ([_SuppressTokens(eos, self.device)] if suppress_eos else [])
            # the runtime's cache and attention: same tokens, without two per-step copies of the
            # whole KV cache that dominate long generations (kvcache.py, decode_attention.py)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad,
                eos_token_id=eos,
                logits_processor=LogitsProcessorList(processors),
                temperature=None,
                top_p=None,
                top_k=None,
                past_key_values=self._cache(),
            )
            rows, stops = split_rows(out[:, ids.shape[1] :].tolist(), eos, suppress_eos)
            tokens.extend(rows)
            eos_at.extend(stops)
            bad.extend(watch.first_bad)
            if progress is not None:
                progress(len(group))
        return Generation(tokens=tokens, first_nonfinite_step=bad, eos_step=eos_at)

    def release(self) -> None:
        """Empty the model in place, whoever still refers to it (a sequential run drops the candidate); unusable after."""
        self._decoder = None
        empty_tensors(self.model)

    def static_decoder(self, batch: int, max_len: int, new_tokens: int, eos: list[int], suppress_eos: bool) -> StaticDecoder:
        """The engine's decoder for this shape; one is kept (its cache and graph reused), and a
        different shape replaces it."""
        if self.runtime is None:
            raise ValueError("static decoding is qval's runtime; this engine runs transformers' code only")
        gpu = self.device.startswith("cuda")
        fused = gpu if self.runtime.fused is None else self.runtime.fused
        if self._decoder is None or not self._decoder.fits(batch, max_len, new_tokens, eos, suppress_eos, self.runtime.filled, fused):
            self._decoder = None  # free the old cache and graph first
            max_len = -(-max_len // CACHE_ROUND) * CACHE_ROUND
            self._decoder = StaticDecoder(self.model, batch, max_len, new_tokens, eos, suppress_eos,
                                          use_graph=gpu, filled=self.runtime.filled, fused=fused, runtime=self.runtime)
        return self._decoder

    def _generate_static(self, prompts: list[list[int]], max_new_tokens: int, suppress_eos: bool, batch_size: int,
                         progress: Any) -> Generation:
        eos, pad = self.eos_ids(), self.pad_id()
        batch = min(batch_size, len(prompts))
        dec = self.static_decoder(batch, max(len(p) for p in prompts) + max_new_tokens + 1, max_new_tokens, eos, suppress_eos)
        tokens: list[list[int]] = []
        bad: list[int | None] = []
        eos_at: list[int | None] = []
        for b0 in range(0, len(prompts), batch):
            group = prompts[b0 : b0 + batch]
            # the decoder's shape is fixed: a short last group is filled with copies of its first prompt
            ids, mask = left_pad(group + [group[0]] * (batch - len(group)), pad, self.device)
            rows, first_bad = dec.run(ids, mask)
            kept, stops = split_rows(rows[: len(group)], eos, suppress_eos)
            tokens.extend(kept)
            eos_at.extend(stops)
            bad.extend(first_bad[: len(group)])
            if progress is not None:
                progress(len(group))
        if dec.graph_error and not any("CUDA graph" in n for n in self.notes):
            self.notes.append(f"static decode ran without a CUDA graph: {dec.graph_error}")
        self._note_failures(dec)
        return Generation(tokens=tokens, first_nonfinite_step=bad, eos_step=eos_at)

    def _note_failures(self, dec: StaticDecoder) -> None:
        """What of the static decoder could not run here (the runtime's `failures`), once each, as notes."""
        failed = dict(dec.failures)
        kernel = failed.pop("split_kv", None)
        if dec.fused is not None and failed and not any("fused" in n for n in self.notes):
            self.notes.append("static decode's fused kernels could not run here, transformers' arithmetic instead: "
                              + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        if dec.fused is not None and (why := gemv.missing() or decode_kernel.missing()) and not any("Triton" in n for n in self.notes):
            self.notes.append(f"static decode without its Triton kernels here ({why}): products through cuBLAS, "
                              "attention through sdpa (slower; RESULTS.md §14.4)")
        if dec.filled and kernel and not any("split-KV" in n for n in self.notes):
            self.notes.append(f"static decode's split-KV attention kernel could not run here, sdpa instead: {kernel}")

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["dtype"] = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        d["runtime"] = "qval" if self.runtime is not None else "transformers"
        d["decode"] = self.decode_path()
        if self._decoder is not None and self._decoder.fused is not None:
            d["decode_fused"] = self._decoder.fused  # modules whose decode-step element-wise work was compiled
        d["notes"] = self.notes
        return d

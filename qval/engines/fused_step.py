"""The static decoder's step with its small kernels fused: RMSNorm, rotary embedding, SiLU·mul compiled,
the products of 1 to 16 rows through gemv.py's Triton kernels.

A decode step of a small batch is a few large products and, in transformers' code, ~40 small
element-wise kernels per layer (RMSNorm is eight, the rotary embedding ten, SiLU·mul two: RESULTS.md
§14). Here each of those is one `torch.compile`d (inductor) function, compiled once for one row and
once for any other batch size (the batch axis symbolic), and every bias-free `nn.Linear` (and
leanfp8.py's FP8 linear, after its input quantizer) goes to gemv.py: q/k/v in one launch (the k and v
projections' own calls take the outputs it left), gate/up with SiLU·mul in one.

`FusedStep(model, failures)` plans this once for one model instance; `installed()` gives the planned
modules instance forwards for the duration of one step (the static decoder's, captured in its CUDA
graph) and removes them after: outside the step — the prefill, the teacher-forced passes, a deep
copy of the model — every module runs transformers' (or ModelOpt's) own code. Nothing outside the
model instance changes. The modules are recognised by class (`known_classes`, a declared table of
transformers' Llama-family classes, not by reading their source); the fused functions are held to each
class's own forward by tests/engines/test_fused_step.py (bit for bit on a CPU), and the whole step to
the plain path's by tests/engines/test_runtime.py. The attention module's forward is qval's copy of
Llama's (the rotary embedding is a function inside it), taken only where the model's attention is the
runtime's (decode_attention.py) and ModelOpt quantizes none of its K/V.

Numerics: the same operations in the same precisions as transformers' code; inductor rounds every
intermediate to its tensor's dtype where eager rounds (`emulate_precision_casts`). The RMSNorm's mean
sums in another order than ATen's kernel (~1 ulp in float32, absorbed by the cast back except at a
rounding tie), gemv.py's products sum in their own order: a last-bit difference can move a near-tied
greedy token. A compiler or kernel that cannot run here is recorded in `failures` (the runtime's, an
engine note) and transformers' arithmetic runs from then on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from . import decode_attention, gemv

LEAN_QKV = "_qval_lean_qkv"  # on an FP8 q projection (leanfp8._group): (k module, v module, q, k, v weights), one scale
LEAN_GATE_UP = "_qval_lean_gate_up"  # on an FP8 gate projection (leanfp8._group): (its quantizer, gate weight, up weight)
KV_QUANTIZERS = ("q_bmm_quantizer", "k_bmm_quantizer", "v_bmm_quantizer", "p_bmm_quantizer")  # ModelOpt's, on an attention


def _eager_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _eager_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    half = q.shape[-1] // 2

    def rot(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _eager_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


EAGER: dict[str, Callable[..., Any]] = {"rms": _eager_rms, "rope": _eager_rope, "silu_mul": _eager_silu_mul}


@functools.cache
def compiled(name: str) -> Callable[..., Any]:
    """EAGER[name] compiled (a cache of code, not state: torch.compile's own caches are per code
    object anyway). emulate_precision_casts: each intermediate rounded to its tensor's dtype where
    eager rounds (inductor otherwise keeps a bfloat16 chain in float32)."""
    return torch.compile(EAGER[name], dynamic=False, fullgraph=True, options={"emulate_precision_casts": True})


@functools.cache
def known_classes() -> dict[type, str]:
    """transformers' module classes the step fuses, by kind: the Llama family's RMSNorm and MLP (one
    definition in Llama, Mistral, Qwen2, Qwen3) and Llama's attention."""
    from transformers.models.llama import modeling_llama as llama
    from transformers.models.mistral import modeling_mistral as mistral
    from transformers.models.qwen2 import modeling_qwen2 as qwen2
    from transformers.models.qwen3 import modeling_qwen3 as qwen3

    out: dict[type, str] = {llama.LlamaAttention: "attention"}
    for norm, mlp in ((llama.LlamaRMSNorm, llama.LlamaMLP), (mistral.MistralRMSNorm, mistral.MistralMLP),
                      (qwen2.Qwen2RMSNorm, qwen2.Qwen2MLP), (qwen3.Qwen3RMSNorm, qwen3.Qwen3MLP)):
        out[norm], out[mlp] = "rmsnorm", "mlp"
    return out


def kind_of(module: torch.nn.Module) -> str | None:
    """The module's kind in `known_classes`: its own class's, or the first known class behind
    ModelOpt's quantization wrappers (dynamic subclasses defined in modelopt); None otherwise."""
    known = known_classes()
    for cls in type(module).__mro__:
        if cls in known:
            return known[cls]
        if not cls.__module__.startswith("modelopt"):
            return None
    return None


def _plain(m: Any) -> bool:
    """A bias-free `nn.Linear` itself (a quantized subclass keeps its own forward)."""
    return type(m) is torch.nn.Linear and m.bias is None


def _why(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class FusedStep:
    """The fused forwards of one model's modules (planned once), installed for one step at a time."""

    def __init__(self, model: torch.nn.Module, failures: dict[str, str], use_gemv: bool = True) -> None:
        self.failures = failures  # the runtime's: what could not run here, and why
        self.use_gemv = use_gemv  # ≤ 16-row products through gemv.py (benchmarks switch it off to measure without)
        self._kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # q/k/v outputs of one launch, by module
        self._qkv: dict[int, tuple[torch.nn.Module, ...]] = {}  # q projection -> (q, k, v): one launch
        self._plan: list[tuple[torch.nn.Module, Callable[..., Any]]] = []
        self.counts = {"rmsnorm": 0, "mlp": 0, "rope": 0, "linears": 0, "qkv_groups": 0}
        silu = str(getattr(model.config, "hidden_act", "")) == "silu"
        ours = decode_attention.implementation(model) == decode_attention.NAME
        for m in model.modules():
            kind = kind_of(m)
            if kind == "rmsnorm" and hasattr(m, "variance_epsilon"):
                self._add(m, functools.partial(self._rms, m), "rmsnorm")
            elif kind == "mlp" and silu:
                self._add(m, functools.partial(self._mlp, m), "mlp")
            elif kind == "attention" and ours and not any(getattr(getattr(m, q, None), "is_enabled", False) for q in KV_QUANTIZERS):
                self._add(m, functools.partial(self._attention, m), "rope")
            elif _plain(m) or getattr(m.__dict__.get("forward"), "lean", None) is not None:
                self._add(m, functools.partial(self._linear, m, m.__dict__.get("forward")), "linears")
            group = tuple(getattr(m, n, None) for n in ("q_proj", "k_proj", "v_proj"))
            if all(_plain(p) for p in group) and len({p.in_features for p in group}) == 1:  # type: ignore[union-attr]
                self._qkv[id(group[0])] = group  # type: ignore[assignment]
                self.counts["qkv_groups"] += 1

    def _add(self, module: torch.nn.Module, forward: Callable[..., Any], kind: str) -> None:
        self._plan.append((module, forward))
        self.counts[kind] += 1

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Within: the planned modules run their fused forwards (instance attributes, removed on exit)."""
        before = [m.__dict__.get("forward") for m, _ in self._plan]
        for m, forward in self._plan:
            m.__dict__["forward"] = forward
        try:
            yield
        finally:
            for (m, _), old in zip(self._plan, before):
                if old is None:
                    m.__dict__.pop("forward", None)
                else:
                    m.__dict__["forward"] = old
            self._kept.clear()  # q/k/v outputs not yet taken (a step that raised)

    def _call(self, name: str, *args: Any) -> Any:
        """EAGER[name](*args) through its compiled form; a compiler that cannot run here is recorded
        once in `failures` and the function runs eagerly from then on (the same numbers, slower)."""
        if name in self.failures:
            return EAGER[name](*args)
        if args[0].dim() >= 2 and args[0].shape[0] > 1:
            # one kernel for every batch of 2 rows or more: the batch axis symbolic, every other axis
            # (what the reductions run over) fixed
            for a in args:
                if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == args[0].shape[0]:
                    torch._dynamo.maybe_mark_dynamic(a, 0)
        try:
            return compiled(name)(*args)
        except Exception as err:  # noqa: BLE001 - any compiler failure: fall back, say so
            if _capturing():
                raise  # never inside a graph capture (the decoder's warm-up step compiles before it)
            self.failures[name] = _why(err)
            return EAGER[name](*args)

    def _gemv(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` of gemv.py, or None once its kernels have failed here (or are switched off)."""
        if "gemv" in self.failures or not self.use_gemv:
            return None
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - a Triton that cannot compile or launch here
            if _capturing():
                raise  # never inside a graph capture (the decoder's warm-up step launches them first)
            self.failures["gemv"] = _why(err)
            return None

    def group_product(self, key: torch.Tensor, x: torch.Tensor, weights: list[torch.Tensor],
                      members: tuple[torch.nn.Module, ...] = ()) -> torch.Tensor | None:
        """`x @ weights[0].T` in one gemv.py launch with the other weights' products, each kept for its
        module in `members` (their own calls, with input `key`, take it); None where the launch cannot
        run. `x` is `key` itself for plain linears, its quantized copy for leanfp8.py's FP8 ones."""
        if not gemv.usable(x, weights) or (outs := self._gemv(gemv.grouped, x, weights)) is None:
            return None
        for m, out in zip(members, outs[1:]):
            self._kept[id(m)] = (key, out)
        return outs[0]

    def _take(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        kept = self._kept.pop(id(module), None)
        return kept[1] if kept is not None and kept[0] is x else None

    def _rms(self, m: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._call("rms", hidden_states, m.weight, float(m.variance_epsilon))

    def _mlp(self, m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        g, u = m.gate_proj, m.up_proj
        if (_plain(g) and _plain(u) and g.weight.shape == u.weight.shape and gemv.usable(x, [g.weight, u.weight])
                and (h := self._gemv(gemv.gate_up_silu, x, g.weight, u.weight)) is not None):
            return m.down_proj(h)  # gate, up and SiLU·mul in one kernel
        lean = g.__dict__.get(LEAN_GATE_UP)  # FP8 gate/up with one input scale (leanfp8.py): one quantizer, one kernel
        if (lean is not None and gemv.usable(x, [lean[1], lean[2]])
                and (h := self._gemv(gemv.gate_up_silu, lean[0](x), lean[1], lean[2])) is not None):
            return m.down_proj(h)
        return m.down_proj(self._call("silu_mul", g(x), u(x)))

    def _linear(self, m: torch.nn.Module, lean_forward: Any, x: torch.Tensor) -> torch.Tensor:
        """A plain linear's product (or a lean FP8 linear's, after its quantizer) through gemv.py where it
        can run; q/k/v (and an FP8 group, leanfp8._group) in one launch, k's and v's outputs kept for
        their own calls with the same input."""
        if (kept := self._take(m, x)) is not None:
            return kept
        if lean_forward is None:
            group = self._qkv.get(id(m))
            out = self.group_product(x, x, [p.weight for p in group], group[1:]) if group is not None else None
            if out is None:
                out = self.group_product(x, x, [m.weight])
            return F.linear(x, m.weight) if out is None else out
        quant, scale, weight, bias = lean_forward.lean
        if bias is not None or x.numel() == 0 or (x.device.type != "cpu" and x.device != scale.device):
            return lean_forward(x)
        qx = quant(x)
        group = m.__dict__.get(LEAN_QKV)
        out = self.group_product(x, qx, list(group[2:]), group[:2]) if group is not None else None
        if out is None:
            out = self.group_product(x, qx, [weight])
        return F.linear(qx, weight, bias) if out is None else out

    def _attention(self, m: torch.nn.Module, hidden_states: torch.Tensor, position_embeddings: Any = None,
                   attention_mask: torch.Tensor | None = None, past_key_values: Any = None, **kwargs: Any) -> Any:
        """transformers' LlamaAttention.forward (eval mode), its rotary embedding fused; the attention
        itself is the runtime's (the model's implementation, decode_attention.NAME)."""
        shape = (*hidden_states.shape[:-1], -1, m.head_dim)
        q = m.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = m.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = m.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = self._call("rope", q, k, cos, sin, 1)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, m.layer_idx)
        out, weights = decode_attention.attention(m, q, k, v, attention_mask, dropout=0.0, scaling=m.scaling, **kwargs)
        return m.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights

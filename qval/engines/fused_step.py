"""The static decoder's element-wise work fused: RMSNorm, rotary embedding, SiLU·mul.

A decode step of an 8B Llama on the H200 spends ~2.6 ms (a third of the step) in ~1,300 small
element-wise kernels (RESULTS.md §14): transformers' RMSNorm is eight kernels (cast, square, mean,
add, rsqrt, multiply, cast, scale), the rotary embedding ten (two products, a negation and a
concatenation per tensor, the sums), the MLP's SiLU·mul two. Here each is one `torch.compile`d
(inductor) function, compiled once for one row and once for any other batch size (the batch axis
symbolic, every other axis fixed: a decode step has the same shapes at every length, so a gate
compiles each at most twice), and called inside `StaticDecoder`'s own CUDA graph capture, so the
graph replays the fused kernels. At 1 to 16 rows the products too: every bias-free `nn.Linear` goes to
gemv.py's Triton kernels, q/k/v in one launch (`_QKV` names the group on the q projection; the k and
v projections' own calls take the outputs it left), gate/up with SiLU·mul in one (RESULTS.md §14.3,
§14.4); the FP8 candidate's lean linears the same way behind one quantized input (leanfp8.py).

`install(model)` wraps only code it recognises: the `forward` of an RMSNorm class whose source is
transformers' Llama RMSNorm (the same source in Llama, Mistral, Qwen2/3 and their modular copies),
of an MLP class whose source is Llama's (fused only with `hidden_act: silu`), and the
`apply_rotary_pos_emb` of a modelling module whose source is Llama's. Anything else keeps its eager
code. The wrappers sit on the class, not the instance (an instance-bound wrapper survives a deep
copy pointing at the original module's forward: a candidate copied from the reference would run the
reference's MLP). They call the fused function only within `active()` on the thread that entered it
(the decoding one: qval's concurrent engines run another model's prefill or teacher-forced pass on
another thread), and transformers' own code everywhere else, so the prefill, the gates'
teacher-forced passes and every CPU figure are untouched.

Numerics: the same operations in the same precisions as transformers' code; inductor is told to
round every intermediate to its tensor's dtype where eager rounds (`emulate_precision_casts`; by
default it keeps a bfloat16 chain in float32 and rounds once). The rotary and SiLU·mul kernels
then give the eager numbers bit for bit; the RMSNorm's mean sums in another order than ATen's
kernel (float32, ~1 ulp apart), which the cast back to bfloat16/float16 absorbs except at a
rounding tie. On this CPU the fused step's bfloat16 logits equal the eager step's exactly
(tests/engines/test_fused_step.py); a last-bit difference can still move a near-tied greedy token:
`benchmarks/h200_issue15.py` compares the fused decoder's tokens with the unfused one's and the
plain path's on the GPU.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from . import gemv

use_gemv = True  # steps of ≤ 16 rows through gemv.py's kernels (benchmarks switch it off to measure without)
_QKV = "_qval_qkv"  # on a q projection: (q, k, v), the three products of one input, for one GEMV launch
LEAN_GATE_UP = "_qval_lean_gate_up"  # on an FP8 gate projection (leanfp8._group): (its quantizer, gate weight, up weight)
_state = threading.local()  # .on: this thread's decode step runs the fused functions
_compiled: dict[str, Callable[..., Any]] = {}
_failed: dict[str, str] = {}  # name -> why its compiled form could not run (it runs eagerly since)
_lock = threading.Lock()


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


def _call(name: str, eager: Callable[..., Any], *args: Any) -> Any:
    """`eager(*args)` through its compiled form (compiled on first call, once per shape). A
    compiler that cannot run here (no C compiler, no Triton) is recorded once in `failures()` and
    the function runs eagerly from then on: slower, the same numbers as transformers' code."""
    if name in _failed:
        return eager(*args)
    with _lock:
        if name not in _compiled:
            # emulate_precision_casts: round each intermediate to the tensor's dtype where eager does
            # (inductor otherwise keeps a bfloat16 chain in float32): the eager step's numbers
            _compiled[name] = torch.compile(eager, dynamic=False, fullgraph=True, options={"emulate_precision_casts": True})
    if args[0].dim() >= 2 and args[0].shape[0] > 1:
        # one kernel for every batch of 2 rows or more (gate 2 decodes 40 rows, gate 3 8): the batch
        # axis symbolic, every other axis (what the reductions run over) fixed as before
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[0] == args[0].shape[0]:
                torch._dynamo.maybe_mark_dynamic(a, 0)
    try:
        return _compiled[name](*args)
    except Exception as err:  # noqa: BLE001 - any compiler failure: fall back, say so
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise  # never inside a graph capture (the decoder's warm-up step compiles before it)
        _failed[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
        return eager(*args)


def failures() -> dict[str, str]:
    """The fused functions that could not be compiled here, and why."""
    return dict(_failed)


def _source(fn: Any) -> str | None:
    try:
        return inspect.getsource(fn).split("\n", 1)[1] if fn is not None else None  # without the def line
    except (OSError, TypeError, IndexError):
        return None


def _reference_sources() -> dict[str, str | None]:
    from transformers.models.llama import modeling_llama as ml

    def own(f: Any) -> Any:  # transformers' code, under a wrapper of ours if there is one
        return getattr(f, "qval_fused_eager", None) or f

    rope = own(ml.apply_rotary_pos_emb)
    return {"norm": _source(own(ml.LlamaRMSNorm.forward)), "mlp": _source(own(ml.LlamaMLP.forward)),
            "rope": _source(getattr(rope, "__wrapped__", rope))}


def is_on() -> bool:
    return bool(getattr(_state, "on", False))


def _norm_forward(eager: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        if is_on():
            return _call("rms", _eager_rms, hidden_states, self.weight, float(self.variance_epsilon))
        return eager(self, hidden_states)

    return forward


def _plain(m: Any) -> bool:
    """A bias-free `nn.Linear` itself (a quantized subclass keeps its own forward)."""
    return type(m) is torch.nn.Linear and m.bias is None


def _gemv(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` of gemv.py, or None once its kernels have failed here (recorded in `failures()`,
    the caller's own product from then on)."""
    if "gemv" in _failed or not use_gemv:
        return None
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - a Triton that cannot compile or launch here
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise  # never inside a graph capture (the decoder's warm-up step launches them first)
        _failed["gemv"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
        return None


def group_product(key: torch.Tensor, x: torch.Tensor, weights: list[torch.Tensor],
                  members: tuple[torch.nn.Module, ...] = ()) -> torch.Tensor | None:
    """`x @ weights[0].T` in one gemv.py launch with the other weights' products, each kept for its
    module in `members` (their own calls, with input `key`, take it: q/k/v in one launch); None
    where the launch cannot run (the caller's own product then). `x` is `key` itself for plain
    linears, its quantized copy for leanfp8.py's FP8 ones."""
    if not gemv.usable(x, weights) or (outs := _gemv(gemv.grouped, x, weights)) is None:
        return None
    for m, out in zip(members, outs[1:]):
        keep(m, key, out)
    return outs[0]


def keep(module: torch.nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
    """`module`'s output for input `x`, computed by another launch of this step (q/k/v in one)."""
    _state.__dict__.setdefault("stash", {})[id(module)] = (x, out)


def take(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The output `keep` left for `module` and this very input, once; None if there is none."""
    kept = _state.__dict__.setdefault("stash", {}).pop(id(module), None)
    return kept[1] if kept is not None and kept[0] is x else None


def _mlp_forward(eager: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if is_on() and str(getattr(self.config, "hidden_act", "")) == "silu":
            g, u = self.gate_proj, self.up_proj
            if (_plain(g) and _plain(u) and g.weight.shape == u.weight.shape and gemv.usable(x, [g.weight, u.weight])
                    and (h := _gemv(gemv.gate_up_silu, x, g.weight, u.weight)) is not None):
                return self.down_proj(h)  # gate, up and SiLU·mul in one kernel
            lean = g.__dict__.get(LEAN_GATE_UP)  # FP8 gate/up with one input scale (leanfp8.py): one quantizer, one kernel
            if (lean is not None and gemv.usable(x, [lean[1], lean[2]])
                    and (h := _gemv(gemv.gate_up_silu, lean[0](x), lean[1], lean[2])) is not None):
                return self.down_proj(h)
            return self.down_proj(_call("silu_mul", _eager_silu_mul, g(x), u(x)))
        return eager(self, x)

    return forward


def _linear_forward(eager: Callable[..., Any]) -> Callable[..., Any]:
    """`nn.Linear.forward` within a step of ≤ 16 rows: gemv.py's kernel; q/k/v (`_QKV` on the first of
    them) in one launch, the second and third's outputs kept for their own calls with the same input."""

    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not is_on() or not _plain(self):
            return eager(self, x)
        kept = take(self, x)
        if kept is not None:
            return kept
        group = self.__dict__.get(_QKV)
        out = None
        if group is not None and all(_plain(m) for m in group):
            out = group_product(x, x, [m.weight for m in group], group[1:])
        if out is None:
            out = group_product(x, x, [self.weight])
        return eager(self, x) if out is None else out

    return forward


def _rope_wrapper(eager: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                             unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        if is_on():
            return _call("rope", _eager_rope, q, k, cos, sin, unsqueeze_dim)
        return eager(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    return apply_rotary_pos_emb


def _patch(owner: Any, name: str, wrapper: Callable[..., Any], eager: Callable[..., Any]) -> None:
    wrapper.qval_fused_eager = eager  # type: ignore[attr-defined]
    with _lock:
        if getattr(getattr(owner, name), "qval_fused_eager", None) is None:
            setattr(owner, name, wrapper)


def install(model: torch.nn.Module) -> dict[str, int]:
    """Wrap the recognised code of `model`'s modules (idempotent); how many modules of each kind
    run it. The wrappers sit on the classes (and the rotary function on its module), never on an
    instance: a model copied after this (a candidate built from a deep copy of the reference)
    runs its own weights, and outside `active()` every call is transformers' own code."""
    ref = _reference_sources()
    counts = {"rmsnorm": 0, "mlp": 0, "rope_modules": 0, "qkv_groups": 0}
    silu = str(getattr(model.config, "hidden_act", "")) == "silu"
    kinds: dict[type, str | None] = {}  # class -> "rmsnorm" / "mlp" / None, its source read once
    for module in model.modules():
        cls = type(module)
        if cls not in kinds:
            fwd = getattr(cls.forward, "qval_fused_eager", None) or cls.forward
            src, kinds[cls] = _source(fwd), None
            if ref["norm"] is not None and hasattr(module, "variance_epsilon") and src == ref["norm"]:
                kinds[cls] = "rmsnorm"
                _patch(cls, "forward", _norm_forward(fwd), fwd)
            elif silu and ref["mlp"] is not None and src == ref["mlp"]:
                kinds[cls] = "mlp"
                _patch(cls, "forward", _mlp_forward(fwd), fwd)
        if kinds[cls] is not None:
            counts[kinds[cls]] += 1
    _patch(torch.nn.Linear, "forward", _linear_forward(torch.nn.Linear.forward), torch.nn.Linear.forward)
    for module in model.modules():
        group = tuple(getattr(module, n, None) for n in ("q_proj", "k_proj", "v_proj"))
        if all(_plain(m) for m in group) and len({m.in_features for m in group}) == 1:  # type: ignore[union-attr]
            module.q_proj.__dict__[_QKV] = group  # type: ignore[union-attr]
            counts["qkv_groups"] += 1
    for name in sorted({cls.__module__ for cls in kinds}):
        mod = sys.modules.get(name)
        rope = getattr(mod, "apply_rotary_pos_emb", None) if mod is not None else None
        if rope is None:
            continue
        eager = getattr(rope, "qval_fused_eager", None) or rope
        if ref["rope"] is not None and _source(getattr(eager, "__wrapped__", eager)) == ref["rope"]:
            _patch(mod, "apply_rotary_pos_emb", _rope_wrapper(eager), eager)
            counts["rope_modules"] += 1
    return counts


@contextmanager
def active(on: bool = True) -> Iterator[None]:
    """Within, on this thread: the wrapped modules run their fused functions."""
    before = is_on()
    _state.on = on
    try:
        yield
    finally:
        _state.on = before
        _state.__dict__.pop("stash", None)  # q/k/v outputs not yet taken (a step that raised)

"""Per-quantizer scale diagnostics of a calibrated (unfolded) candidate: one row per enabled quantizer.

Weights are measured directly: the weight goes through its own quantizer once. Activations
(input, KV-cache and attention quantizers) are measured by forward hooks while the candidate
runs a few calibration batches: each hook sees the quantizer's input and its output, so the
figures are those of the deployed arithmetic, pre_quant_scale included. The candidate comes
unfolded (a folded weight quantizer is switched off and could not be measured); its weights are
folded here only for the duration of the activation passes, and put back.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..quantize.modelopt_adapter import QuantizerState, quantizer_state
from ..report.diagnostics_csv import COLUMNS  # layers.csv's columns: every row has each of them
from .folding import FoldedWeights
from .stats import AbsStats


_KINDS = {"weight_quantizer": "weight", "input_quantizer": "input", "output_quantizer": "output",
          "k_bmm_quantizer": "kv", "v_bmm_quantizer": "kv", "q_bmm_quantizer": "attention", "p_bmm_quantizer": "attention"}
#: values per batch and quantizer that feed the p99.9 histogram (counts, SQNR, clipping use all)
ACTIVATION_SAMPLE = 1 << 16
WEIGHT_SAMPLE = 1 << 18
_UNIT = re.compile(r"^(?P<unit>.*?\.\d+)\.(?P<rest>.+)$")


def split_name(name: str) -> tuple[str, str, str]:
    """Quantizer module name -> (unit, part, kind). A unit is a decoder layer (the path up to the
    first numeric component) or, outside numbered layers, the quantized module itself.

    >>> split_name("model.layers.5.mlp.down_proj.weight_quantizer")
    ('model.layers.5', 'mlp.down_proj', 'weight')
    >>> split_name("model.layers.0.self_attn.k_bmm_quantizer")
    ('model.layers.0', 'self_attn.k_bmm', 'kv')
    >>> split_name("lm_head.input_quantizer")
    ('lm_head', 'lm_head', 'input')
    """
    module, _, leaf = name.rpartition(".")
    kind = _KINDS.get(leaf, "other")
    m = _UNIT.match(name)
    if m is None:
        return module or leaf, module or leaf, kind
    rest = m["rest"]
    part = rest.rpartition(".")[0] if leaf in ("weight_quantizer", "input_quantizer", "output_quantizer") else rest.removesuffix("_quantizer")
    return m["unit"], part, kind


def unit_glob(unit: str) -> str:
    """The quant.exclude glob that keeps one unit in high precision (it must not catch
    layers.50 when excluding layers.5, hence the dot).

    >>> unit_glob("model.layers.5")
    '*model.layers.5.*'
    """
    return f"*{unit}.*"


def format_name(qz: QuantizerState) -> str:
    """E4M3 / E2M1 for floats, INT8 / UINT4 … for integers."""
    bits = qz.num_bits
    if isinstance(bits, (tuple, list)):
        e, m = bits
        return f"FP{e + m + 1} E{e}M{m}"
    return f"{'U' if qz.unsigned else ''}INT{bits}"


def granularity(qz: QuantizerState) -> str:
    bs = qz.block_sizes
    if bs:
        sizes = ",".join(f"{k}:{v}" for k, v in bs.items() if isinstance(k, int))
        extra = " dynamic" if bs.get("type") == "dynamic" else ""
        scale = bs.get("scale_bits")
        return f"block {sizes}{extra}" + (f" scale {scale}" if scale else "")
    if qz.axis is None:
        return "per-tensor"
    return f"per-channel axis {qz.axis}"


def _amax(qz: QuantizerState) -> torch.Tensor | None:
    # None for dynamic quantizers, which have no fixed amax
    return None if qz.amax is None else qz.amax.detach().float().cpu()


def base_row(name: str, qz: QuantizerState) -> dict[str, Any]:
    unit, part, kind = split_name(name)
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(quantizer=name, unit=unit, part=part, kind=kind, format=format_name(qz), granularity=granularity(qz), flags="")
    amax = _amax(qz)
    maxbound = qz.maxbound  # None for grids without a single largest value (e.g. MX)
    row["maxbound"] = maxbound
    if amax is not None:
        row.update(groups=amax.numel(), amax_max=float(amax.max()), amax_mean=float(amax.mean()))
        if maxbound:
            row.update(scale_max=float(amax.max()) / maxbound, scale_mean=float(amax.mean()) / maxbound)
    pqs = qz.pre_quant_scale
    if pqs is not None:
        p = pqs.detach().float().cpu()
        row.update(pqs_min=float(p.min()), pqs_max=float(p.max()), pqs_mean=float(p.mean()),
                   pqs_spread=float(p.max() / p.min()) if float(p.min()) > 0 else math.inf)
    return row


def block_size(qz: QuantizerState, x: torch.Tensor) -> int | None:
    """The quantizer's block size along x's last axis, if it quantizes in blocks."""
    bs = qz.block_sizes or {}
    size = bs.get(-1, bs.get(x.dim() - 1))
    return int(size) if isinstance(size, int) else None


def _effective_input(qz: QuantizerState, x: torch.Tensor) -> torch.Tensor:
    """What the quantizer grid sees: the input after SmoothQuant/AWQ smoothing."""
    pqs = qz.pre_quant_scale
    return x if pqs is None else x * pqs.to(x.device, x.dtype)


@torch.no_grad()
def collect(model: torch.nn.Module, quantizers: Iterable[tuple[str, Any]], batches: list[torch.Tensor], device: str,
            on_batch: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """One row per enabled quantizer, weights measured directly, activations over `batches`."""
    enabled = {name: qz for name, qz in quantizers if qz.is_enabled}
    folded = FoldedWeights(model, enabled)  # each weight quantized once: measured here, reused below
    rows: dict[str, dict[str, Any]] = {}
    acc: dict[str, AbsStats] = {}
    hooks = []
    for name, qz in enabled.items():
        st = quantizer_state(qz)  # read once: calibrated, its state does not change while it is measured
        rows[name] = base_row(name, st)
        acc[name] = AbsStats()
        if rows[name]["kind"] == "weight":
            weight = model.get_submodule(name.rpartition(".")[0]).weight
            rows[name]["numel"] = weight.numel()
            q = folded.entries[name].quantized if name in folded.entries else qz(weight)
            acc[name].add(_effective_input(st, weight), q, _amax(st), sample=WEIGHT_SAMPLE, block=block_size(st, weight))
        else:
            hooks.append(qz.register_forward_hook(_hook(acc[name], st)))
    try:
        with folded:
            for i, batch in enumerate(batches):
                model(input_ids=batch.to(device), use_cache=False)
                if on_batch is not None:
                    on_batch(i)
    finally:
        for h in hooks:
            h.remove()
    for name, row in rows.items():
        if acc[name].n:
            row.update(acc[name].summary())
    return list(rows.values())


def _hook(stats: AbsStats, st: QuantizerState) -> Callable[..., None]:
    amax = _amax(st)

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        x = args[0]
        if isinstance(x, torch.Tensor) and isinstance(output, torch.Tensor) and x.numel():
            stats.add(_effective_input(st, x), output, amax, sample=ACTIVATION_SAMPLE, block=block_size(st, x))

    return hook


@dataclass(frozen=True)
class Rule:
    """One written-down outlier rule; `test(row, context)` says whether a row breaks it."""

    id: str
    text: str
    test: Callable[[dict[str, Any], dict[str, float]], bool]


def _num(x: Any) -> float:
    return math.nan if x is None else float(x)


SQNR_MARGIN_DB = 10.0
def _peer(r: dict[str, Any], c: dict[str, float], column: str) -> float:
    """The median of `column` over quantizers of the same kind and format (NaN when none)."""
    return c.get(f"{column}|{r['kind']}|{r['format']}", math.nan)


RULES: tuple[Rule, ...] = (
    Rule("low_sqnr", f"SQNR more than {SQNR_MARGIN_DB:g} dB below the median of quantizers of the same kind and format "
         "in this model (a scale far off its peers, or a tensor the format cannot hold)",
         lambda r, c: _num(r["sqnr_db"]) < _peer(r, c, "sqnr_db") - SQNR_MARGIN_DB),
    Rule("clipping", "more than 0.1 % of the values lie outside ±amax and saturate",
         lambda r, c: _num(r["clipped"]) > 1e-3),
    Rule("flush", "more than 1 % of the non-zero values flushed to zero and more than twice the median of quantizers "
         "of the same kind and format (a 4-bit grid flushes many small weights by design: only a quantizer that "
         "flushes far more than its peers is flagged)",
         lambda r, c: _num(r["flushed"]) > max(0.01, 2 * _peer(r, c, "flushed"))),
    Rule("unused_range", "range use below 0.5: the largest value reaches less than half of amax, so more "
         "than half of the grid is never used (an inflated scale)",
         lambda r, c: _num(r["range_use"]) < 0.5),
    Rule("outlier", "per-tensor scale with an outlier ratio above 20 for integer formats (above 100 for float "
         "formats): 99.9 % of the values use a twentieth (a hundredth) of the range, the rest is stretched by a few "
         "outliers (per-channel and block scales adapt to each group, so the rule does not apply to them)",
         lambda r, c: r["granularity"] == "per-tensor"
         and _num(r["outlier_ratio"]) > (100.0 if r["format"].startswith("FP") else 20.0)),
    Rule("smoothing_spread", "SmoothQuant/AWQ smoothing factors spanning more than 100× (max/min): the smoothing "
         "moved much of the activation range into the weights",
         lambda r, c: _num(r["pqs_spread"]) > 100.0),
)


def apply_rules(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each row's `flags` (ids of the rules it breaks, `;`-separated); returns the flagged rows."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        for column in ("sqnr_db", "flushed"):
            v = _num(r[column])
            if math.isfinite(v):
                groups.setdefault(f"{column}|{r['kind']}|{r['format']}", []).append(v)
    medians = {k: statistics.median(v) for k, v in groups.items()}
    flagged = []
    for r in rows:
        broken = [rule.id for rule in RULES if rule.test(r, medians)]
        r["flags"] = ";".join(broken)
        if broken:
            flagged.append(r)
    return flagged


def rules_doc() -> list[dict[str, str]]:
    return [{"id": r.id, "rule": r.text} for r in RULES]

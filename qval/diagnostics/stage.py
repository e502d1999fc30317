"""The diagnostics stages of a run: `diagnose` (scale statistics → layers.csv) and `sensitivity`.

Both start from the calibrate stage's saved state restored onto a copy of the reference,
without folding weights, so every weight quantizer can still be run. Each is a cached stage
keyed by the calibration it reads and its own settings; a passing candidate under
`sensitivity: auto` skips the sensitivity ranking, which costs one slice scoring per layer.
"""

from __future__ import annotations

import copy
import csv
import fnmatch
import io
import math
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..calibration import calibration_batches
from ..data import chunk, dataset_identity, load_dataset, token_stream
from ..errors import DataError
from ..io import atomic_write_json, atomic_write_text, read_json
from ..quantize.formats import effective_weight_bits
from ..quantize.modelopt_adapter import iter_quantizers, restore_state
from . import scales, sensitivity

if TYPE_CHECKING:
    from ..stages import Stage

#: a `qval.pipeline.Session`; not imported: the pipeline runs these stages (qval.pipeline.run_gate)
Session = Any

HIGH_PRECISION_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def restore_unfolded(s: "Session", calib: "Stage") -> torch.nn.Module:
    """The calibrated candidate with its weight quantizers still live (fakequant folds them)."""
    model = restore_state(copy.deepcopy(s.reference.model), calib.path / "quant_state.pt")
    return model.eval()


def weight_budget(model: torch.nn.Module, cfg: Any) -> dict[str, Any]:
    """Parameters of every linear layer that carries a weight quantizer: per quantized module, and
    the total already kept in high precision. A fallback's effective bits are computed from it.
    Embeddings are not linear layers (no format here quantizes them); a weight tied to another
    (lm_head and the embedding in small models) counts once."""
    modules: dict[str, int] = {}
    high = 0
    seen: set[int] = set()
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        w = getattr(module, "weight", None)
        if wq is None or not isinstance(w, torch.Tensor) or isinstance(module, torch.nn.Embedding):
            continue
        if w.data_ptr() in seen:
            continue
        seen.add(w.data_ptr())
        if wq.is_enabled:
            modules[f"{name}.weight_quantizer"] = w.numel()
        else:
            high += w.numel()
    return {"bits_quantized": effective_weight_bits(cfg.quant),
            "bits_high": HIGH_PRECISION_BITS[cfg.model.dtype], "modules": modules, "high_precision_params": high}


def kept_high(budget: dict[str, Any], excluded: Sequence[str]) -> int:
    """Parameters of quantized modules that the exclude globs put back in high precision (globs
    match weight-quantizer names, as ModelOpt matches them)."""
    return sum(n for q, n in budget["modules"].items() if any(fnmatch.fnmatch(q, g) for g in excluded))


def effective_bits(budget: dict[str, Any], excluded: Sequence[str] = ()) -> float:
    """Weight bits per parameter over all linear layers once the `excluded` globs stay in high precision.

    >>> b = {"bits_quantized": 8, "bits_high": 16, "modules": {"a.weight_quantizer": 30, "b.weight_quantizer": 10},
    ...      "high_precision_params": 0}
    >>> effective_bits(b), effective_bits(b, ["*b.*"])
    (8.0, 10.0)
    """
    total = sum(budget["modules"].values()) + budget["high_precision_params"]
    if total == 0:
        return math.nan
    high = budget["high_precision_params"] + kept_high(budget, excluded)
    return ((total - high) * budget["bits_quantized"] + high * budget["bits_high"]) / total


def layers_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(scales.COLUMNS), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(r.get(k)) for k in scales.COLUMNS})
    return buf.getvalue()


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def slice_ctx(cfg: Any) -> int:
    return cfg.diagnostics.slice_ctx or cfg.gates.agreement.ctx


def slice_chunks(s: "Session") -> list[list[int]]:
    g, d = s.config.gates.agreement, s.config.diagnostics
    ds = load_dataset(g.dataset, s.config.resolve(g.dataset))
    tok = s.reference.tokenizer
    ctx = slice_ctx(s.config)
    chunks = chunk(token_stream(ds.texts(), tok, tok.eos_token_id), ctx, limit=d.slice_chunks)
    if not chunks:
        raise DataError(f"{g.dataset}: less than one chunk of {ctx} tokens for the sensitivity slice; "
                        "give more text or a smaller diagnostics.slice_ctx.")
    return chunks


def _key_inputs(s: "Session", calib: "Stage") -> dict[str, Any]:
    return {"calibration": calib.key, "model": s.reference_identity(), "versions": s.versions(), "seed": s.config.seed}


def run_diagnostics(s: "Session", calib: "Stage | None", want_sensitivity: bool) -> dict[str, Any] | None:
    """The report's `diagnostics` section (None when nothing was quantized or it is switched off)."""
    d = s.config.diagnostics
    if calib is None or not d.enabled:
        return None
    diag = s.run.stage("diagnose", {**_key_inputs(s, calib), "batches": d.batches,
                                     "calib_data": s.config.calibration.model_dump(mode="json")})
    sens = None
    if want_sensitivity:
        g = s.config.gates.agreement
        sens = s.run.stage("sensitivity", {**_key_inputs(s, calib), "chunks": d.slice_chunks, "ctx": slice_ctx(s.config),
                                           "data": dataset_identity(g.dataset, s.config.resolve(g.dataset))})
    todo = [st for st in (diag, sens) if st is not None and not st.is_done()]
    model = restore_unfolded(s, calib) if todo else None
    if model is not None and diag in todo:
        started = diag.begin()
        torch.manual_seed(s.config.seed)
        batches = calibration_batches(s)[0][: d.batches]
        with s.progress.task("diagnose: scale statistics", len(batches)) as advance, torch.no_grad():
            rows = scales.collect(model, iter_quantizers(model), batches, s.reference.device, lambda i: advance(1))
        flagged = scales.apply_rules(rows)
        result = {"layers": rows, "rules": scales.rules_doc(), "flagged": [r["quantizer"] for r in flagged],
                  "activation_batches": len(batches), "activation_tokens": int(sum(b.numel() for b in batches)),
                  "weights": weight_budget(model, s.config)}
        atomic_write_json(diag.path / "diagnostics.json", result)
        atomic_write_text(diag.path / "layers.csv", layers_csv(rows))
        diag.finish(started, {"quantizers": len(rows), "flagged": len(flagged)})
        s.run.record(diag, cached=False)
    else:
        s.run.record(diag, cached=True)
    out = read_json(diag.path / "diagnostics.json")
    out["weights"]["effective_bits"] = effective_bits(out["weights"])
    if sens is not None:
        out["sensitivity"] = _sensitivity(s, sens, model)
    return out


def _sensitivity(s: "Session", stage: "Stage", model: torch.nn.Module | None) -> dict[str, Any]:
    if stage.is_done():
        s.run.record(stage, cached=True)
        return read_json(stage.path / "sensitivity.json")
    started = stage.begin()
    quantizers = dict(iter_quantizers(model))
    scorer = sensitivity.SliceScorer(s.ref_engine.logits, slice_chunks(s), s.reference.device,
                                     batch_size=s.config.gates.agreement.batch_size)
    with s.progress.task("sensitivity: one slice per layer and per projection", sensitivity.steps(quantizers)) as advance:
        result = sensitivity.rank(model, quantizers, scorer, on_step=advance)
    atomic_write_json(stage.path / "sensitivity.json", result)
    stage.finish(started, {"layers": len(result["layers"]), "parts": len(result["parts"])})
    s.run.record(stage, cached=False)
    return result

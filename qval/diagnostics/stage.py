"""The diagnostics stages of a run: `diagnose` (scale statistics → layers.csv) and `sensitivity`.

Both start from the calibrate stage's saved state restored onto a copy of the reference,
without folding weights, so every weight quantizer can still be run. Each is a cached stage
keyed by the calibration it reads and its own settings; a passing candidate under
`sensitivity: auto` skips the sensitivity ranking, which costs one slice scoring per layer.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from ..calibration import calibration_batches
from ..cost import effective_bits, kept_high, weight_budget  # noqa: F401  (kept_high: re-exported)
from ..data import chunk, dataset_identity, load_dataset, token_stream
from ..errors import DataError
from ..io import atomic_write_json, atomic_write_text, read_json
from ..quantize.modelopt_adapter import iter_quantizers, restore_state
from ..report.diagnostics_csv import layers_csv
from . import scales, sensitivity

if TYPE_CHECKING:
    from ..session import Session
    from ..stages import Stage


def restore_unfolded(s: "Session", calib: "Stage") -> torch.nn.Module:
    """The calibrated candidate with its weight quantizers still live (fakequant folds them). A
    sequential run (one model in memory) restores onto the reference's own weights in place, and
    the reference leaves the session: what diagnostics needs of it was taken before (`run_diagnostics`)."""
    if s.ref.sequential:
        model = s.ref.model.model
        s.ref.release("its weights carry the diagnostics' unfolded candidate now")
        return restore_state(model, calib.path / "quant_state.pt").eval()
    model = restore_state(copy.deepcopy(s.ref.model.model), calib.path / "quant_state.pt")
    return model.eval()


def slice_ctx(cfg: Any) -> int:
    return cfg.diagnostics.slice_ctx or cfg.gates.agreement.ctx


def slice_chunks(s: "Session") -> list[list[int]]:
    g, d = s.config.gates.agreement, s.config.diagnostics
    ds = load_dataset(g.dataset, s.config.resolve(g.dataset))
    tok = s.ref.tokenizer
    ctx = slice_ctx(s.config)
    chunks = chunk(token_stream(ds.texts(), tok, tok.eos_token_id), ctx, limit=d.slice_chunks)
    if not chunks:
        raise DataError(f"{g.dataset}: less than one chunk of {ctx} tokens for the sensitivity slice; "
                        "give more text or a smaller diagnostics.slice_ctx.")
    return chunks


def _key_inputs(s: "Session", calib: "Stage") -> dict[str, Any]:
    return {"calibration": calib.key, "model": s.ref.identity(), "versions": s.versions(), "seed": s.config.seed}


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
    # everything the stages need of the reference, before the candidate is restored (in a sequential
    # run onto the reference's own weights): its device, the calibration batches, the slices' logits
    device = s.ref.model.device if todo else None
    if diag in todo:
        torch.manual_seed(s.config.seed)
        # the calibration's own batches: `batch_size: auto` decided again now would follow the free
        # memory of this moment (both models, caches), and the statistics the batches they are given
        # (two runs of one gate on a GPU differed so: benchmarks/RESULTS.md §14.2)
        calibrated = (calib.meta().get("calibration") or {}).get("batch_size")
        batches = calibration_batches(s.config, s.ref.model, batch_size=calibrated)[0][: d.batches]
    scorer = _scorer(s, device) if sens is not None and sens in todo else None
    model = restore_unfolded(s, calib) if todo else None
    if model is not None and diag in todo:
        started = diag.begin()
        with s.progress.task("diagnose: scale statistics", len(batches)) as advance, torch.no_grad():
            rows = scales.collect(model, iter_quantizers(model), batches, device, lambda i: advance(1))
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
        out["sensitivity"] = _sensitivity(s, sens, model, scorer)
    return out


def _scorer(s: "Session", device: str) -> sensitivity.SliceScorer:
    """The slices' reference logits, computed now: from the model, or in a sequential run through
    the snapshot (stored compactly, without the full logits: one model in memory, and the next run
    reads them back); their KLD is then the snapshot's estimate."""
    logits = s.ref.engine.logits
    if s.ref.sequential:
        snap = s.ref.for_gates(s.run.path.parent / ".reference")
        logits = lambda x: replace(snap.logits(x), source=None)  # noqa: E731
    return sensitivity.SliceScorer(logits, slice_chunks(s), device, batch_size=s.config.gates.agreement.batch_size)


def _sensitivity(s: "Session", stage: "Stage", model: torch.nn.Module | None,
                 scorer: sensitivity.SliceScorer | None) -> dict[str, Any]:
    if stage.is_done():
        s.run.record(stage, cached=True)
        return read_json(stage.path / "sensitivity.json")
    started = stage.begin()
    quantizers = dict(iter_quantizers(model))
    with s.progress.task("sensitivity: one slice per layer and per projection", sensitivity.steps(quantizers)) as advance:
        result = sensitivity.rank(model, quantizers, scorer, on_step=advance)
    atomic_write_json(stage.path / "sensitivity.json", result)
    stage.finish(started, {"layers": len(result["layers"]), "parts": len(result["parts"])})
    s.run.record(stage, cached=False)
    return result

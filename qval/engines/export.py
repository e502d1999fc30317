"""`export`: the candidate as the deployable checkpoint, read back from its files.

The builder exports the calibrated candidate (ModelOpt's unified HF format), proves with the
fidelity check that the files hold the calibrated model, then loads the export itself: weights
decoded from their stored codes and scales, activations and KV cache quantized from the scales
stored beside them (`qval.export.reader`). The gates therefore measure the checkpoint that
ships, including what ModelOpt's export changes (rounding ties, re-smoothed shared-input layers).
The fidelity outcome is its own gate (`export_fidelity`), so a bad export is a REJECT.
"""

from __future__ import annotations

from typing import Any

from ..export.build import BuildResult, build_export, fidelity_summary
from ..export.formats import check_exportable
from ..export.reader import load_unified
from .base import BuildContext
from .hf import HFEngine
from ..backends import BACKENDS
from .runtime import Runtime, option


class ExportEngine(HFEngine):
    backend = "export"

    def __init__(self, model: Any, tokenizer: Any, build: BuildResult, facts: dict[str, Any], notes: list[str],
                 runtime: Runtime = "qval") -> None:
        super().__init__(model, tokenizer, notes=notes, runtime=runtime)
        self.build = build
        self.facts = facts

    @property
    def fidelity(self) -> dict[str, Any]:
        return self.build.fidelity

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["export"] = {"folder": str(self.build.folder), "reused": self.build.cached, "dtype": self.build.export.get("dtype"),
                       "bytes": self.build.export.get("bytes"), "files": self.build.export.get("files"),
                       "tensorrt_llm_checkpoint": self.build.export.get("tensorrt_llm_checkpoint"), **self.facts}
        d["fidelity"] = fidelity_summary(self.build.fidelity)
        return d


def load_export(ctx: BuildContext, build: BuildResult) -> ExportEngine:
    dtype = next(ctx.reference.model.parameters()).dtype
    model, facts = load_unified(build.folder, dtype, ctx.reference.device, ctx.config.model.trust_remote_code)
    t = build.fidelity.get("totals", {})
    notes = [f"weights decoded from the exported checkpoint {build.folder} ({facts['quantized_layers']} quantized layers); "
             f"activations and KV cache quantized from its stored scales with ModelOpt fake quant",
             f"fidelity check {'passed' if build.passed else 'FAILED'}: {t.get('equal', 0)} weights equal to the calibrated "
             f"model's, {t.get('ties', 0)} rounding-midpoint ties, {t.get('mismatches', 0)} mismatches"]
    changed = build.fidelity.get("changed_at_export") or []
    if changed:
        notes.append(f"ModelOpt's export re-smoothed {len(changed)} shared-input layers: the export differs from the "
                     f"calibrated fake-quant model there, and these gates measure the export")
    return ExportEngine(model, ctx.reference.tokenizer, build, facts, notes, runtime=option(ctx.config.engine))


def build_export_engine(ctx: BuildContext) -> ExportEngine:
    options = BACKENDS.get("export").options_model.model_validate(ctx.config.engine.options)  # ExportOptions (+ the runtime)
    build = build_export(ctx.config, ctx.reference, ctx.calib_state, ctx.run_dir, options, ctx.log)
    return load_export(ctx, build)



def check(cfg: Any) -> None:
    check_exportable(cfg.quant.format.value, f"{cfg.source_file or cfg.name}: engine {cfg.engine.backend}")


build_export_engine.check = check  # type: ignore[attr-defined]

"""The build stage: export the calibrated candidate into `<run>/export/` and check its fidelity.

Shared by `qval build` and the engines that run an export (`export`, `tensorrt_llm`). The
export and its fidelity report are keyed by their inputs (the calibrated state's fingerprint,
the export dtype, the TensorRT-LLM request, the library versions), so a second build or a gate
run after `qval build` reuses them instead of exporting again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..backends import ExportOptions  # noqa: F401  (declared with the backends' names; re-exported here)
from ..errors import ConfigError, StageError
from ..io import atomic_write_json, file_fingerprint, hash_json, read_json
from ..stages import versions
from .fidelity import as_exported, check_fidelity
from .hf import EXPORT_MARKER, calibrated_copy, export_checkpoint, export_dtype, is_current

if TYPE_CHECKING:
    from ..config import GateConfig
    from ..models import LoadedModel

EXPORT_FOLDER = "export"
FIDELITY_FILE = "fidelity.json"


@dataclass
class BuildResult:
    folder: Path
    export: dict[str, Any]  # qval_export.json
    fidelity: dict[str, Any]  # fidelity.json
    cached: bool

    @property
    def passed(self) -> bool:
        return bool(self.fidelity.get("passed"))


def build_export(cfg: "GateConfig", reference: "LoadedModel", calib_state: Path | None, run_dir: Path,
                 options: ExportOptions, log: Any = print) -> BuildResult:
    """Export (or reuse the export) and run (or reuse) the fidelity check."""
    import torch

    if calib_state is None or not Path(calib_state).is_file():
        raise StageError(f"{cfg.name}: building an export needs the calibrate stage's state "
                         f"({calib_state or 'none'}); quant.format {cfg.quant.format.value} has nothing calibrated to export.")
    folder = Path(run_dir) / EXPORT_FOLDER
    dtype = export_dtype(reference, options.dtype)
    key = hash_json({"calibration": file_fingerprint(Path(calib_state)), "dtype": str(dtype), "quant": cfg.quant.model_dump(mode="json"),
                     "trtllm": options.trtllm_checkpoint, "tp_size": options.tp_size, "versions": versions()})
    cached = is_current(folder, key)
    if not cached:
        log(f"build: exporting {cfg.quant.format.value} (KV cache {cfg.quant.kv_cache.value}) to {folder} …")
        export_checkpoint(reference, Path(calib_state), folder, key=key, dtype=dtype, trtllm=options.trtllm_checkpoint,
                          tp_size=options.tp_size, provenance={"config": cfg.name, "config_file": cfg.source_file,
                                                               "reference": reference.fingerprint})
    export_info = read_json(folder / EXPORT_MARKER)
    fid_path = folder / FIDELITY_FILE
    fidelity = _read_fidelity(fid_path, key)
    if fidelity is None:
        log("build: fidelity check (reading the exported tensors back) …")
        calibrated = calibrated_copy(reference, Path(calib_state))
        exported_view = as_exported(calibrated_copy(reference, Path(calib_state)))
        report = check_fidelity(folder, calibrated, exported_view, cfg.quant, dtype)
        del calibrated, exported_view
        fidelity = {"key": key, **report.to_dict()}
        atomic_write_json(fid_path, fidelity)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return BuildResult(folder=folder, export=export_info, fidelity=fidelity, cached=cached)


def _read_fidelity(path: Path, key: str) -> dict[str, Any] | None:
    try:
        d = read_json(path)
        return d if d.get("key") == key else None
    except (OSError, ValueError):
        return None


def fidelity_summary(fidelity: dict[str, Any]) -> dict[str, Any]:
    """The fidelity report without its per-layer rows (those stay in fidelity.json)."""
    return {k: v for k, v in fidelity.items() if k not in ("layers", "key")}


def options_for(cfg: "GateConfig", **overrides: Any) -> ExportOptions:
    """The config's export options (when its engine exports) with command-line overrides."""
    base = dict(cfg.engine.options) if cfg.engine.backend in ("export", "tensorrt_llm") else {}
    base = {k: v for k, v in base.items() if k in ExportOptions.model_fields}
    given = {k: v for k, v in overrides.items() if v is not None}
    base.update(given)
    try:
        return ExportOptions.model_validate(base)
    except ValidationError as err:  # the config's options were checked when it loaded: a flag is wrong
        problems = []
        for e in err.errors():
            name = str(e["loc"][0]) if e["loc"] else "options"
            flag = f"--{name.replace('_', '-')}" if name in given else f"engine.options.{name}"
            allowed = ExportOptions.model_fields[name].annotation if name in ExportOptions.model_fields else None
            choices = getattr(allowed, "__args__", None)
            hint = f"; use one of {', '.join(map(str, choices))}" if e["type"] == "literal_error" and choices else ""
            problems.append(f"{flag} {e.get('input')!r}: {e['msg']}{hint}")
        raise ConfigError(f"{cfg.source_file or cfg.name}: " + "; ".join(problems) + ".") from None

"""Calibrated candidates of the real default model, made once per test session and shared by
tests/engines and tests/export (calibration is the expensive part: seconds for FP8, minutes
for AWQ on two cores). Sized for CI: 2 samples × 64 tokens of the shipped calibration set."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from tests.conftest import ROOT, small_config

_DIR = Path(tempfile.mkdtemp(prefix="qval-test-calibrated-"))
atexit.register(shutil.rmtree, _DIR, True)
_STATES: dict[tuple[str, str], Path] = {}


def gate_config(name: str, fmt: str = "fp8", kv: str = "fp16", tokens: int = 1024, **sections: Any) -> Any:
    """A validated GateConfig sized for CI: gate 1 reads `tokens` tokens in chunks of 256; AWQ
    in blocks of 64 (576, this model's width, is not a multiple of 128 and ModelOpt cannot
    export partial blocks)."""
    from qval.config import parse_config

    data = small_config(name, fmt, kv, **sections)
    data["gates"]["agreement"] = {**data["gates"]["agreement"], "tokens": tokens, "ctx": 256}
    data["calibration"] = {**data["calibration"], "samples": 2, "seq_len": 64, "batch_size": 2}
    data.setdefault("diagnostics", {"enabled": False})
    if fmt in ("int4_awq", "w4a8_awq"):
        data["quant"] = {**data["quant"], "awq_block_size": 64}
    return parse_config(data, f"<test {name}>")


@contextlib.contextmanager
def fewer_awq_alphas() -> Iterator[None]:
    """AWQ-lite tries 11 smoothing strengths per layer; the tests need a calibrated AWQ state,
    not a good one, so they try 3 (the search itself is ModelOpt's, untouched)."""
    from qval.quantize.formats import FORMATS

    spec = FORMATS.get("int4_awq")

    def adjust(preset: Any, q: Any, alpha: Any) -> dict[str, Any]:
        cfg = spec.adjust(preset, q, alpha)
        cfg["algorithm"] = {**cfg["algorithm"], "alpha_step": 0.5}
        return cfg

    FORMATS._items["int4_awq"] = dataclasses.replace(spec, adjust=adjust)
    try:
        yield
    finally:
        FORMATS._items["int4_awq"] = spec


def calibrated_state(reference: Any, fmt: str, kv: str = "fp16") -> Path:
    """Path of the saved calibrated state (quant_state.pt) of `fmt` / `kv` on `reference`."""
    from qval.pipeline import Session, calibrate

    if (fmt, kv) not in _STATES:
        cfg = gate_config(f"calib-{fmt}-{kv}", fmt, kv)
        s = Session.open(cfg, _DIR, loaded=reference)
        with fewer_awq_alphas():
            stage = calibrate(s)
        _STATES[(fmt, kv)] = stage.path / "quant_state.pt"
    return _STATES[(fmt, kv)]


_BUILDS: dict[tuple[str, str], Any] = {}


def exported(reference: Any, fmt: str, kv: str = "fp16") -> Any:
    """The BuildResult (export folder + fidelity report) of `fmt` / `kv`, made once."""
    from qval.export.build import ExportOptions, build_export

    if (fmt, kv) not in _BUILDS:
        cfg = gate_config(f"calib-{fmt}-{kv}", fmt, kv)
        state = calibrated_state(reference, fmt, kv)
        _BUILDS[(fmt, kv)] = build_export(cfg, reference, state, state.parent.parent, ExportOptions(), log=lambda m: None)
    return _BUILDS[(fmt, kv)]


def build_context(reference: Any, cfg: Any, state: Path | None, run_dir: Path) -> Any:
    from qval.engines import BuildContext

    return BuildContext(config=cfg, reference=reference, calib_state=state, run_dir=run_dir, log=lambda m: None)


__all__ = ["ROOT", "build_context", "calibrated_state", "exported", "gate_config"]

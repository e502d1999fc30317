"""Engines: how a candidate is built and run. Each backend registers a builder here.

Builders are imported explicitly at the bottom (no package walking), so `ENGINES` is full as
soon as this package is imported; heavy libraries are imported inside the builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..registry import Registry

if TYPE_CHECKING:
    from ..config import GateConfig
    from ..models import LoadedModel
    from .base import Engine


@dataclass
class BuildContext:
    config: "GateConfig"
    reference: "LoadedModel"
    calib_state: Path | None  # the calibrate stage's saved quantizer state
    run_dir: Path
    log: Callable[[str], Any] = print


ENGINES: Registry[Callable[[BuildContext], "Engine"]] = Registry("engine backend")


def needs_calibration(backend: str) -> bool:
    """False for backends that gate a finished checkpoint (they declare `needs_calibration = False`)."""
    return getattr(ENGINES.get(backend), "needs_calibration", True)


def engine_identity(cfg: "GateConfig") -> dict[str, Any]:
    """What a backend adds to the gates' stage keys beyond its config (e.g. a checkpoint's content)."""
    identity = getattr(ENGINES.get(cfg.engine.backend), "identity", None)
    return identity(cfg) if identity else {}


def check_engine(cfg: "GateConfig") -> None:
    """Whether the backend can build a candidate of this config's format, asked before any model
    loads (a backend declares `check(cfg)`, raising a QvalError, when some formats are beyond it)."""
    check = getattr(ENGINES.get(cfg.engine.backend), "check", None)
    if check:
        check(cfg)


from . import fakequant  # noqa: E402,F401  (registers "fakequant")
from . import checkpoint, export, realquant, tensorrt_llm  # noqa: E402,F401  (register their names)

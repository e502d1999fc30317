"""The engine builders by name: `BUILDERS.get(backend)(BuildContext) -> Engine`.

The one module that imports every engine implementation (explicitly, no package walking); heavy
libraries are imported inside the builders. The names, options and capabilities are declared in
`qval.backends` (what a config is validated against, without importing this module);
importing this module fails if a declared backend has no builder here, or a builder no declaration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..registry import Registry
from . import checkpoint, export, fakequant, realquant, served_setup, tensorrt_llm
from .base import BuildContext, Engine
from ..backends import BACKENDS

if TYPE_CHECKING:
    from ..config import GateConfig

BUILDERS: Registry[Callable[[BuildContext], Engine]] = Registry("engine builder")

for _name, _builder in (
    ("fakequant", fakequant.build_fakequant),
    ("checkpoint", checkpoint.build_checkpoint),
    ("export", export.build_export_engine),
    ("realquant", realquant.build_realquant),
    ("tensorrt_llm", tensorrt_llm.build_tensorrt_llm),
    ("served", served_setup.build_served),
):
    BUILDERS.register(_name)(_builder)
del _name, _builder

if BUILDERS.names() != BACKENDS.names():
    raise RuntimeError(f"engine builders {BUILDERS.names()} and declared backends {BACKENDS.names()} differ")


def engine_identity(cfg: "GateConfig") -> dict[str, Any]:
    """What a backend adds to the gates' stage keys beyond its config (e.g. a checkpoint's content)."""
    identity = getattr(BUILDERS.get(cfg.engine.backend), "identity", None)
    return identity(cfg) if identity else {}


def check_engine(cfg: "GateConfig") -> None:
    """Whether the backend can build a candidate of this config's format, asked before any model
    loads (a backend declares `check(cfg)`, raising a QvalError, when some formats are beyond it)."""
    check = getattr(BUILDERS.get(cfg.engine.backend), "check", None)
    if check:
        check(cfg)

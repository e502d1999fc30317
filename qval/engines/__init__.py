"""Engines: how a candidate is built and run.

- `registry`: the backends' names, options models and capabilities, as data (what a config is
  validated against; it imports no engine implementation);
- `base`: the `Engine` interface and the `BuildContext` a builder receives;
- `builders`: `BUILDERS`, every backend's builder by name (it imports the implementations).

This package imports only the registry, so `import qval.config` loads no engine. `BUILDERS`,
`engine_identity`, `check_engine` and `BuildContext` are re-exported here for compatibility and
load their modules on first use; code inside qval imports them from their own modules.
"""

from __future__ import annotations

from typing import Any

from .registry import BACKENDS, needs_calibration  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in ("BUILDERS", "engine_identity", "check_engine"):
        from . import builders

        return getattr(builders, name)
    if name == "BuildContext":
        from . import base

        return base.BuildContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

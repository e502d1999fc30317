"""Engines: how a candidate is built and run.

- `registry`: the backends' names, options models and capabilities, as data: `qval.backends`
  (beside the config, which validates against it) re-exported under this package's older path;
- `base`: the `Engine` interface and the `BuildContext` a builder receives;
- `builders`: `BUILDERS`, every backend's builder by name (it imports the implementations).

This package imports only `qval.backends`; the config imports no engine module at all. `BUILDERS`,
`engine_identity`, `check_engine` and `BuildContext` are re-exported here for compatibility and
load their modules on first use; code inside qval imports them from their own modules.
"""

from __future__ import annotations

from typing import Any

from ..backends import BACKENDS, needs_calibration  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in ("BUILDERS", "engine_identity", "check_engine"):
        from . import builders

        return getattr(builders, name)
    if name == "BuildContext":
        from . import base

        return base.BuildContext
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The engine backends by name, as data: `qval.backends` (beside the config, which validates against it),
re-exported under this older path for code outside qval (tests, benchmarks, users' scripts)."""

from __future__ import annotations

from ..backends import (BACKENDS, MODEL_SOURCES, Backend, ExportEngineOptions, ExportOptions, LaunchOptions,  # noqa: F401
                        RealQuantOptions, RuntimeOptions, ServedOptions, TensorRTLLMOptions, needs_calibration,
                        serves_candidate)

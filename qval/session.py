"""One run's state as its stages see it: the config, the run folder, the reference (`RunReference`:
loaded on first use, released by a sequential run) and the candidate (`RunCandidate`: built on first
use, leaving before a sequential run's reference returns).

A stage is a function of a `Session` and the typed outputs of the stages before it: `calibrate`
returns its `Stage` (or None), `run_gates` the gates' `GateResult`s, `run_diagnostics` the report's
diagnostics section (qval.pipeline, qval.diagnostics.stage). A session is opened in one place,
`Session.open`; the stages reach the models only through `ref` and `candidate`.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import devices  # pick_device looked up at call time (tests replace it)
from .config import GateConfig
from .engines.builders import engine_identity
from .environment import environment
from .models import LoadedModel
from .progress import SILENT, Progress
from .run_reference import RunReference
from .stages import KEY_PACKAGES, RunDir, Stage


class RunCandidate:
    """The candidate of one run. `engine` is the built candidate (None until `qval.pipeline.build` builds it from
    the calibration, and after it `leave`s); its identity for the stage keys is asked once (a served engine asks its
    server); its description outlives it, so the report names the engine a sequential run released."""

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self.engine: Any = None
        self._identity: dict[str, Any] | None = None
        self._described: dict[str, Any] | None = None

    def identity(self, calib: Stage | None) -> dict[str, Any]:
        """What the gates' stage keys hold of the candidate: its quantization, the calibration it was built from,
        its engine settings and what the backend adds (a served engine: the server's model and version)."""
        if self._identity is None:
            self._identity = engine_identity(self.config)
        return {"quant": self.config.quant.model_dump(mode="json"), "calibration": calib.key if calib else None,
                "engine": self.config.engine.model_dump(mode="json"), **self._identity}

    def described(self) -> dict[str, Any] | None:
        """The engine as the report names it: None when no gate needed it built (every gate reused)."""
        return self.engine.describe() if self.engine is not None else self._described

    def leave(self) -> None:
        """A sequential run's candidate leaves memory (the reference comes back for what needed its output).
        The caller drops its own references to `engine` first (a gate's context holds one)."""
        if self.engine is None:
            return
        self._described = self.engine.describe()
        release: Callable[[], None] | None = getattr(self.engine, "release", None)
        if release is not None:
            release()
        self.engine = None

    def close(self) -> None:
        """Stop what the candidate started (a server), on every exit path of a run."""
        close: Callable[[], None] | None = getattr(self.engine, "close", None)
        if close is not None:
            close()


@dataclass
class Session:
    """One run's state shared by its stages (see the module's docstring); open one with `Session.open`."""

    config: GateConfig
    run: RunDir
    progress: Progress
    env: dict[str, Any] = field(default_factory=environment)
    #: an already loaded reference (a sweep's, an export's) and how to (re)load it (a sequential run, per phase)
    loaded: InitVar[LoadedModel | None] = None
    loader: InitVar[Callable[[], LoadedModel] | None] = None
    ref: RunReference = field(init=False)
    candidate: RunCandidate = field(init=False)

    def __post_init__(self, loaded: LoadedModel | None, loader: Callable[[], LoadedModel] | None) -> None:
        self.ref = RunReference(self.config, self.run.path, self.progress, self.versions, loaded, loader)
        self.candidate = RunCandidate(self.config)

    @classmethod
    def open(cls, cfg: GateConfig, out_dir: str | Path | None = None, progress: Progress = SILENT,
             loaded: LoadedModel | None = None, loader: Callable[[], LoadedModel] | None = None) -> "Session":
        """The session of `cfg`'s run in `out_dir/<name>` (default: its report.dir), with a reference a caller already
        holds (`loaded`) or a way to load one (`loader`), else loaded from the config on first use."""
        return cls(config=cfg, run=RunDir(Path(out_dir or cfg.report.dir), cfg.name), progress=progress,
                   loaded=loaded, loader=loader)

    @staticmethod
    def device_of(cfg: GateConfig) -> str:
        """The device the reference will compute on, without loading it."""
        return devices.pick_device(cfg.model.device)

    def versions(self) -> dict[str, Any]:
        v = self.env["versions"]  # stages.versions(), read once per run with the report's environment
        return {k: v.get(k) for k in KEY_PACKAGES}

    def close(self) -> None:
        """Stop what the candidate and the reference started (their servers), on every exit path."""
        try:
            self.candidate.close()
        finally:
            self.ref.close()

"""The reference of one run, from first use to release: the model loaded when a stage first needs it (from
the config, a caller's loader, or its server), its identity for the stage keys without loading it, the
engine the gates ask (the reference snapshot's, or the model itself), and, in a sequential run, its
release once its weights are consumed, keeping what the gates read besides its outputs (its tokenizer,
its description).

`pipeline.Session` holds one; the stages reach the reference only through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from . import determinism, devices
from . import model_location  # locate looked up at call time (tests replace model_location.locate)
from .config import GateConfig
from .engines.hf import HFEngine
from .engines.served_reference import fingerprint as served_fingerprint, load_served_reference
from .io import atomic_write_json, read_json
from .memory import free_memory
from .models import LoadedModel, load_model
from .progress import Progress
from .report import schema
from .snapshot.engine import LiveReference, SnapshotReference, StoredReference
from .snapshot.store import SnapshotStore


class RunReference:
    """The reference model of one run (`model`), loaded on first use; `loaded` is one a caller already holds
    (a sweep's), `loader` how to load it each time a sequential run needs it back."""

    def __init__(self, config: GateConfig, run_path: Path, progress: Progress, versions: Callable[[], dict[str, Any]],
                 loaded: LoadedModel | None = None, loader: Callable[[], LoadedModel] | None = None) -> None:
        self.config, self.run_path, self.progress, self._versions = config, run_path, progress, versions
        self._model, self.loader = loaded, loader
        self._engine: Any = None
        self._snapshot: StoredReference | None = None
        self._tokenizer: Any = None  # kept when the model leaves memory (a sequential run)
        self._described: dict[str, Any] | None = None  # likewise its description
        self._served_fingerprint: str | None = None  # a served reference's identity, asked of its server once

    # --- what the run is -----------------------------------------------------------------------------

    @property
    def served(self) -> bool:
        """The reference is served (model.source: served): no weights here, no snapshot."""
        return self.config.model.source == "served"

    @property
    def sequential(self) -> bool:
        """One model in memory at a time (snapshot.sequential): the reference leaves once its weights are consumed."""
        return self.config.snapshot.enabled and self.config.snapshot.sequential and not self.served

    @property
    def in_memory(self) -> bool:
        return self._model is not None

    # --- the model ------------------------------------------------------------------------------------

    @property
    def model(self) -> LoadedModel:
        """The loaded reference (loaded now if it is not in memory)."""
        if self._model is None:
            self.progress.log(f"loading reference model ({self.config.model.source}) …")
            if self.served:  # its identity, asked of its server once for the stage keys, goes with it
                fp = self.identity()["fingerprint"]
                self._model = load_served_reference(self.config, self.run_path, self.progress.log, fp)  # type: ignore[assignment]
            else:
                self._model = self.loader() if self.loader is not None else load_model(self.config.model)
            self._tokenizer = self._model.tokenizer
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer if self._tokenizer is not None else self.model.tokenizer

    @property
    def fingerprint(self) -> str:
        """The reference's fingerprint, without reloading it once a sequential run released it."""
        if self._model is not None:
            return self._model.fingerprint
        if self._described is not None:
            return str(self._described["fingerprint"])
        return self.model.fingerprint

    def described(self) -> dict[str, Any]:
        """The reference's description, without reloading a reference a sequential run released."""
        if self._model is None and self._described is not None:
            return dict(self._described)
        return self.model.describe()

    def release(self, why: str) -> None:
        """A sequential run's reference leaves memory (its weights consumed by calibration or the candidate, or
        no longer needed): what the gates read besides its outputs is kept."""
        if self._model is not None:
            self._described = self._model.describe()
        self._model = None
        self._engine = None
        if self._snapshot is not None:
            self._snapshot.detach()
        free_memory()
        self.progress.log(f"reference released ({why})")

    def close(self) -> None:
        """Stop what the reference started (a launched server); a model in memory has nothing to stop."""
        getattr(self._model, "close", lambda: None)()

    # --- its identity -----------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """Model fingerprint, compute dtype and device, without loading the model: part of every stage key."""
        m = self.config.model
        if self.served:
            self._served_fingerprint = self._served_fingerprint or served_fingerprint(self.config)
            return {"fingerprint": self._served_fingerprint, "device": "server", "dtype": "served"}
        device = devices.pick_device(m.device)
        dtype, _ = devices.compute_dtype_for(m.dtype, device)
        out = {"fingerprint": model_location.locate(m)[3], "device": device, "dtype": str(dtype), "trust_remote_code": m.trust_remote_code}
        if (numerics := determinism.key(device)) is not None:  # CUDA only: a CPU run's keys are unchanged
            out["numerics"] = numerics
        return out

    # --- what the gates ask -----------------------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """The reference model as an engine (a served reference's is its own)."""
        if self._engine is None:
            self._engine = (self.model.engine if self.served  # type: ignore[attr-defined]
                            else HFEngine(self.model.model, self.model.tokenizer, notes=self.model.notes))
        return self._engine

    def snapshot_inputs(self) -> dict[str, Any]:
        """What the snapshot folder's key hashes: the reference's identity, the versions, the stored form."""
        return {"reference": self.identity(), "versions": self._versions(), "topk": self.config.snapshot.k}

    def for_gates(self, shared: Path, in_memory: bool = True) -> Any:
        """The reference engine the gates use, over the reference's store: the snapshot (the default), or, where no
        snapshot is kept (`snapshot.enabled: false`, a served reference), the engine's own logits with its
        generations stored (`LiveReference`). `in_memory` False (a sequential run's candidate phase): the
        snapshot alone, no model."""
        if self._snapshot is None:
            snap, store = self.config.snapshot, SnapshotStore(shared, self.snapshot_inputs())
            # no snapshot kept: logits straight from the engine, its generations still stored (one store, one key)
            self._snapshot = (LiveReference(self.engine, store) if not snap.enabled or self.served
                              else SnapshotReference(self.engine, store, snap.k, snap.audit))
        if in_memory and self._snapshot.real is None:
            self._snapshot.attach(self.engine)
        return self._snapshot

    def snapshot_description(self) -> dict[str, Any] | None:
        """The snapshot the gates read (`SnapshotStore.describe`), this run's use of it and what its reads verified;
        with every gate reused (none ran here), the snapshot their stage keys name, unused in this run."""
        if not self.config.snapshot.enabled or self.served:  # the store holds the generations alone: no snapshot
            return None
        snap = self._snapshot or SnapshotReference(None, SnapshotStore(self.run_path.parent / ".reference", self.snapshot_inputs()),
                                                   None, False, description={})
        return {**snap.store.describe(self.config.snapshot.topk), **snap.usage(), **snap.store.integrity()}

    # --- in the report ------------------------------------------------------------------------------------

    def report_description(self, fill: dict[str, Any] | None) -> dict[str, Any]:
        """The reference as the report names it (with its snapshot, a sequential run's fill), saved in the run
        folder. A run whose every stage was reused never loads the model; it then repeats the description saved
        by the run that did (see schema.unloaded_reference)."""
        path = self.run_path / "reference.json"
        if self._model is not None or self._described is not None:
            d = self.described()
            if (snap := self.snapshot_description()) is not None:  # its notes (entries recomputed) beside the model's
                d["snapshot"], d["notes"] = snap, [*d.get("notes", []), *snap["notes"]]
            if fill is not None:
                d["snapshot_fill"] = fill
            if self.sequential:
                d["sequential"] = True
            atomic_write_json(path, d)
            return d
        try:
            saved = read_json(path) if path.is_file() else None
        except (OSError, ValueError):
            saved = None
        return schema.unloaded_reference(saved, self.identity()["fingerprint"])

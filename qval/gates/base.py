"""What every gate is made of: the context it runs in and the spec it registers.

A gate is a pair of functions: `run(ctx) -> GateResult` measures, `thresholds(cfg, result)`
turns the config's limits (absolute, or sized from the measured noise) into `Threshold`s for
`decide`. Each gate's run module (`qval/gates/<name>/run.py`) defines its `SPEC`; `qval.gates` lists
them in `GATES`, in run order.
"""

from __future__ import annotations

import contextlib
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..data import dataset_identity, read_texts
from ..io import atomic_write

if TYPE_CHECKING:
    from ..config import GateConfig
    from ..gate_metrics import GateMetrics
    from ..engines.base import Engine
    from ..verdict import GateResult, Threshold


@dataclass
class GateContext:
    config: "GateConfig"
    reference: "Engine"
    candidate: "Engine"
    tokenizer: Any
    folder: Path  # this gate's stage folder
    _: KW_ONLY  # what follows is named at every construction site
    progress: Any = None  # qval.progress.Progress or None
    upstream: dict[str, "GateResult"] = field(default_factory=dict)


@dataclass(frozen=True)
class GateSpec:
    name: str
    run: Callable[[GateContext], "GateResult"]
    thresholds: Callable[["GateConfig", "GateResult | None"], list["Threshold"]]
    #: the config section and data files whose change invalidates this gate's stored result
    inputs: Callable[["GateConfig"], dict[str, Any]]
    enabled: Callable[["GateConfig"], bool]
    needs: tuple[str, ...] = ()  # gates whose results this one reads
    #: (config key, tokens of context one sequence needs), checked against the model's positions
    context: Callable[["GateConfig"], tuple[str, int]] | None = None
    #: reads the gate's data files without a model (tokenizer None: open and parse them; with a
    #: tokenizer: also count them against the budget); returns a shortfall note or None, raises
    #: DataError for what the gate would refuse. `qval validate` and every command's preflight run it.
    check: Callable[["GateConfig", Any], str | None] | None = None
    #: a sequential run's last phase: finishes a result the gate left "pending" (work that needs the
    #: reference and the candidate's output: the judge of its text), with the reference back in memory
    complete: Callable[[GateContext, "GateResult"], "GateResult"] | None = None


def candidate_dependent(ctx: GateContext) -> Any:
    """A context for reference calls on what the candidate produced (the snapshot counts them
    apart: no snapshot can hold them in advance); a no-op for a reference without a snapshot."""
    mark = getattr(ctx.reference, "candidate_dependent", None)
    return mark() if mark is not None else contextlib.nullcontext()


def max_positions(ctx: GateContext) -> int | None:
    """The reference model's maximum positions (its config's `max_position_embeddings`), or None
    when its engine does not say: long-context gates refuse a context the model cannot hold."""
    n = getattr(ctx.reference.model_config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None

def context_problem(spec: GateSpec, cfg: "GateConfig", limit: int | None) -> str | None:
    """Why the gate's context does not fit a model of `limit` positions, or None (it fits, or the
    limit is unknown). The gates check it when they run, the preflight before any model loads."""
    if spec.context is None or limit is None:
        return None
    key, need = spec.context(cfg)
    if need <= limit:
        return None
    return (f"{key}: {need} tokens of context do not fit the model's {limit} positions (max_position_embeddings); "
            f"use at most {limit}.")


# --- what the gates that read a data set share -----------------------------------------------------


def section_inputs(cfg: "GateConfig", section: Any, table: "GateMetrics", dataset: str) -> dict[str, Any]:
    """A gate's cache key: its config section without the limits (`table.cache_exclude()`: a new limit re-judges,
    it does not re-measure) and the data set it reads, by content (report.json's `data.<gate>`)."""
    return {"gate": section.model_dump(mode="json", exclude=table.cache_exclude()),
            "data": dataset_identity(dataset, cfg.resolve(dataset))}


def chunked_data_check(cfg: "GateConfig", dataset: str, tokenizer: Any,
                       chunks_for: Callable[["GateConfig", Any], tuple[Any, dict[str, Any]]]) -> str | None:
    """Preflight of a gate that scores chunks of a data set: without a tokenizer the data read; with it (the budget
    pass) the chunks cut, their shortfall note (None when the data covers the request)."""
    if tokenizer is None:
        read_texts(dataset, cfg.resolve(dataset))
        return None
    return chunks_for(cfg, tokenizer)[1].get("shortfall")


def save_positions(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    """The per-position figures a gate keeps (`positions.npz`, read by the gates after it and the report),
    uncompressed: per-position floats hardly compress, and zlib's time bought nothing."""

    def write(path: Any) -> None:
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    atomic_write(folder / "positions.npz", write)

"""Preflight: everything about a config that can be checked without loading a model, checked
before any model loads (`qval validate`, and the first thing `gate`, `calibrate`, `diagnose`
and `sweep` do), so a config that cannot finish fails in seconds with every problem at once.

It asks the modules that own each rule rather than restating them: the model's location
(`models.locate`), the device and the format's hardware (`models.pick_device`,
`modelopt_adapter.check_supported`), the backend's formats (`engines.check_engine`), each
gate's data files and budgets (`GateSpec.check`, the same functions the gates run), each gate's
context against the model's positions read from its config (`gates.context_problem`,
`models.max_positions_of`), and the calibration windows (`calibration.calibration_samples`).
Whatever passes here cannot fail later for the same reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import models  # its functions looked up at call time (tests replace models.locate)
from .calibration import calibration_samples
from .data import dataset_identity, read_texts
from .engines.builders import check_engine, engine_identity
from .engines.registry import needs_calibration
from .errors import QvalError
from .gates import GATES, context_problem
from .io import hash_json
from .quantize.modelopt_adapter import check_supported

if TYPE_CHECKING:
    from .config import GateConfig

T = TypeVar("T")


def calibrates(cfg: "GateConfig") -> bool:
    """Whether the run calibrates: a quantized format on a backend that builds from calibration."""
    return cfg.quant.spec.quantizes and needs_calibration(cfg.engine.backend)


def check_hardware(cfg: "GateConfig") -> None:
    """`device: cuda` without CUDA, or a format whose kernels need a GPU on a CPU run."""
    device = models.pick_device(cfg.model.device)
    if calibrates(cfg):
        check_supported(cfg.quant, device)


_TOKENIZERS: dict[str, Any] = {}


def reference_tokenizer(cfg: "GateConfig") -> Any:
    """The reference's tokenizer, the only part of the model the budget checks need. Kept per
    model (its location's fingerprint included) for the process: a GGUF tokenizer takes seconds
    to convert, and a sweep or a test session preflights many configs of one model."""
    key = hash_json([cfg.model.model_dump(mode="json"), models.locate(cfg.model)[3]])
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = models.load_tokenizer(cfg.model)
    return _TOKENIZERS[key]


def preflight(cfg: "GateConfig", count_tokens: bool = True, tokenizer: Any = None) -> list[str]:
    """Check `cfg` without loading a model; returns the shortfall notes (less data than asked for,
    within max_shortfall) and raises one QvalError listing every problem. `count_tokens` False
    skips what needs the tokenizer (the budgets), the one part that reads more than files;
    `tokenizer`: the reference's, already loaded (a sweep checks many configs of one model)."""
    problems: list[str] = []

    def attempt(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except QvalError as err:
            problems.append(str(err))
            return None

    gates = [spec for spec in GATES.ordered() if spec.enabled(cfg)]
    c = cfg.calibration
    attempt(lambda: models.locate(cfg.model))
    attempt(lambda: engine_identity(cfg))  # a checkpoint candidate's folder and weight files
    attempt(lambda: check_hardware(cfg))
    attempt(lambda: check_engine(cfg))
    if calibrates(cfg):
        attempt(lambda: read_texts(c.dataset, cfg.resolve(c.dataset)))
    else:
        attempt(lambda: dataset_identity(c.dataset, cfg.resolve(c.dataset)))
    for spec in gates:
        attempt(lambda: spec.inputs(cfg))  # every data file a gate names exists
        if spec.check is not None:
            attempt(lambda: spec.check(cfg, None))  # ... and parses, with the fields the gate reads
    limit = attempt(lambda: models.max_positions_of(cfg.model))
    problems += [p for spec in gates if (p := context_problem(spec, cfg, limit)) is not None]
    if problems:
        raise QvalError("\n".join(dict.fromkeys(problems)))
    if not count_tokens:
        return []

    notes: list[str] = []
    if tokenizer is None:
        tokenizer = attempt(lambda: reference_tokenizer(cfg))
    if tokenizer is not None:
        if calibrates(cfg):
            notes.append(attempt(lambda: calibration_samples(cfg, tokenizer)[1].get("shortfall")))
        notes += [attempt(lambda: spec.check(cfg, tokenizer)) for spec in gates if spec.check is not None]
    if problems:
        raise QvalError("\n".join(dict.fromkeys(problems)))
    return [n for n in notes if n]

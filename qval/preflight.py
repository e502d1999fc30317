"""Preflight: everything about a config that can be checked without loading a model, checked
before any model loads (`qval validate`, and the first thing `gate`, `calibrate`, `diagnose`
and `sweep` do), so a config that cannot finish fails in seconds with every problem at once.

It asks the modules that own each rule rather than restating them: at least one gate enabled
(`no_gate`, for the commands that decide), the model's location (`model_location.locate`), whether the
model needs its own code and trust_remote_code allows it (`model_location.remote_code`, from config.json
read as JSON: the preflight imports and runs none of a model's code), the device and the format's
hardware (`devices.pick_device`, `modelopt_adapter.check_supported`), the backend's formats
(`engines.check_engine`), each gate's data files and budgets (`GateSpec.check`, the same
functions the gates run), each gate's context against the model's positions read from its config
(`gates.context_problem`, `model_location.max_positions_of`), and the calibration windows
(`calibration.calibration_samples`).
Whatever passes here cannot fail later for the same reason.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import devices, model_location, models  # their functions looked up at call time (tests replace model_location.locate)
from .calibration import calibration_samples
from .data import dataset_identity, read_texts
from .engines.builders import check_engine, engine_identity
from .engines.served_reference import fingerprint as served_fingerprint
from .errors import ModelError, QvalError
from .gates import GATES
from .gates.base import context_problem
from .io import hash_json
from .quantize.modelopt_adapter import check_supported

if TYPE_CHECKING:
    from .config import GateConfig

T = TypeVar("T")


def check_hardware(cfg: "GateConfig") -> None:
    """`device: cuda` without CUDA, or a format whose kernels need a GPU on a CPU run."""
    device = devices.pick_device(cfg.model.device)
    if cfg.calibrates:
        check_supported(cfg.quant, device)


_TOKENIZERS: dict[str, Any] = {}


def reference_tokenizer(cfg: "GateConfig") -> Any:
    """The reference's tokenizer, the only part of the model the budget checks need, loaded without
    the model's own code (the preflight runs none; transformers' own tokenizer classes count the
    same tokens unless the tokenizer itself is custom code). None when only the model's own code
    can load it and trust_remote_code allows that: the gates count their budgets when they run.
    Kept per model (its location's fingerprint included) for the process: a GGUF tokenizer takes
    seconds to convert, and a sweep or a test session preflights many configs of one model."""
    key = hash_json([cfg.model.model_dump(mode="json"), model_location.locate(cfg.model)[3]])
    if key not in _TOKENIZERS:
        try:
            _TOKENIZERS[key] = models.load_tokenizer(cfg.model, run_code=False)
        except ModelError as err:
            if not cfg.model.trust_remote_code:
                raise
            print(f"qval: note: the data budgets are not counted before the run: the tokenizer loads only through the "
                  f"model's own code, which the preflight does not run ({err}); each gate counts its budget when it runs.",
                  file=sys.stderr)
            _TOKENIZERS[key] = None
    return _TOKENIZERS[key]


def no_gate(cfg: "GateConfig") -> str | None:
    """A config that enables no gate has nothing to decide an approval on (a run of it would load, calibrate
    and reject with "no gate produced a check"): a config error, said before anything loads."""
    if any(spec.enabled(cfg) for spec in GATES.ordered()):
        return None
    return (f"{cfg.source_file or 'the config'}: no gate is enabled ({', '.join(f'gates.{s.name}' for s in GATES.ordered())} "
            f"are all disabled or not given), so nothing could approve the candidate; enable at least one, e.g. "
            f"gates.agreement with min_top1: 0.9.")


def preflight(cfg: "GateConfig", count_tokens: bool = True, tokenizer: Any = None, gating: bool = True) -> list[str]:
    """Check `cfg` without loading a model or running any of its code; returns the shortfall notes
    (less data than asked for, within max_shortfall) and raises one QvalError listing every problem.
    `count_tokens` False skips what needs the tokenizer (the budgets), the one part that reads more
    than files; `tokenizer`: the reference's, already loaded (a sweep checks many configs of one
    model); `gating` False: the command decides nothing (calibrate, diagnose), so no gate is needed."""
    problems: list[str] = [p for p in [no_gate(cfg) if gating else None] if p]

    def attempt(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except QvalError as err:
            problems.append(str(err))
            return None

    gates = [spec for spec in GATES.ordered() if spec.enabled(cfg)]
    c = cfg.calibration
    attempt(lambda: model_location.locate(cfg.model))
    if note := attempt(lambda: model_location.remote_code(cfg.model)):  # from config.json as JSON: no code imported here
        print(f"qval: note: {note}", file=sys.stderr)
    attempt(lambda: engine_identity(cfg))  # a checkpoint candidate's folder and weight files
    if cfg.model.source == "served":  # a served reference's server: reachable and listing its model, or vLLM's Python runs
        attempt(lambda: served_fingerprint(cfg))
    attempt(lambda: check_hardware(cfg))
    attempt(lambda: check_engine(cfg))
    if cfg.calibrates:
        attempt(lambda: read_texts(c.dataset, cfg.resolve(c.dataset)))
    else:
        attempt(lambda: dataset_identity(c.dataset, cfg.resolve(c.dataset)))
    for spec in gates:
        attempt(lambda: spec.inputs(cfg))  # every data file a gate names exists
        if spec.check is not None:
            attempt(lambda: spec.check(cfg, None))  # ... and parses, with the fields the gate reads
    limit = attempt(lambda: model_location.max_positions_of(cfg.model))
    problems += [p for spec in gates if (p := context_problem(spec, cfg, limit)) is not None]
    if problems:
        raise QvalError("\n".join(dict.fromkeys(problems)))
    if not count_tokens:
        return []

    notes: list[str] = []
    if tokenizer is None:
        tokenizer = attempt(lambda: reference_tokenizer(cfg))
    if tokenizer is not None:
        if cfg.calibrates:
            notes.append(attempt(lambda: calibration_samples(cfg, tokenizer)[1].get("shortfall")))
        notes += [attempt(lambda: spec.check(cfg, tokenizer)) for spec in gates if spec.check is not None]
    if problems:
        raise QvalError("\n".join(dict.fromkeys(problems)))
    return [n for n in notes if n]

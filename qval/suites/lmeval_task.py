"""Gate 4's lm-evaluation-harness, reached: lm-eval imported (or an error that says what to
install: it is an optional extra, and without it a config naming an lm-eval task is an error,
exit 2), a task found by name and loaded, and lm-eval's chatter kept off the console.

Relative `data_files` / `data_dir` / `dataset_path` in a task YAML are resolved against the
YAML's folder (lm-eval hands them to `datasets`, which reads them against the working
directory); a path that does not exist there is left as written.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import BackendUnavailable, ConfigError, DataError

PIN = "0.4.13"
INSTALL = f'pip install "lm-eval=={PIN}" (in a qval checkout: pip install -e ".[lmeval]")'


def require(suite: Any) -> Any:
    """The lm_eval module, or BackendUnavailable saying what to install."""
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401
    except ImportError as err:
        raise BackendUnavailable(f"gates.tasks suite {suite.label}: lm_eval: {suite.lm_eval} needs lm-evaluation-harness, "
                                 f"which this Python cannot import ({err}); install it: {INSTALL}.") from None
    return lm_eval


def version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version as v

    try:
        return v("lm_eval")
    except PackageNotFoundError:
        return None


# --- finding and loading the task ----------------------------------------------------------------

_MANAGERS: dict[tuple[str | None, bool], Any] = {}


def task_manager(include: Path | None, defaults: bool) -> Any:
    """lm-eval's TaskManager for `include` (with or without lm-eval's own tasks), kept for the
    process: indexing lm-eval's thousands of task YAMLs takes seconds."""
    key = (str(include) if include else None, defaults)
    if key not in _MANAGERS:
        from lm_eval.tasks import TaskManager

        _MANAGERS[key] = TaskManager(include_path=str(include) if include else None, include_defaults=defaults)
    return _MANAGERS[key]


def include_folder(suite: Any, resolve: Callable[[str], Path]) -> Path | None:
    if suite.include_path is None:
        return None
    path = resolve(suite.include_path)
    if not path.is_dir():
        raise ConfigError(f"gates.tasks suite {suite.label}: include_path {suite.include_path}: no such folder "
                          f"(looked at {path}); give the folder that holds the task's YAML.")
    return path.resolve()


def find_task(suite: Any, resolve: Callable[[str], Path]) -> tuple[Any, Any]:
    """(TaskManager, its index entry) of the suite's task: under include_path first (lm-eval's own
    tasks are not indexed then), else among every task the installed lm-eval has. A name lm-eval
    does not know, or a group or tag rather than one task, is a ConfigError."""
    require(suite)
    include = include_folder(suite, resolve)
    name = suite.lm_eval
    tm = entry = None
    if include is not None:
        tm = task_manager(include, defaults=False)
        entry = tm.task_index.get(name)
    if entry is None:
        tm = task_manager(include, defaults=True)
        entry = tm.task_index.get(name)
    where = f" (lm-eval {version()}'s tasks{f' and those under {include}' if include else ''})"
    if entry is None:
        close = difflib.get_close_matches(name, tm.all_tasks, n=5, cutoff=0.6)
        hint = f" Close names: {', '.join(close)}." if close else ""
        raise ConfigError(f"gates.tasks suite {suite.label}: lm_eval: {name} is not a task lm-eval knows{where}.{hint} "
                          "`lm_eval ls tasks` lists them; a task of your own needs include_path: its folder.")
    kind = getattr(entry.kind, "name", str(entry.kind)).lower()
    if kind in ("group", "tag"):
        members = sorted(k for k, e in tm.task_index.items() if name in (getattr(e, "tags", None) or ())) if kind == "tag" \
            else [t for t in (entry.cfg or {}).get("task", []) if isinstance(t, str)]
        shown = f" ({', '.join(members[:6])}{', …' if len(members) > 6 else ''})" if members else ""
        raise ConfigError(f"gates.tasks suite {suite.label}: lm_eval: {name} is an lm-eval {kind} of tasks{shown}, not one "
                          "task; name each task as its own suite, so each is paired and gated on its own.")
    return tm, entry


def _local(value: Any, folder: Path) -> Any:
    """A relative path (or glob) that exists under `folder`, made absolute; anything else unchanged."""
    if isinstance(value, list):
        return [_local(v, folder) for v in value]
    if isinstance(value, dict):
        return {k: _local(v, folder) for k, v in value.items()}
    if not isinstance(value, str) or not value or Path(value).is_absolute() or "://" in value:
        return value
    candidate = folder / value
    return str(candidate) if candidate.exists() or glob.glob(str(candidate)) else value


def local_paths(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The task config with its local data paths resolved against its YAML's folder."""
    out = dict(cfg)
    if isinstance(cfg.get("dataset_path"), str):
        out["dataset_path"] = _local(cfg["dataset_path"], folder)
    kwargs = cfg.get("dataset_kwargs")
    if isinstance(kwargs, dict):
        out["dataset_kwargs"] = {**kwargs, **{k: _local(kwargs[k], folder) for k in ("data_files", "data_dir") if k in kwargs}}
    return out


def load_task(suite: Any, resolve: Callable[[str], Path]) -> tuple[Any, Any]:
    """(TaskManager, a freshly built lm-eval Task) for the suite; the task's data is read here."""
    tm, entry = find_task(suite, resolve)
    spec: Any = suite.lm_eval
    if entry.yaml_path is not None and getattr(entry.kind, "name", "") == "TASK":
        from lm_eval.tasks._yaml_loader import load_yaml  # the loader lm-eval's TaskManager uses

        try:
            cfg = load_yaml(entry.yaml_path, resolve_func=True)
        except Exception as err:  # noqa: BLE001 - a broken user YAML
            raise DataError(f"gates.tasks suite {suite.label}: lm-eval could not read {entry.yaml_path}: "
                            f"{type(err).__name__}: {err}") from None
        fixed = local_paths(cfg, Path(entry.yaml_path).parent)
        if fixed != cfg:
            spec = fixed
    try:
        with quiet():
            loaded = tm.load([spec])
    except Exception as err:  # noqa: BLE001 - lm-eval/datasets: a missing data file, a bad config, no hub
        where = f" ({entry.yaml_path})" if entry.yaml_path else ""
        raise DataError(f"gates.tasks suite {suite.label}: lm-eval could not load task {suite.lm_eval}{where}: "
                        f"{type(err).__name__}: {str(err).strip()[:400]}") from None
    return tm, next(iter(loaded["tasks"].values()))  # one task: find_task refused groups and tags



@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """lm-eval's and datasets' INFO/WARNING chatter and progress bars off for the call."""
    loggers = [logging.getLogger(n) for n in ("lm_eval", "datasets")]
    levels = [lg.level for lg in loggers]
    try:
        import datasets

        bars_were_off = datasets.utils.logging.is_progress_bar_enabled() is False
        datasets.utils.logging.disable_progress_bar()
    except (ImportError, AttributeError):
        datasets, bars_were_off = None, True
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        if datasets is not None and not bars_were_off:
            datasets.utils.logging.enable_progress_bar()

"""The `qval` command line: thin, with heavy imports inside each command so --help is instant.

Exit codes: 0 approve, 1 reject, 2 error (bad config, missing data or model, no GPU for a
GPU-only format). A user's mistake is one clear message, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable, Optional

import typer

EXAMPLES = """Examples:

\b
  qval gate --config checks/fp8_kvfp16.yaml       # exit 0 approve, 1 reject, 2 error
  qval validate --config checks/int8_sq.yaml       # check a config, load no model
  qval calibrate --config checks/int4_awq.yaml --out /tmp/runs
"""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="qval — the release gate for quantized LLM deployments.\n\n" + EXAMPLES,
    rich_markup_mode=None,
)

ConfigOpt = typer.Option(..., "--config", "-c", help="gate config YAML (see checks/)")
OutOpt = typer.Option(None, "--out", "-o", help="folder for run folders (default: the config's report.dir)")
QuietOpt = typer.Option(False, "--quiet", "-q", help="no progress output")


def _err(msg: str) -> None:
    print(f"qval: error: {msg}", file=sys.stderr)


def user_errors(fn: Callable[..., int]) -> Callable[..., None]:
    """Turn QvalError into a message and exit code 2; the command's own code otherwise."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        from .errors import QvalError

        try:
            code = fn(*args, **kwargs)
        except QvalError as e:
            _err(str(e))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            _err("interrupted; finished stages are kept and the next run resumes from them")
            raise typer.Exit(130) from None
        raise typer.Exit(code)

    return wrapper


def _load(config: Path):  # noqa: ANN202 - the config type is imported lazily
    from .config import load_config

    return load_config(config)


@app.command()
@user_errors
def validate(config: Path = ConfigOpt) -> int:
    """Check a config (keys, values, data files, model location) without loading a model."""
    cfg = _load(config)
    from .data import dataset_identity
    from .errors import QvalError
    from .gates import GATES
    from .models import locate

    checks = [lambda: locate(cfg.model),  # the model can be found
              lambda: dataset_identity(cfg.calibration.dataset, cfg.resolve(cfg.calibration.dataset))]
    checks += [functools.partial(spec.inputs, cfg) for spec in GATES.ordered() if spec.enabled(cfg)]  # gate data
    problems = []
    for check in checks:
        try:
            check()
        except QvalError as e:
            problems.append(str(e))
    if problems:
        raise QvalError("\n".join(dict.fromkeys(problems)))
    print(f"{config}: valid ({cfg.name}: {cfg.quant.format.value} weights, KV cache {cfg.quant.kv_cache.value}, engine {cfg.engine.backend})")
    return 0


@app.command()
@user_errors
def calibrate(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt) -> int:
    """Calibrate the candidate and save its quantizer state (reused by gate/build/diagnose)."""
    cfg = _load(config)
    from .pipeline import RunDir, Session, calibrate as run_calibration, expand_alphas
    from .progress import Progress

    for c, alpha in expand_alphas(cfg):
        s = Session(config=c, run=RunDir(Path(out or c.report.dir), c.name), progress=Progress(not quiet))
        stage = run_calibration(s, alpha)
        where = stage.path if stage else "(nothing to calibrate for format none)"
        print(f"{c.name}: calibration {'reused' if stage and s.run.log['calibrate']['cached'] else 'done'}: {where}")
    return 0


@app.command()
@user_errors
def gate(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt) -> int:
    """Calibrate, build and gate one candidate; write report.json and report.md; exit 0/1/2."""
    cfg = _load(config)
    from .pipeline import expand_alphas, run_gate
    from .progress import Progress

    runs = [run_gate(c, Progress(not quiet), out, alpha) for c, alpha in expand_alphas(cfg)]
    for r in runs:
        print_summary(r)
    if len(runs) > 1:
        passing = [r for r in runs if r.verdict.approved]
        print("\nalpha sweep: " + ", ".join(f"{r.config.name}: {'APPROVE' if r.verdict.approved else 'REJECT'}" for r in runs))
        if passing:
            best = min(passing, key=lambda r: r.report["gates"]["agreement"]["measurements"]["mean_kld"]["value"]
                       if "agreement" in r.report["gates"] else 0.0)
            print(f"recommended: {best.config.name} (passes every gate; lowest mean KLD among those that pass)")
        return 0 if passing else 1
    return runs[0].exit_code


def print_summary(r) -> None:  # noqa: ANN001
    v = r.verdict
    print(f"\n{r.config.name}: {'APPROVE' if v.approved else 'REJECT'}  ({len(v.failures)} of {len(v.checks)} checks failed)")
    for c in v.checks:
        print(f"  [{'pass' if c.outcome == 'pass' else 'FAIL'}] {c.gate}/{c.metric}: {c.reason}")
    print(f"  report: {r.run_dir / 'report.md'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""The `qval` command line: thin, with heavy imports inside each command so --help is instant.

Exit codes: 0 approve, 1 reject, 2 error (bad config, missing data or model, no GPU for a
GPU-only format). A user's mistake is one clear message, never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer

EXAMPLES = """Examples:

\b
  qval gate --config checks/fp8_kvfp16.yaml       # exit 0 approve, 1 reject, 2 error
  qval validate --config checks/int8_sq.yaml       # check a config, load no model
  qval calibrate --config checks/int4_awq.yaml --out /tmp/runs
  qval diagnose --config checks/int8_sq.yaml       # per-layer scales, sensitivity: layers.csv, diagnostics.html
  qval gate --config checks/int8_sq.yaml --fallback auto --max-excluded 4
  qval build --config checks/fp8_kvfp16.yaml       # deployable checkpoint + fidelity check: exit 0 pass, 1 fail
  qval sweep checks/*.yaml --out reports/sweep      # every candidate, one reference: ranking + recommendation
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
FailFastOpt = typer.Option(False, "--fail-fast", help="stop running gates once one rejects the candidate; the later gates "
                                                        "are reported as skipped and their checks fail (same REJECT, less time)")


def _err(msg: str) -> None:
    print(f"qval: error: {msg}", file=sys.stderr)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Library chatter (GGUF conversion bars, accelerator probes, deprecation notes) buries
    the figures a user came for; qval prints its own progress instead. Scoped to one command:
    the environment variables, warning filters and logger levels are put back when it ends
    (a command called from Python, or a test, leaves the process as it found it)."""
    import logging
    import os
    import warnings

    # before torch is imported: it imports tqdm, which reads TQDM_* once, at its own import
    # (transformers' GGUF loader draws a tqdm bar)
    defaults = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    added = [k for k in defaults if k not in os.environ]
    for k in added:
        os.environ[k] = defaults[k]
    import torch

    if not torch.cuda.is_available() and "DS_ACCELERATOR" not in os.environ:  # DeepSpeed (pulled in by some installs) warns on import
        os.environ["DS_ACCELERATOR"] = "cpu"
        added.append("DS_ACCELERATOR")
    loggers = [logging.getLogger(n) for n in ("transformers", "modelopt", "accelerate", "DeepSpeed", "torch.distributed")]
    loggers.append(logging.getLogger())
    levels = [lg.level for lg in loggers]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"(transformers|modelopt|torch|accelerate)")
            for lg in loggers:
                lg.setLevel(logging.ERROR)
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        for k in added:
            os.environ.pop(k, None)


def user_errors(fn: Callable[..., int]) -> Callable[..., None]:
    """Turn QvalError into a message and exit code 2; the command's own code otherwise. Anything
    else is a bug in qval: exit 2 too, one line on the console and the traceback in a file."""

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> None:
        import click

        from .errors import QvalError
        from .failures import crash_report, storage_message
        from .stages import forget_last_run_folder

        forget_last_run_folder()
        try:
            with quiet_libraries():
                code = fn(*args, **kwargs)
        except QvalError as e:
            _err(str(e))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            _err("interrupted; finished stages are kept and the next run resumes from them")
            raise typer.Exit(130) from None
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback on the console
            if type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA), without importing torch here
                _err(f"out of GPU memory: {str(e).splitlines()[0]} If the reference and the candidate do not fit "
                     "together, set snapshot.sequential: true in the config (one model in memory at a time); "
                     "otherwise lower the gates' batch_size.")
                raise typer.Exit(2) from None
            msg = storage_message(e) if isinstance(e, OSError) else None
            if msg is None:
                msg = (f"internal error, please report it: {type(e).__name__}: {e}. "
                       f"The traceback is saved in {crash_report(e, fn.__name__, kwargs)}; attach it to the report.")
            _err(msg)
            raise typer.Exit(2) from None
        raise typer.Exit(code)

    return wrapper


def _load(config: Path):  # noqa: ANN202 - the config type is imported lazily
    from .config import load_config

    return load_config(config)


def _checked(config: Path, gating: bool = True):  # noqa: ANN202
    """The config, loaded and preflighted (qval/preflight.py): a run that cannot finish stops here,
    before any model loads; shortfall notes go to stderr. `gating` False: a command that decides
    nothing (calibrate, diagnose) takes a config that enables no gate."""
    from .preflight import preflight

    cfg = _load(config)
    for note in preflight(cfg, gating=gating):
        print(f"qval: warning: shortfall: {note}", file=sys.stderr)
    return cfg


@app.command()
@user_errors
def validate(config: Path = ConfigOpt) -> int:
    """Check a config without loading a model or running any of its code: keys and values (types
    included: a boolean is no number), at least one gate enabled, every data file it names (parsed),
    the model's files, whether it needs its own code and trust_remote_code allows it (config.json
    read as JSON), format × backend × device, each gate's context against the model's positions,
    and the data against each budget (tokenizer only). `gate` runs the same checks first."""
    cfg = _checked(config)
    print(f"{config}: valid ({cfg.name}: {cfg.quant.format.value} weights, KV cache {cfg.quant.kv_cache.value}, engine {cfg.engine.backend})")
    return 0


@app.command()
@user_errors
def calibrate(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt) -> int:
    """Calibrate the candidate and save its quantizer state (reused by gate/build/diagnose)."""
    cfg = _checked(config, gating=False)
    from .pipeline import Session, calibrate as run_calibration, expand_alphas
    from .progress import Progress

    for c, alpha in expand_alphas(cfg):
        s = Session.open(c, out, Progress(not quiet))
        stage = run_calibration(s, alpha)
        where = stage.path if stage else "(nothing to calibrate for format none)"
        print(f"{c.name}: calibration {'reused' if stage and s.run.log['calibrate']['cached'] else 'done'}: {where}")
    return 0


@app.command()
@user_errors
def reference(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt) -> int:
    """Fill the reference snapshot for a config's gates with only the reference in memory: every later
    `qval gate` against the same reference, data and gate settings (any candidate) reads it back."""
    from .pipeline import check_fillable, fill_reference

    check_fillable(_load(config))
    cfg = _checked(config)
    from .progress import Progress

    r = fill_reference(cfg, Progress(not quiet), out)
    snap = r["snapshot"] or {}
    for name, g in r["gates"].items():
        state = g["status"] if g["status"] != "error" else f"error: {g['error']}"
        print(f"  {name:<10} {g['reference_forward_calls']:>5} reference passes computed, {g['reused_calls']:>5} read back"
              f" ({g['reference_seconds']} s){'' if state == 'ok' else ' — ' + state}")
    print(f"{cfg.name}: reference snapshot {str(snap.get('key'))[:16]} at {snap.get('path')} "
          f"({(snap.get('bytes') or 0) / 1e6:.1f} MB, created {snap.get('created')})")
    failed = [n for n, g in r["gates"].items() if g["status"] == "error"]
    if failed:
        _err(f"the reference itself failed in gate {failed[0]}: {r['gates'][failed[0]]['error']}; the snapshot is incomplete.")
        return 2
    return 0


@app.command()
@user_errors
def gate(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt,
         fallback: Optional[str] = typer.Option(None, "--fallback", metavar="auto|off",
                                                help="auto: if rejected, keep the most sensitive layers in high precision "
                                                     "step by step until every gate passes or the budget runs out "
                                                     "(default: the config's fallback.mode)"),
         max_excluded: Optional[int] = typer.Option(None, "--max-excluded",
                                                    help="fallback budget: parts (decoder layers or projection types) "
                                                         "kept in high precision"),
         max_bits: Optional[float] = typer.Option(None, "--max-bits", help="fallback budget: effective weight bits per parameter"),
         fail_fast: bool = FailFastOpt) -> int:
    """Calibrate, build and gate one candidate; write report.json/.md/.html and layers.csv; exit 0/1/2.
    With --fallback auto, exit 0 means a passing configuration was found (written as fallback.yaml)."""
    cfg = _checked(config)
    from .pipeline import expand_alphas, run_gate
    from .progress import Progress

    if _fallback_mode(cfg, fallback) == "auto":
        from .diagnostics.fallback import search

        outcome = search(cfg, Progress(not quiet), out, _budget(cfg, max_excluded, max_bits), fail_fast=fail_fast)
        print_fallback(outcome)
        return outcome.exit_code

    runs = [run_gate(c, Progress(not quiet), out, alpha, fail_fast=fail_fast) for c, alpha in expand_alphas(cfg)]
    for r in runs:
        print_summary(r)
    if len(runs) > 1:
        passing = [r for r in runs if r.verdict.approved]
        print("\nalpha sweep: " + ", ".join(f"{r.config.name}: {'APPROVE' if r.verdict.approved else 'REJECT'}" for r in runs))
        if passing:
            from .ranking import best

            chosen = runs[best(runs, "closest")]
            print(f"recommended: {chosen.config.name} (passes every gate; lowest mean KLD among those that pass)")
        return 0 if passing else 1
    return runs[0].exit_code


def _fallback_mode(cfg, flag: Optional[str]) -> str:  # noqa: ANN001
    from .errors import ConfigError

    mode = (flag or cfg.fallback.mode).lower()
    if mode not in ("auto", "off"):
        raise ConfigError(f"--fallback {flag!r}: use --fallback auto or --fallback off.")
    return mode


def _budget(cfg, max_excluded: Optional[int], max_bits: Optional[float]):  # noqa: ANN001, ANN202
    from .diagnostics.fallback import Budget
    from .errors import ConfigError

    if max_excluded is not None and max_excluded < 1:
        raise ConfigError(f"--max-excluded {max_excluded}: give at least 1 part (or --fallback off).")
    if max_bits is not None and not max_bits > 0:
        raise ConfigError(f"--max-bits {max_bits}: give a positive number of bits per weight, e.g. 9.")
    return Budget(max_excluded if max_excluded is not None else cfg.fallback.max_excluded,
                  max_bits if max_bits is not None else cfg.fallback.max_effective_bits)


def print_fallback(outcome) -> None:  # noqa: ANN001
    print_summary(outcome.start)
    for step in outcome.steps:
        print(f"  fallback step {step['step']}: keep {step['added']} in high precision -> "
              f"{'APPROVE' if step['approved'] else 'REJECT'} (effective weight bits {step['cost']['effective_bits']:.3f})")
    print(f"\nfallback: {'APPROVE' if outcome.approved else 'REJECT'}: {outcome.explanation}")
    if outcome.config_file:
        print(f"  config: {outcome.config_file}")
    print(f"  report: {outcome.final.run_dir / 'report.html'}")


@app.command()
@user_errors
def diagnose(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt) -> int:
    """Per-layer scale diagnostics and the sensitivity ranking, no gates: layers.csv, diagnostics.json
    and diagnostics.html in the run folder (a gate report holds the same section)."""
    cfg = _checked(config, gating=False)
    from .diagnostics.command import diagnose_run
    from .pipeline import expand_alphas
    from .progress import Progress

    for c, alpha in expand_alphas(cfg):
        folder, d = diagnose_run(c, Progress(not quiet), out, alpha)
        flagged = d["flagged"]
        print(f"\n{c.name}: {len(d['layers'])} quantizers diagnosed, {len(flagged)} flagged"
              + (f" ({', '.join(flagged[:5])}{', …' if len(flagged) > 5 else ''})" if flagged else ""))
        sens = d.get("sensitivity")
        if sens:
            top = ", ".join(f"{e['name']} ({e['delta_kld']['value']:.3g})" for e in sens["layers"][:5] if e.get("delta_kld"))
            print(f"  most sensitive layers (mean KLD removed when kept in high precision): {top}")
        print(f"  layers: {folder / 'layers.csv'}\n  report: {folder / 'diagnostics.html'}")
    return 0


@app.command()
@user_errors
def build(config: Path = ConfigOpt, out: Optional[str] = OutOpt, quiet: bool = QuietOpt,
          trtllm: bool = typer.Option(False, "--trtllm-checkpoint", help="also write ModelOpt's TensorRT-LLM checkpoint"),
          dtype: Optional[str] = typer.Option(None, "--dtype", metavar="auto|float16|bfloat16|float32",
                                              help="dtype of high-precision tensors (default: the engine options', else auto = "
                                                   "the dtype the reference computes in)")) -> int:
    """Export the calibrated candidate as a deployable checkpoint (<run>/export/, ModelOpt's unified HF
    format) and prove with the fidelity check that its files hold the calibrated model; exit 0 pass, 1 fail."""
    cfg = _load(config)
    from .export.build import options_for
    from .export.command import run_build
    from .pipeline import expand_alphas
    from .progress import Progress

    passed = True
    for c, alpha in expand_alphas(cfg):
        options = options_for(c, trtllm_checkpoint=trtllm or None, dtype=dtype)
        r = run_build(c, Progress(not quiet), out, alpha, options)
        passed &= r.passed
        t = r.fidelity.get("totals", {})
        print(f"\n{c.name}: export {'reused' if r.cached else 'written'}: {r.folder} "
              f"({r.export.get('dtype')}, {r.export.get('bytes', 0) / 2**20:.1f} MiB)")
        print(f"  fidelity: {'PASS' if r.passed else 'FAIL'}  ({t.get('equal', 0)} weights equal, {t.get('ties', 0)} "
              f"rounding-midpoint ties, {t.get('mismatches', 0)} mismatches)")
        for chk in r.fidelity.get("checks", []):
            mark = "pass" if chk["ok"] else ("FAIL" if chk["severity"] == "error" else "note")
            print(f"  [{mark}] {chk['name']}: {chk['detail']}")
        print(f"  report: {r.folder / 'fidelity.json'}")
    return 0 if passed else 1


@app.command()
@user_errors
def sweep(configs: list[Path] = typer.Argument(..., help="gate configs (e.g. checks/*.yaml)"), out: Optional[str] = OutOpt,
          quiet: bool = QuietOpt,
          context: int = typer.Option(4096, "--context", min=1, help="tokens per sequence for the KV-cache memory estimate"),
          batch: int = typer.Option(1, "--batch", min=1, help="sequences for the KV-cache memory estimate"),
          fail_fast: bool = FailFastOpt,
          parallel: Optional[str] = typer.Option(None, "--parallel", metavar="auto|N|cpu:N",
                                                 help="candidates at the same time: one worker per visible GPU (auto), N "
                                                      "workers over the GPUs (a model that needs several GPUs per worker), "
                                                      "or N workers on the CPU; all share one reference snapshot")) -> int:
    """Gate many candidates against one reference (loaded once; its snapshot computed once) and
    write sweep.md/sweep.json: a ranking and the smallest configuration that passes every gate.
    Exit 0 when some candidate passes, 1 when none does."""
    from .progress import Progress
    from .sweep import render, run_sweep

    result = run_sweep(list(configs), Progress(not quiet), out, context, batch, fail_fast=fail_fast, parallel=parallel)
    print("\n" + render(result))
    print(f"written: {result.folder / 'sweep.md'}")
    return result.exit_code


def print_summary(r) -> None:  # noqa: ANN001
    from .report.schema import shortfalls

    v = r.verdict
    blind = f", {len(v.uninformative)} uninformative" if v.uninformative else ""
    print(f"\n{r.config.name}: {'APPROVE' if v.approved else 'REJECT'}  ({len(v.failures)} of {len(v.checks)} checks failed{blind})")
    for note in shortfalls(r.report):
        print(f"  shortfall: {note}")
    for c in v.checks:
        print(f"  [{ {'pass': 'pass', 'uninformative': 'uninformative'}.get(c.outcome, 'FAIL') }] {c.gate}/{c.metric}: {c.reason}")
    print(f"  report: {r.run_dir / 'report.md'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

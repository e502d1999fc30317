"""`qval gate --fallback auto`: find a passing configuration by keeping the most sensitive parts
(decoder layers or projection types) in high precision, one at a time, the way Intel Neural
Compressor's accuracy-aware tuning falls back op by op.

1. A SmoothQuant alpha list is tried first (free: no extra bits): every alpha is gated, and if
   any passes, the best passing one (`ranking.best`, policy "closest": lowest mean KLD) ends the
   search; otherwise the best one (fewest failed checks, then lowest mean KLD) is the starting point.
2. The starting candidate's sensitivity ranking orders the fallback: decoder layers and
   projection types (one projection in every layer, e.g. all `mlp.down_proj`) in one list, by
   the KLD each removes; parts within one standard error of zero are left out. Step k adds the
   k-th part's glob to `quant.exclude` and runs the whole gate again with that config: a new
   calibration included, because that is what `qval gate` on the written YAML will do.
3. It stops at the first passing step, or when the budget (`max_excluded` parts, or
   `max_effective_bits` weight bits per parameter over all linear layers, `qval.cost`) would be exceeded,
   or when no ranked part is left. Either way it says why, and writes the config it ended with (fallback.yaml when
   it passes, fallback-rejected.yaml when it does not) plus fallback.json with every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import GateConfig
from ..cost import effective_bits, kept_high
from ..io import atomic_write_json, atomic_write_text
from ..pipeline import RunResult, expand_alphas, run_gate
from ..progress import SILENT, Progress
from ..ranking import best, mean_kld, or_inf
from ..report import schema, write_reports
from .sensitivity import ranking_key


@dataclass(frozen=True)
class Budget:
    max_excluded: int
    max_effective_bits: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"max_excluded": self.max_excluded, "max_effective_bits": self.max_effective_bits}


@dataclass
class FallbackOutcome:
    approved: bool
    start: RunResult  # the candidate the fallback started from
    final: RunResult  # the run the outcome rests on
    explanation: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    alphas: list[dict[str, Any]] = field(default_factory=list)
    config_file: Path | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.approved else 1


def _kld(r: RunResult) -> float:
    """Gate 1's mean KLD of a run, inf when it has none (a figure of the alphas table; the choice
    between runs is `ranking.best`)."""
    return float(or_inf(mean_kld(r.report)))


def _failures(r: RunResult) -> list[str]:
    return [f"{c.gate}/{c.metric}: {c.reason}" for c in r.verdict.failures]


def _useful(entry: dict[str, Any]) -> bool:
    """Worth a step: it removes non-finite outputs, or KLD by more than one standard error (a step
    costs a whole gate run; noise-level parts would spend the budget on nothing)."""
    d = entry.get("delta_kld")
    if entry.get("nonfinite_removed", 0) > 0:
        return True
    return d is not None and float(d["value"]) > float(d.get("stderr") or 0.0)


def candidates(sensitivity: dict[str, Any]) -> list[dict[str, Any]]:
    """Decoder layers and projection types in one list, most KLD removed first."""
    return sorted([e for e in [*sensitivity.get("layers", []), *sensitivity.get("parts", [])] if _useful(e)], key=ranking_key)


def search(cfg: GateConfig, progress: Progress = SILENT, out_dir: str | None = None, budget: Budget | None = None,
           fail_fast: bool = False) -> FallbackOutcome:
    """Run the gate with fallback; the outcome names the passing config or explains the failure.
    `fail_fast`: a run stops at the first gate that rejects (a failing step costs less; a passing
    step still runs every gate)."""
    budget = budget or Budget(cfg.fallback.max_excluded, cfg.fallback.max_effective_bits)
    candidates = expand_alphas(cfg)
    sweep = len(candidates) > 1
    runs = [(c, a, run_gate(c, progress, out_dir, a, sensitivity="never" if sweep else "always", fail_fast=fail_fast)) for c, a in candidates]
    alphas = [{"alpha": a, "name": c.name, "approved": r.verdict.approved, "failed_checks": len(r.verdict.failures),
               "mean_kld": _kld(r)} for c, a, r in runs]
    passing = [(c, a, r) for c, a, r in runs if r.verdict.approved]
    if passing:
        c, a, r = passing[best([t[2] for t in passing], "closest")]
        why = "the candidate passes every gate as configured; nothing to fall back" if not sweep else \
            f"SmoothQuant alpha {a:g} passes every gate (lowest mean KLD among the passing alphas); no fallback needed"
        return _finish(FallbackOutcome(True, r, r, why, alphas=alphas), budget, cfg_written=c if sweep else None)
    start_cfg, alpha, start = runs[best([t[2] for t in runs], "closest")]
    if sweep:  # only the chosen alpha pays for a ranking; its other stages are cached
        start = run_gate(start_cfg, progress, out_dir, alpha, sensitivity="always", fail_fast=fail_fast)
    return _part_search(start_cfg, alpha, start, progress, out_dir, budget, alphas, fail_fast)


def _part_search(cfg: GateConfig, alpha: float | None, start: RunResult, progress: Progress, out_dir: str | None,
                  budget: Budget, alphas: list[dict[str, Any]], fail_fast: bool = False) -> FallbackOutcome:
    diag = start.report.get("diagnostics") or {}
    ranking = diag.get("sensitivity")
    outcome = FallbackOutcome(False, start, start, "", alphas=alphas)
    if ranking is None:
        outcome.explanation = ("no sensitivity ranking: diagnostics are switched off or nothing is quantized "
                               "(diagnostics.enabled / quant.format), so there is nothing ranked to fall back on")
        return _finish(outcome, budget)
    weights = diag["weights"]
    units = candidates(ranking)
    if not units:
        outcome.explanation = ("keeping any single layer or projection type in high precision does not lower the KLD "
                               "on the sensitivity slice beyond its noise: the error is spread over the whole model, so "
                               "a fallback cannot fix it; try a wider format (fp8, int8) or another calibration")
        return _finish(outcome, budget)
    excluded: list[dict[str, Any]] = []
    base_bits = effective_bits(weights)
    last = start
    for entry in units:
        if len(excluded) + 1 > budget.max_excluded:
            outcome.explanation = (f"budget spent: {len(excluded)} part(s) kept in high precision (max_excluded "
                                   f"{budget.max_excluded}) and still failing: {'; '.join(_failures(last))}")
            break
        names = [e["name"] for e in excluded] + [entry["name"]]
        globs = [e["exclude"] for e in excluded] + [entry["exclude"]]
        bits = effective_bits(weights, globs)
        if budget.max_effective_bits is not None and bits > budget.max_effective_bits:
            outcome.explanation = (f"budget spent: keeping {entry['name']} too would raise the effective weight bits to "
                                   f"{bits:.3f} > max_effective_bits {budget.max_effective_bits:g}; still failing: "
                                   f"{'; '.join(_failures(last))}")
            break
        excluded.append(entry)
        k = len(excluded)
        step_cfg = cfg.model_copy(update={
            "name": f"{cfg.name}-fallback{k}",
            "quant": cfg.quant.model_copy(update={"exclude": [*cfg.quant.exclude, *(e["exclude"] for e in excluded)]}),
        })
        progress.log(f"fallback step {k}: keeping {entry['name']} in high precision (ΔKLD {entry['delta_kld']['value']:.4g})")
        last = run_gate(step_cfg, progress, out_dir, alpha, sensitivity="never", fail_fast=fail_fast)
        outcome.steps.append({
            "step": k, "name": step_cfg.name, "run_dir": str(last.run_dir), "added": entry["name"],
            "delta_kld": entry["delta_kld"], "exclude": step_cfg.quant.exclude,
            "kind": entry["kind"],
            "cost": {"excluded_parts": k, "effective_bits": bits, "base_effective_bits": base_bits,
                     "params_kept_high": kept_high(weights, globs)},
            "approved": last.verdict.approved, "failed": _failures(last),
            "checks": [c.to_dict() for c in last.verdict.checks],
        })
        outcome.final = last
        if last.verdict.approved:
            outcome.approved = True
            outcome.explanation = (f"APPROVE after keeping {k} part(s) in high precision ({', '.join(names)}); "
                                   f"effective weight bits {base_bits:.3f} → {bits:.3f}")
            break
    else:
        outcome.explanation = (f"every part whose restoration lowers the KLD ({len(units)}) was kept in high precision "
                               f"and the candidate still fails: {'; '.join(_failures(last))}")
    return _finish(outcome, budget)


def portable_config(cfg: GateConfig, new_file: Path) -> dict[str, Any]:
    """The config as a dict for a YAML written at `new_file`: relative data paths that would
    no longer resolve from there are made absolute."""
    data = cfg.model_dump(mode="json")
    moved = cfg.model_copy(update={"source_file": str(new_file)})

    def fix(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, str) and not v.startswith("hf:") and not Path(v).is_absolute():
            here = cfg.resolve(v)
            if here.is_file() and not (moved.resolve(v).is_file() and moved.resolve(v).samefile(here)):
                return str(here.resolve())
        return v

    return fix(data)


def _finish(outcome: FallbackOutcome, budget: Budget, cfg_written: GateConfig | None = None) -> FallbackOutcome:
    """Write fallback.json and the resulting YAML into the starting run's folder, and add the
    outcome to its report."""
    folder = outcome.start.run_dir
    final_cfg = cfg_written or (outcome.final.config if outcome.steps else None)
    if final_cfg is not None:
        path = folder / ("fallback.yaml" if outcome.approved else "fallback-rejected.yaml")
        verdict = "APPROVE" if outcome.approved else "REJECT"
        header = [f"# qval fallback result: {verdict}", f"# {outcome.explanation}",
                  f"# gate results: {outcome.final.run_dir / 'report.md'}"]
        if outcome.steps:
            cost = outcome.steps[-1]["cost"]
            header.append(f"# cost: {cost['excluded_parts']} part(s) in high precision, effective weight bits "
                          f"{cost['base_effective_bits']:.3f} -> {cost['effective_bits']:.3f}")
        body = yaml.safe_dump(portable_config(final_cfg, path), sort_keys=False, allow_unicode=True)
        atomic_write_text(path, "\n".join(header) + "\n" + body)
        outcome.config_file = path
    record = {"approved": outcome.approved, "explanation": outcome.explanation, "budget": budget.to_dict(),
              "start": outcome.start.config.name, "final": outcome.final.config.name,
              "final_run_dir": str(outcome.final.run_dir), "config_file": str(outcome.config_file) if outcome.config_file else None,
              "alphas": outcome.alphas, "steps": outcome.steps}
    atomic_write_json(folder / "fallback.json", record)
    report = schema.with_fallback(outcome.start.report, record)
    write_reports(folder, report)
    outcome.start.report = report
    return outcome

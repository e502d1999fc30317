"""Gate 3's table: the long generation's figures, the config fields that limit them and how a sized limit is sized."""

from __future__ import annotations

from typing import Any

from ...gate_metrics import EITHER, GateMetrics, Metric, Rate, Spread


def _eos_allowed(section: Any) -> bool:
    return not section.suppress_eos


# The first three compare the candidate with the reference (or with its own early positions): the
# only spread to size them from is the candidate's own, so a noisier candidate would get a looser
# limit. They take absolute limits, met by the 95% interval's bound, so noise makes them stricter.
LONGGEN = GateMetrics("longgen", (
    Metric("late_top1", "min_late_top1", "min",
           "top-1 agreement on the reference's continuation, last `edge` positions", hi=1.0, on="lo"),
    Metric("late_kld", "max_late_kld", "max",
           "mean KLD(ref‖cand) on the reference's continuation, last `edge` positions, nats", on="hi", sweep="late KLD"),
    Metric("late_drift", "max_late_drift", "max",
           "late mean KLD − early mean KLD, nats (error that accumulates with context)", on="hi"),
    Metric("seq_rep4_excess", "max_seq_rep4_excess", "max",
           "candidate late seq-rep-4 − reference late seq-rep-4 (mean over prompts)", EITHER, hi=1.0,
           sizing=Spread("ref_late_seq_rep4_sigma")),
    # the median over prompts: a candidate whose greedy path falls into another loop where the reference's
    # own text loops is scored against a loop's near-zero NLL, a heavy per-prompt tail that carried the mean
    # (benchmarks/RESULTS.md §12, "Judge NLL"); damage that moves most prompts moves the median
    Metric("judge_nll_excess", "max_judge_nll_excess", "max",
           "reference NLL of the candidate's late text − of its own late text, nats/token, median over prompts",
           EITHER, sizing=Spread("ref_late_nll_sigma", median=True)),
    Metric("loops_excess", "max_loops_excess", "max",
           "prompts whose continuation ends in a loop: candidate − reference", EITHER, integer=True,
           sizing=Rate("ref_loop_rate")),
    Metric("premature_eos_excess", "max_premature_eos_excess", "max",
           "prompts stopped by EOS before new_tokens: candidate − reference", EITHER, integer=True,
           sizing=Rate("ref_eos_rate"), applies=_eos_allowed),
))

"""Gate 3's judge-NLL excess prompt by prompt, in healthy candidates: where its tail comes from, and the
false-reject rate of the 8-prompt mean (what the check judged until 2026-12-05) and of statistics one prompt
cannot carry (the median, judged since).

The check judges the median over prompts of (the reference's NLL of the candidate's late text − of its own late
text); until 2026-12-05, their mean. benchmarks/error_rates.py stores the per-prompt late NLLs and loop periods with each run (`longgen.
per_prompt`; `late_top1_healthy.py --backfill RUNS` adds them to older rows from their run folders). This
reads those rows, takes each healthy variant once, and prints:

- the per-prompt excess split by whether the reference's own continuation ends in a loop there (a candidate
  whose greedy path falls into another loop, or leaves the reference's, is scored against a loop's near-zero NLL);
- per statistic (mean; median; mean without the largest prompt; mean without the largest and the smallest):
  the healthy variants' values, and its false-reject rate at a limit, estimated by resampling: a pseudo-variant
  takes, for each prompt, that prompt's excess from a randomly drawn healthy variant (prompts kept apart: they
  differ in level; a variant's prompts taken as independent). The rate is in-sample: a tail the variants never
  showed is not in it; the statistic's 99.5th percentile under resampling is the limit it would need for α 0.005;
- each planted-fault row's value under each statistic, with its verdict (whether anything else caught it).

    python benchmarks/judge_nll_per_prompt.py FILE.json [FILE.json …] [--limit 0.0325 [0.0293 …]] [--draws 200000]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

STATISTICS = {
    "mean (judged until 2026-12-05)": lambda x: x.mean(-1),
    "median (judged since)": lambda x: np.median(x, -1),
    "mean without the largest": lambda x: np.sort(x, -1)[..., :-1].mean(-1),
    "mean without largest and smallest": lambda x: np.sort(x, -1)[..., 1:-1].mean(-1),
}


def rows(files: list[Path]) -> tuple[list[dict], list[dict]]:
    """(healthy rows, planted-fault rows) carrying per-prompt figures, each run once by name (first file wins)."""
    seen: dict[str, dict] = {}
    for f in files:
        for r in json.loads(f.read_text(encoding="utf-8"))["results"]:
            if (r.get("longgen") or {}).get("per_prompt"):
                seen.setdefault(r["name"], r)
    every = list(seen.values())
    return [r for r in every if r["variant"] in ("shipped", "healthy")], [r for r in every if r["variant"] == "fault"]


def excess(r: dict) -> np.ndarray:
    return np.array([p["cand_late_judge_nll"] - p["ref_late_nll"] for p in r["longgen"]["per_prompt"]], dtype=float)


def ref_loops(r: dict) -> np.ndarray:
    return np.array([p["ref_loop_period"] is not None for p in r["longgen"]["per_prompt"]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--limit", type=float, nargs="+", default=[0.0325],
                    help="the limit(s) to state each statistic's rate at (the shipped check's: 0.0325 for the median in the FP8 files)")
    ap.add_argument("--draws", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    healthy, faults = rows(a.files)
    if len(healthy) < 2:
        raise SystemExit("fewer than 2 healthy rows carry per-prompt figures: backfill them (late_top1_healthy.py --backfill RUNS)")
    prompts = {len(r["longgen"]["per_prompt"]) for r in healthy}
    if len(prompts) != 1:
        raise SystemExit(f"healthy rows differ in their number of prompts ({sorted(prompts)}): one gate-3 setting at a time")
    e, loops = np.array([excess(r) for r in healthy]), np.array([ref_loops(r) for r in healthy])
    n_var, n_prompt = e.shape
    print(f"{n_var} healthy variants × {n_prompt} prompts; the reference loops on prompts "
          f"{[i for i in range(n_prompt) if loops[:, i].all()]} in every variant's run")
    for name, sel in (("reference loops", loops), ("reference natural", ~loops)):
        x = e[sel]
        if x.size:
            q = np.percentile(x, [50, 90, 99, 100])
            print(f"  per-prompt excess where the {name}: {x.size} values, median {q[0]:.4f}, 90th {q[1]:.4f}, "
                  f"99th {q[2]:.4f}, max {q[3]:.4f}; above 0.05: {(x > 0.05).sum()}")
    rng = np.random.default_rng(a.seed)
    draws = e[rng.integers(0, n_var, size=(a.draws, n_prompt)), np.arange(n_prompt)]
    # each fault's per-prompt excess and how many checks other than the judge NLL failed it, once
    fault_rows = [(r["name"], r["decision"], excess(r),
                   sum(c["outcome"] == "fail" and k != "longgen/judge_nll_excess" for k, c in r["checks"].items()))
                  for r in sorted(faults, key=lambda r: r["name"])]
    for name, fn in STATISTICS.items():
        v, boot = fn(e), fn(draws)
        rates = "; ".join(f"over {lim}: {(v > lim).sum()} of {n_var} in sample, {(boot > lim).mean():.4f} resampled"
                          for lim in a.limit)
        print(f"\n{name}: healthy {np.mean(v):.4f} ± {np.std(v, ddof=1):.4f}, largest {np.sort(v)[-3:].round(4).tolist()}; "
              f"{rates}; resampled 99.5th percentile {np.quantile(boot, 0.995):.4f}")
        for fault, decision, x, others in fault_rows:
            val = float(fn(x))
            over = ", ".join(f"{'over' if val > lim else 'within'} {lim}" for lim in a.limit)
            print(f"  fault {fault}: {val:.4f} ({over}; {decision}, {others} other checks failed)")


if __name__ == "__main__":
    main()

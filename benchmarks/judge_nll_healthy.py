"""Gate 3's judge-NLL excess of healthy candidates, from stored error-rate runs: where to centre its sized limit.

Reads benchmarks/results/h200_error_rates_<check>_*.json (benchmarks/error_rates.py's output), takes each
healthy variant once (the shipped calibration sample and the sample seeds), and prints per check file and
pooled: the excess's mean, sd and one-sided 95 % lower bound of the mean (the conservative end for a centre:
a smaller centre is a stricter limit). Then, for each candidate centre h, the limit h + the stored sized
margin (the stored limits were sized around 0), the false-reject rate of a healthy candidate by a normal fit
to the pooled values and in sample, and every planted-fault run whose judge-NLL check changes outcome at that
centre, with the other checks it failed (a fault "lost" is one that nothing else caught).

    python benchmarks/judge_nll_healthy.py [--checks fp8_kvfp16 fp8_kvfp8] [--centres 0 0.004 0.005 0.006]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "longgen/judge_nll_excess"


def runs(check: str) -> list[dict]:
    """Every run stored for a check file, once each by name (the first file that has it), whose judge-NLL figure is
    the mean over prompts (what this centres; rows judged as the median, since 2026-12-05, say `"statistic":
    "median"`: judge_nll_per_prompt.py states the median's rates from their per-prompt figures)."""
    seen: dict[str, dict] = {}
    for path in sorted(RESULTS.glob(f"h200_error_rates_{check}_*.json")):
        for r in json.loads(path.read_text(encoding="utf-8"))["results"]:
            if r["decision"] != "ERROR" and KEY in r.get("checks", {}) and r["checks"][KEY].get("statistic", "mean") == "mean":
                seen.setdefault(r["name"], r)
    return list(seen.values())


def summary(values: list[float]) -> str:
    m, s, n = statistics.mean(values), statistics.stdev(values), len(values)
    return f"n {n}, mean {m:.5f}, sd {s:.5f}, one-sided 95 % lower bound of the mean {m - 1.6448536 * s / math.sqrt(n):.5f}, max {max(values):.4f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checks", nargs="+", default=["fp8_kvfp16", "fp8_kvfp8"])
    ap.add_argument("--centres", nargs="+", type=float, default=[0.0, 0.004, 0.005, 0.006])
    a = ap.parse_args()
    all_runs = {c: runs(c) for c in a.checks}
    pooled: list[float] = []
    for c, rs in all_runs.items():
        healthy = [r["checks"][KEY]["value"] for r in rs if r["variant"] in ("shipped", "healthy")]
        if len(healthy) < 2:
            raise SystemExit(f"{c}: fewer than 2 healthy runs stored under {RESULTS}")
        pooled += healthy
        print(f"{c}: healthy judge-NLL excess: {summary(healthy)}")
    print(f"pooled: {summary(pooled)}")
    m, s = statistics.mean(pooled), statistics.stdev(pooled)
    normal = statistics.NormalDist(m, s)
    every = [r for rs in all_runs.values() for r in rs]
    limits = sorted({round(r["checks"][KEY]["limit"], 9) for r in every})
    healthy_runs = [r["checks"][KEY] for r in every if r["variant"] in ("shipped", "healthy")]
    faults = sorted((r for r in every if r["variant"] == "fault"), key=lambda r: r["name"])
    for h in a.centres:
        print(f"\ncentre {h:g}: limit(s) {', '.join(f'{x + h:.4f}' for x in limits)}")
        fails = sum(c["value"] > c["limit"] + h for c in healthy_runs)
        print(f"  healthy: normal-fit false-reject rate {1 - normal.cdf(limits[0] + h):.4f}; failed in sample {fails} of {len(pooled)}")
        for r in faults:
            c = r["checks"][KEY]
            if not c["limit"] < c["value"] <= c["limit"] + h:
                continue
            others = [k for k, v in r["checks"].items() if v["outcome"] == "fail" and k != KEY]
            print(f"  fault {r['name']}: {c['value']:.4f} passes now; "
                  + (f"still rejected by {len(others)} other checks" if others else "LOST: no other check rejected it"))


if __name__ == "__main__":
    main()

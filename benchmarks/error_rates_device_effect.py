"""How much the device moves each check's figure, against how much the calibration sample does: the
same healthy variants (check file and calibration sample seed) gated on two devices, from
benchmarks/error_rates.py's outputs (issue 29's CPU-against-GPU variant).

    python benchmarks/error_rates_device_effect.py \\
        --a benchmarks/results/cpu_error_rates_fp8_kvfp16_healthy.json \\
        --b benchmarks/results/h200_error_rates_fp8_kvfp16_healthy.json \\
            benchmarks/results/h200_error_rates_fp8_kvfp16_late_positions.json

Per check, over the variants gated on both sides: the paired difference a − b of the check's figure
(mean, sd, largest in size), the sd of the figure over b's variants (what another calibration sample
moves it by) and the ratio of the two; how often the check's outcome differs. Per check file: how often
the whole verdict differs, with its 95 % Clopper–Pearson interval. A variant is matched by check file
and sample seed (`shipped`: the shipped selection); planted-fault runs are left out. Where several
files of one side hold a variant, the first file read gives it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qval.metrics.paired import clopper_pearson  # noqa: E402


def healthy(paths: list[str]) -> dict[tuple[str, Any], dict[str, Any]]:
    """Each healthy variant that ran, keyed by (check file, sample seed), from the first file holding it."""
    out: dict[tuple[str, Any], dict[str, Any]] = {}
    for p in paths:
        for r in json.loads(Path(p).read_text(encoding="utf-8"))["results"]:
            if r["variant"] in ("shipped", "healthy") and r["decision"] != "ERROR":
                out.setdefault((r["check"], r["sample_seed"]), r)
    return out


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def compare(a: dict[tuple[str, Any], dict[str, Any]], b: dict[tuple[str, Any], dict[str, Any]]) -> list[str]:
    both = [k for k in a if k in b]
    if not both:
        return ["No variant was gated on both sides (matched by check file and sample seed)."]
    lines: list[str] = []
    for check in dict.fromkeys(k[0] for k in both):
        keys = [k for k in both if k[0] == check]
        differ = sum(a[k]["decision"] != b[k]["decision"] for k in keys)
        lo, hi = clopper_pearson(differ, len(keys))
        seeds = ", ".join("shipped" if s is None else str(s) for _, s in keys)
        lines += [f"## {check}: {len(keys)} variants on both sides (sample seeds: {seeds})", "",
                  f"Verdicts: a {sum(a[k]['decision'] == 'APPROVE' for k in keys)} APPROVE, "
                  f"b {sum(b[k]['decision'] == 'APPROVE' for k in keys)} APPROVE; "
                  f"they differ in {differ} of {len(keys)} (95 % interval [{lo:.2f}, {hi:.2f}]).", "",
                  "| check | paired | mean a − b | sd a − b | largest a − b | sd over b's variants | sd a − b / sd over b | outcome differs |",
                  "|---|---|---|---|---|---|---|---|"]
        spread_of = [r for (c, _), r in b.items() if c == check]
        for name in dict.fromkeys(n for k in keys for n in a[k]["checks"]):
            pairs = [(a[k]["checks"][name], b[k]["checks"][name]) for k in keys if name in b[k]["checks"] and name in a[k]["checks"]]
            d = [x["value"] - y["value"] for x, y in pairs if x.get("value") is not None and y.get("value") is not None]
            spread = [r["checks"][name]["value"] for r in spread_of if r["checks"].get(name, {}).get("value") is not None]
            sd_d = statistics.stdev(d) if len(d) > 1 else None
            sd_b = statistics.stdev(spread) if len(spread) > 1 else None
            ratio = sd_d / sd_b if sd_d is not None and sd_b else None
            outcomes = sum(x["outcome"] != y["outcome"] for x, y in pairs)
            lines.append(f"| {name} | {len(d)} | {_g(statistics.mean(d)) if d else '–'} | {_g(sd_d)} | "
                         f"{_g(max(d, key=abs)) if d else '–'} | {_g(sd_b)} ({len(spread)}) | {_g(ratio)} | {outcomes}/{len(pairs)} |")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="error_rates.json files of one device")
    ap.add_argument("--b", nargs="+", required=True, help="error_rates.json files of the other")
    args = ap.parse_args()
    print("\n".join(compare(healthy(args.a), healthy(args.b))))


if __name__ == "__main__":
    main()

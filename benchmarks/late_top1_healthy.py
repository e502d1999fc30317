"""Gate 3's top-1 on natural text of healthy candidates, from stored error-rate runs: where `min_late_top1` goes.

On the built-in model the reference's continuation ends in a loop on most prompts, so its late edge cannot
show a healthy candidate's top-1 on natural text (a loop is copied: top-1 ≈ 1). Its early edge (the first
`edge` positions of the same continuation, before any loop sets in) can: that is the figure a candidate at the
shipped level reaches where the reference does not loop, and what `min_late_top1` (met by the lower end of its
95 % interval over the prompts) must leave room for.

Reads benchmarks/error_rates.py's JSON files (each row's `longgen` measurements; `--backfill RUNS` first adds
them to rows written before that key existed, from each run folder's report.json), takes each healthy variant
once (shipped selection and sample seeds), and prints per check file: the healthy early top-1 (mean ± sd over
variants, its one-sided 95 % upper bound — the conservative end for a centre: a higher centre is a stricter
limit —, the runs' mean standard error and their interval lower ends), the limit

    L = upper bound of the healthy mean − (1.96 + 2.576) × se      (rounded down to 0.001)

which a candidate at the healthy level fails with probability 0.005 under the normal model the report states
sizes by (qval.metrics.thresholds.absolute_rates), the size of the shipped limit under the same model, what L
detects with power 0.8, and every planted-fault run's early lower end against it. With `--bar TOP1`, the same rule
over every run (healthy or faulty) whose gate-1 top-1 lies within 0.02 of TOP1: the limit for a file whose own
healthy candidates cannot be measured, set so that a candidate just meeting gate 1's deployable bar passes.

    python benchmarks/late_top1_healthy.py FILE.json [FILE.json …] [--bar TOP1] [--backfill RUNS_DIR]
    python benchmarks/late_top1_healthy.py --write    # the shipped limits' derivations, benchmarks/results/limit_derivations.json

`--write` computes every `late_top1` entry of the derivations file again from the stored runs it names (its `rule`:
healthy variants, or runs at gate 1's bar) and writes the figures; tests/test_limit_sizes.py holds each check
file's `min_late_top1` to its entry's limit. The rule itself is benchmarks/lib/late_top1.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.lib.late_top1 import BAR_WINDOW, at_gate1_bar, derive, rates, rows_by_check, write  # noqa: E402


def backfill(path: Path, runs: Path) -> int:
    """Add `longgen` to every row of `path` that lacks it or its per-prompt figures, from runs/<name>/report.json;
    returns rows filled."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from error_rates import longgen_measured

    data = json.loads(path.read_text(encoding="utf-8"))
    filled = 0
    for r in data["results"]:
        report = runs / r.get("name", "") / "report.json"
        if (r.get("longgen") is None or "per_prompt" not in r["longgen"]) and r.get("decision") != "ERROR" and report.is_file():
            r["longgen"] = longgen_measured(json.loads(report.read_text(encoding="utf-8")))
            filled += r["longgen"] is not None
    if filled:
        old = data["meta"].get("longgen_backfilled")
        note = f"{filled} rows' longgen {'re-read, with per-prompt figures, ' if old else ''}from {runs}/<name>/report.json"
        data["meta"]["longgen_backfilled"] = f"{old}; then {note}" if old else f"{note} (late_top1_healthy.py)"
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return filled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--bar", type=float, metavar="TOP1", help="also derive the limit for a candidate at gate 1's top-1 bar "
                    f"TOP1 (the 4-bit files' 0.80), from every run of the check file within {BAR_WINDOW} of it")
    ap.add_argument("--backfill", type=Path, metavar="RUNS_DIR", help="fill rows' missing `longgen` (or its per-prompt figures) from RUNS_DIR/<name>/report.json")
    ap.add_argument("--write", action="store_true", help="write the shipped limits' derivations (benchmarks/results/limit_derivations.json)")
    a = ap.parse_args()
    if a.write:
        print(f"wrote {write()}")
        return
    if not a.files:
        ap.error("FILE.json … or --write")
    if a.backfill:
        for f in a.files:
            print(f"{f}: {backfill(f, a.backfill)} rows backfilled")
    by_check = rows_by_check(a.files)
    if not by_check:
        raise SystemExit("no row carries gate 3's `longgen` measurements: run with --backfill RUNS_DIR, or rerun error_rates.py")
    for check, rows in sorted(by_check.items()):
        healthy = [r for r in rows.values() if r["variant"] in ("shipped", "healthy")]
        if a.bar is not None:
            b = at_gate1_bar(list(rows.values()), a.bar)
            r = rates(b, b["limit"])
            print(f"{check} at gate 1's top-1 bar {a.bar}: {b['n']} runs within {BAR_WINDOW} (their gate-1 top-1 {b['gate1_top1']:.4f}), "
                  f"early top-1 {b['mean']:.5f} ± {b['sd']:.5f}, upper bound {b['upper']:.5f}, se {b['se']:.5f}: limit {b['limit']}, "
                  f"size {r.size:.4f}, detects (power 0.8) a top-1 of {r.detectable:.4f} or lower")
        if len(healthy) < 2:
            print(f"{check}: {len(healthy)} healthy run(s) with gate 3's measurements: too few")
            continue
        d = derive(healthy)
        print(f"{check}: {d['n']} healthy variants, early top-1 (edge {healthy[0]['longgen'].get('edge')}): mean {d['mean']:.5f}, "
              f"sd {d['sd']:.5f}, one-sided 95 % upper bound {d['upper']:.5f}; the runs' mean standard error {d['se']:.5f}; "
              f"interval lower ends {min(d['lo']):.4f} – {max(d['lo']):.4f} (mean {statistics.mean(d['lo']):.4f})")
        lim_shipped = healthy[0]["checks"].get("longgen/late_top1", {}).get("limit")
        for name, lim in (("measured at", lim_shipped), ("derived", d["limit"])):
            if lim is None:
                continue
            r = rates(d, lim)
            print(f"  {name} limit {lim}: size at the healthy level {r.size:.4f} (normal model); healthy lower ends under it "
                  f"{sum(x < lim for x in d['lo'])} of {d['n']}; detects (power 0.8) a top-1 of {r.detectable:.4f} or lower")
        for r in sorted((r for r in rows.values() if r["variant"] == "fault"), key=lambda r: r["name"]):
            e = r["longgen"]["early_top1"]
            print(f"  fault {r['name']}: early top-1 {e['value']:.4f}, lower end {e['lo']:.4f}: "
                  + ("fails" if e["lo"] < d["limit"] else "passes") + f" {d['limit']}; verdict {r['decision']}")


if __name__ == "__main__":
    main()

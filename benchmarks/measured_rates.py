"""The measured false-reject rates a report prints (qval/report/measured_error_rates.json): judged again from each
entry's stored runs (benchmarks/results/, written by error_rates.py) at its check file's current limits.

    python benchmarks/measured_rates.py            # print each entry's counts, and whether the data file holds them
    python benchmarks/measured_rates.py --write    # write them into the data file (after a limit moved or a run was added)

A new entry (another check file) is added to the data file by hand — its `check`, `raw`, `source` and
`configuration` — and its counts written by `--write`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lib.measured_rates import DATA, judge, load, write  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write the counts into {DATA.name}")
    a = ap.parse_args()
    stale = 0
    for name, entry in load()["entries"].items():
        counts = judge(entry)
        held = {"variants": entry["variants"], "rejected": entry["rejected"],
                "checks": {k: {f: v for f, v in c.items() if f in ("failed", "uninformative")} for k, c in entry["checks"].items()}}
        stale += counts != held
        failed = {k: c["failed"] for k, c in counts["checks"].items() if c["failed"]}
        print(f"{name}: {counts['rejected']} of {counts['variants']} healthy variants rejected; checks failed: {failed or 'none'}"
              + ("" if counts == held else "  (the data file holds other counts)"))
    if a.write:
        print(f"wrote {write()}")
    elif stale:
        raise SystemExit(f"{stale} entries differ from {DATA}: run with --write")


if __name__ == "__main__":
    main()

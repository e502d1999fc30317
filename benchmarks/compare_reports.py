"""Compare every figure of two qval report.json files (issue 12, part 7: the reproducibility check).

A figure is a number anywhere in the report (lists counted element by element, booleans left
out), except what measures the run rather than the candidate: durations and dates (keys named
`seconds`, `*_seconds`, `*_s`, `wall*`, `created`, `date`) and a phase's peak memory (`peak_*_bytes`). Strings are compared apart (paths
and stage keys differ between two folders by construction; the verdict and statuses must not).

    python3 benchmarks/compare_reports.py run1/report.json run2/report.json [--out compare.json]   # or .json.gz

Prints the count of figures, how many differ, per top-level section (gates.agreement, …), and the
largest absolute and relative differences; exit 0 when every figure is equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterator

TIMING = re.compile(r"(^|_)(seconds|s|wall|wall_s|created|date|elapsed)$|^seconds_|_seconds$|^peak_\w+_bytes$")


def leaves(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every leaf; dict keys joined with '.', list indices as [i].

    >>> list(leaves({"a": [1, {"b": 2.5}], "c": "x"}))
    [('a[0]', 1), ('a[1].b', 2.5), ('c', 'x')]
    """
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, node


def is_timing(path: str) -> bool:
    """Whether the leaf measures the run (a duration, a date, a peak of memory), not the candidate.

    >>> [is_timing(p) for p in ("gates.longgen.seconds", "stages.calibrate.seconds", "calibration.calibration_seconds",
    ...                          "gates.agreement.details.kld.mean", "created", "x.wall_s", "gates.quality.details.bleu.s",
    ...                          "stages.gate_agreement.memory.peak_rss_bytes", "model.snapshot.bytes")]
    [True, True, True, False, True, True, True, True, False]
    """
    key = re.sub(r"\[\d+\]$", "", path).split(".")[-1]
    return bool(TIMING.search(key))


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same(a: Any, b: Any) -> bool:
    """Equal figures; two NaNs are the same figure."""
    if is_number(a) and is_number(b) and isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def section(path: str) -> str:
    parts = path.split(".")
    return ".".join(parts[:2]) if parts[0] in ("gates", "candidate") else parts[0].split("[")[0]


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    la, lb = dict(leaves(a)), dict(leaves(b))
    figures: dict[str, dict[str, int]] = {}
    differing: list[dict[str, Any]] = []
    strings: list[dict[str, Any]] = []
    timing = 0
    only = sorted(set(la) ^ set(lb))
    for path in sorted(set(la) & set(lb)):
        x, y = la[path], lb[path]
        if is_timing(path) and (is_number(x) or isinstance(x, str)):
            timing += 1
            continue
        if is_number(x) and is_number(y):
            sec = figures.setdefault(section(path), {"figures": 0, "differing": 0})
            sec["figures"] += 1
            if not same(x, y):
                sec["differing"] += 1
                diff = abs(float(x) - float(y))
                rel = diff / max(abs(float(x)), abs(float(y))) if max(abs(float(x)), abs(float(y))) > 0 else 0.0
                differing.append({"path": path, "a": x, "b": y, "abs_diff": diff, "rel_diff": rel})
        elif not same(x, y):
            strings.append({"path": path, "a": x, "b": y})
    total = sum(s["figures"] for s in figures.values())
    ndiff = sum(s["differing"] for s in figures.values())
    worst = sorted(differing, key=lambda d: -d["rel_diff"])
    return {"figures": total, "differing": ndiff, "by_section": figures, "timing_leaves_skipped": timing,
            "only_in_one": only, "differing_figures": worst, "differing_strings": strings,
            "verdicts": [a.get("verdict", {}).get("approved"), b.get("verdict", {}).get("approved")]}


def load(path: Path) -> dict[str, Any]:
    """A report.json, or one gzipped (`.gz`: how benchmarks/results keeps the large ones); a run folder is read
    as the report.json in it (`qval gate --out DIR` writes DIR/<name>/report.json: give that one)."""
    if path.is_dir() and (path / "report.json").is_file():
        path = path / "report.json"
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as e:  # gzip.BadGzipFile is an OSError
        raise Unreadable(f"{path}: not a readable report.json ({type(e).__name__}: {e}); "
                         "give the report.json a `qval gate` run wrote (or its .json.gz)") from None
    if not isinstance(data, dict):
        raise Unreadable(f"{path}: a report.json holds a JSON object, this holds a {type(data).__name__}")
    return data


class Unreadable(Exception):
    """An input that is not a report: exit 2 (1 means that figures differ)."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path, help="write the whole comparison here as JSON")
    args = ap.parse_args()
    try:
        a, b = load(args.a), load(args.b)
    except Unreadable as e:
        print(f"compare_reports.py: {e}", file=sys.stderr)
        return 2
    res = compare(a, b)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1), encoding="utf-8")
    try:
        summary(res)
    except BrokenPipeError:  # the reader stopped early (`| head`): the exit code still says equal or not
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
    return 0 if res["differing"] == 0 else 1


def summary(res: dict) -> None:
    print(f"{res['differing']} of {res['figures']} figures differ ({res['timing_leaves_skipped']} timing leaves skipped; "
          f"verdicts {res['verdicts']}; {len(res['only_in_one'])} paths in one report only)")
    for name, s in sorted(res["by_section"].items()):
        print(f"  {name}: {s['differing']} of {s['figures']}")
    for d in res["differing_figures"][:10]:
        print(f"  largest: {d['path']}: {d['a']!r} vs {d['b']!r} (rel {d['rel_diff']:.3g})")
    for d in res["differing_strings"][:40]:
        print(f"  string: {d['path']}: {str(d['a'])[:80]!r} vs {str(d['b'])[:80]!r}")


if __name__ == "__main__":
    sys.exit(main())

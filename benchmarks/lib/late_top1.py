"""Where a late top-1 limit goes, from gate 3's early-edge top-1 of stored error-rate runs (benchmarks/error_rates.py's
JSON files): the healthy level and its limit (`derive`), the same at gate 1's top-1 bar (`at_gate1_bar`), and a
limit's size there (`rates`). benchmarks/late_top1_healthy.py prints them; tests/test_limit_sizes.py recomputes the
shipped limits with them.

    L = upper bound of the healthy mean − (1.96 + 2.576) × se      (rounded down to 0.001)
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from qval.metrics.estimate import normal_ppf
from qval.metrics.thresholds import absolute_rates

Z95, Z975, Z995 = normal_ppf(0.95), normal_ppf(0.975), normal_ppf(0.995)
BAR_WINDOW = 0.02  # runs whose gate-1 top-1 is this close to the bar stand for a candidate at it


def rows_by_check(files: list[Path]) -> dict[str, dict[str, dict]]:
    """check file stem -> run name -> row, for every row that carries gate 3's measurements (first file wins)."""
    by_check: dict[str, dict[str, dict]] = {}
    for f in files:
        for r in json.loads(f.read_text(encoding="utf-8"))["results"]:
            if (r.get("longgen") or {}).get("early_top1"):
                by_check.setdefault(Path(r["check"]).stem, {}).setdefault(r["name"], r)
    return by_check


def derive(rows: list[dict]) -> dict:
    """The healthy early top-1 of `rows` (healthy variants, each once) and the limit derived from it."""
    v = [r["longgen"]["early_top1"]["value"] for r in rows]
    lo = [r["longgen"]["early_top1"]["lo"] for r in rows]
    se = statistics.mean(r["longgen"]["early_top1"]["stderr"] for r in rows)
    m, s, n = statistics.mean(v), statistics.stdev(v), len(v)
    upper = m + Z95 * s / math.sqrt(n)
    return {"n": n, "mean": m, "sd": s, "upper": upper, "se": se, "lo": lo,
            "limit": math.floor((upper - (Z975 + Z995) * se) * 1000) / 1000}


def at_gate1_bar(rows: list[dict], bar: float, window: float = BAR_WINDOW) -> dict:
    """`derive` over the runs whose gate-1 top-1 lies within `window` of `bar` (any variant: healthy or faulty), and
    their mean gate-1 top-1: the limit that a candidate just meeting gate 1's deployable bar fails with
    probability 0.005, for a check file whose own healthy candidates cannot be measured (the 4-bit files on the
    built-in model, whose candidates gate 1 rejects)."""
    near = [r for r in rows if abs(r["checks"]["agreement/top1"]["value"] - bar) <= window]
    if len(near) < 2:
        raise SystemExit(f"{len(near)} run(s) with gate 1's top-1 within {window} of {bar}: too few to derive from")
    return {**derive(near), "bar": bar, "gate1_top1": statistics.mean(r["checks"]["agreement/top1"]["value"] for r in near)}


def rates(d: dict, limit: float):  # noqa: ANN201 - a StatedRates
    """`limit`'s size and detectable top-1 for a candidate at the healthy level `d` (the report's normal model)."""
    return absolute_rates("min", limit, "lo", d["upper"], d["upper"], d["upper"] - Z975 * d["se"], d["se"])


ROOT = Path(__file__).resolve().parents[2]
#: the derivations behind the shipped limits: each check file's `min_late_top1` from its stored runs (`late_top1`),
#: and the measured noise tests/test_limit_sizes.py sizes the other interval-bound limits at (`noise`)
DERIVATIONS = ROOT / "benchmarks/results/limit_derivations.json"
FIGURES = ("n", "mean", "sd", "upper", "se", "limit", "size")


def derivation(entry: dict) -> dict:
    """The figures of one `late_top1` entry from its raw runs (`raw`, under benchmarks/results): `rule` "healthy"
    derives from the check file's healthy variants (`derive`), "gate1_bar" from every run within `BAR_WINDOW` of
    gate 1's top-1 `bar` (`at_gate1_bar`); `size` is the derived limit's at that level."""
    [rows] = rows_by_check([ROOT / "benchmarks/results" / f for f in entry["raw"]]).values()  # one check file
    if entry["rule"] == "healthy":
        d = derive([r for r in rows.values() if r["variant"] in ("shipped", "healthy")])
    else:
        d = at_gate1_bar(list(rows.values()), entry["bar"])
    return {**d, "size": rates(d, d["limit"]).size}


def refreshed(table: dict) -> dict:
    """`table` (the derivations file) with every late top-1 entry's figures computed again from its raw runs."""
    late = {}
    for name, e in table["late_top1"].items():
        d = derivation(e)
        extra = {"gate1_top1": round(d["gate1_top1"], 5)} if "gate1_top1" in d else {}
        late[name] = {k: v for k, v in e.items() if k not in FIGURES and k != "gate1_top1"} | extra | {
            k: (d[k] if k in ("n", "limit") else round(d[k], 5)) for k in FIGURES}
    return {**table, "late_top1": late}


def load() -> dict:
    return json.loads(DERIVATIONS.read_text(encoding="utf-8"))


def write() -> Path:
    DERIVATIONS.write_text(json.dumps(refreshed(load()), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return DERIVATIONS

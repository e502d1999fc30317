"""The measured false-reject rates the report prints (qval/report/measured_error_rates.json), judged again from
the stored runs of benchmarks/error_rates.py at the check files' current limits.

An entry names its check file (`check`; `measured_on`: the configuration its rows ran, where the shipped
selection does not approve on the built-in model) and its raw runs (`raw`, a glob under the repository). Every
healthy variant is taken once; each stored check is judged at the check file's limit: an absolute one at its
value; a sized one as it ran, or — where the entry gives the stored reference's sized `margin` — re-centred on the
file's `healthy` at that centre + `margin`, its figure the stored mean, or with `"statistic": "median"` the median
of the run's per-prompt figures against `healthy` + √(π/2) × `margin`. `judge` returns the counts the data file
holds; `benchmarks/measured_rates.py --write` writes them, tests/report/test_measured_error_rates.py compares them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from qval.config import load_config
from qval.gate_metrics import MEDIAN_SPREAD
from qval.report.measured_error_rates import DATA, check_limits

ROOT = Path(__file__).resolve().parents[2]


def per_prompt(r: dict) -> list[dict]:
    return (r.get("longgen") or {}).get("per_prompt") or []


def judge_excess(r: dict) -> list[float]:
    """Gate 3's per-prompt judge-NLL excess of a stored run (candidate's late text − the reference's own)."""
    return [p["cand_late_judge_nll"] - p["ref_late_nll"] for p in per_prompt(r)]


def measured_file(entry: dict) -> str:
    """The check file whose rows measured `entry`: the shipped one, or its approving configuration."""
    return entry.get("measured_on", entry["check"])


def healthy_runs(entry: dict) -> list[dict]:
    """Every healthy variant (the shipped selection and the sample seeds) stored for an entry, once each: a run
    with per-prompt gate-3 figures over a run of the same variant without them (re-runs' figures are equal, on an
    H100 as on the H200, but for the judge-NLL statistic: RESULTS.md §12)."""
    runs: dict[str, dict] = {}
    check = measured_file(entry)
    for path in sorted(ROOT.glob(entry["raw"])):
        for r in json.loads(path.read_text(encoding="utf-8"))["results"]:
            if r["check"] == check and r["variant"] in ("shipped", "healthy") and r["decision"] != "ERROR":
                if r["name"] not in runs or (per_prompt(r) and not per_prompt(runs[r["name"]])):
                    runs[r["name"]] = r
    return list(runs.values())


def outcome_at(c: dict, limit: float) -> str:
    """A stored absolute check judged again at `limit`: its stored end (value, or the interval's bound) against it.

    >>> c = {"value": 0.2, "lo": -0.18, "hi": 0.565, "op": "max", "on": "hi", "outcome": "pass"}
    >>> outcome_at(c, 0.6), outcome_at(c, 0.5), outcome_at({**c, "outcome": "uninformative"}, 0.5)
    ('pass', 'fail', 'uninformative')
    """
    if c["outcome"] == "uninformative":
        return "uninformative"
    end = c[c["on"]]
    return "pass" if (end <= limit if c["op"] == "max" else end >= limit) else "fail"


def _close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-12


def outcome_of(c: dict, entry: dict, limit: dict, run: dict) -> str:
    """A stored check `c` of `run` judged at the check file's `limit` (`check_limits`), `entry` the data file's row
    for it (its `margin` and `statistic` where a sized check is re-centred)."""
    if "limit" in limit:
        return outcome_at(c, limit["limit"])
    if "margin" not in entry:  # judged as it ran
        assert limit.get("healthy") is None and "statistic" not in entry, entry
        return c["outcome"]
    healthy = limit.get("healthy") or 0.0  # a sized check without a centre is centred on 0
    if c.get("statistic") == "median":  # judged as the check judges now: the stored limit is the median's
        assert _close(c["limit"], c.get("healthy", 0.0) + MEDIAN_SPREAD * entry["margin"]), run["name"]
    else:
        centre = c["limit"] - entry["margin"]  # the centre in force when the run was judged: 0 or 0.005
        assert min(abs(centre), abs(centre - 0.005)) < 1e-12 and _close(c.get("healthy", centre), centre), run["name"]
    if entry.get("statistic", "mean") == "mean":
        return outcome_at({**c, "on": "value"}, healthy + entry["margin"])
    assert entry["statistic"] == "median" and per_prompt(run), f"{run['name']}: no per-prompt figures to take the median of"
    outcome = "pass" if statistics.median(judge_excess(run)) <= healthy + MEDIAN_SPREAD * entry["margin"] else "fail"
    if c.get("statistic") == "median" and c.get("healthy") == limit.get("healthy"):  # judged at this limit when it ran
        assert outcome == c["outcome"], run["name"]
    return outcome


def judge(entry: dict) -> dict[str, Any]:
    """The counts an entry holds, from its raw runs at its check file's current limits: {"variants", "rejected",
    "checks": {key: {"failed"[, "uninformative"]}}}."""
    runs = healthy_runs(entry)
    limits = check_limits(load_config(ROOT / entry["check"]), list(entry["checks"]))
    outcomes = [{key: outcome_of(r["checks"][key], e, limits[key], r) for key, e in entry["checks"].items()} for r in runs]
    checks = {}
    for key in entry["checks"]:
        judged = [o[key] for o in outcomes]
        checks[key] = {"failed": judged.count("fail")} | ({"uninformative": n} if (n := judged.count("uninformative")) else {})
    return {"variants": len(runs), "rejected": sum("fail" in o.values() for o in outcomes), "checks": checks}


def refreshed(table: dict) -> dict:
    """`table` (the data file) with every entry's counts judged again (`judge`); its other fields as they are."""
    out = {**table, "entries": {}}
    for name, entry in table["entries"].items():
        counts = judge(entry)
        checks = {key: {**counts["checks"][key], **{k: v for k, v in e.items() if k in ("statistic", "margin")}}
                  for key, e in entry["checks"].items()}
        out["entries"][name] = {**entry, "variants": counts["variants"], "rejected": counts["rejected"], "checks": checks}
    return out


def dumps(table: dict) -> str:
    """The data file's text: one line a check, so that a changed count is a one-line diff."""
    lines = ["{", f' "_about": {json.dumps(table["_about"], ensure_ascii=False)},', ' "entries": {']
    names = list(table["entries"])
    for i, name in enumerate(names):
        e = table["entries"][name]
        head = {k: v for k, v in e.items() if k != "checks"}
        lines.append(f"  {json.dumps(name)}: {{")
        lines += [f"   {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        lines.append('   "checks": {')
        keys = list(e["checks"])
        lines += [f"    {json.dumps(k)}: {json.dumps(e['checks'][k])}" + ("," if j < len(keys) - 1 else "") for j, k in enumerate(keys)]
        lines.append("   }")
        lines.append("  }" + ("," if i < len(names) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def load() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


def write() -> Path:
    DATA.write_text(dumps(refreshed(load())), encoding="utf-8")
    return DATA


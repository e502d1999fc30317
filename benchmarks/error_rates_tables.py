"""The tables of benchmarks/error_rates.py from its results (one dict per gated variant): false
rejects of healthy variants per check file and per check, with the figures behind each reject and
each check's closest approach to its limit; and per planted fault, each check's reject rate by
severity and the smallest severity rejected in at least 95 % of the seeds.

    python benchmarks/error_rates_tables.py DIR/error_rates.json     # print the tables again
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qval.metrics.paired import clopper_pearson  # noqa: E402

DETECTED = 0.95


def _g(x: Any) -> str:
    return "–" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def met(c: dict[str, Any]) -> float | None:
    """The end of a check's figure that met its limit (value, or the interval's bound)."""
    end = {"hi": c.get("hi"), "lo": c.get("lo")}.get(c.get("on") or "value", c.get("value"))
    return c.get("value") if end is None else end


def slack(c: dict[str, Any]) -> float | None:
    """How far inside its limit a check was (< 0: it failed)."""
    m = met(c)
    if m is None or c.get("limit") is None:
        return None
    return c["limit"] - m if c.get("op") == "max" else m - c["limit"]


def rate(k: int, n: int) -> str:
    if n == 0:
        return "–"
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}]"


def healthy_tables(results: list[dict[str, Any]]) -> list[str]:
    by_file: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        if r["variant"] in ("shipped", "healthy"):
            by_file[r["check"]].append(r)
    lines = ["## False rejects of healthy variants", "",
             "Each variant is the check as shipped, calibrated on another draw of its calibration data "
             "(`calibration.sample_seed`; `shipped` is the shipped selection). Rate with its 95 % Clopper–Pearson interval.", "",
             "| check file | variants | APPROVE | REJECT | ERROR | false-reject rate |", "|---|---|---|---|---|---|"]
    for f, rs in by_file.items():
        ran = [r for r in rs if r["decision"] != "ERROR"]
        rej = sum(r["decision"] == "REJECT" for r in ran)
        lines.append(f"| {f} | {len(rs)} | {len(ran) - rej} | {rej} | {len(rs) - len(ran)} | {rate(rej, len(ran))} |")
    for f, rs in by_file.items():
        ran = [r for r in rs if r["decision"] != "ERROR"]
        if not ran:
            continue
        names = list(dict.fromkeys(k for r in ran for k in r["checks"]))
        lines += ["", f"### {f}: per check over {len(ran)} healthy variants", "",
                  "Closest approach: the figure's end that meets the limit (value, or the interval's bound) in the variant "
                  "that came nearest to failing; slack = distance inside the limit (< 0 failed).", "",
                  "| check | limit | failed in | closest approach (variant) | slack | the figures behind each reject |",
                  "|---|---|---|---|---|---|"]
        for name in names:
            cs = [(r["name"], r["checks"][name]) for r in ran if name in r["checks"]]
            fails = [(n, c) for n, c in cs if c["outcome"] == "fail"]
            blind = sum(c["outcome"] == "uninformative" for _, c in cs)
            scored = [(slack(c), n, c) for n, c in cs if slack(c) is not None]
            worst = min(scored, key=lambda t: t[0]) if scored else None
            limit = cs[0][1]
            why = "; ".join(f"{n}: {next(x['reason'] for r in ran if r['name'] == n for x in r['failed'] if x['check'] == name)}"
                            for n, _ in fails)
            lines.append(f"| {name} | {'≤' if limit.get('op') == 'max' else '≥'} {_g(limit.get('limit'))} ({limit.get('source')}"
                         f"{', on ' + limit['on'] if limit.get('on') not in (None, 'value') else ''}) | {len(fails)}/{len(cs)}"
                         f"{f' (uninformative in {blind})' if blind else ''} | "
                         f"{_g(met(worst[2])) + ' (' + worst[1] + ')' if worst else '–'} | {_g(worst[0]) if worst else '–'} | {why or '–'} |")
    return lines


def detection_tables(results: list[dict[str, Any]]) -> list[str]:
    faults = [r for r in results if r["variant"] == "fault" and r["decision"] != "ERROR"]
    if not faults:
        return []
    lines = ["## Detection of planted faults (qval/faults.py)", ""]
    smallest: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for (check_file, kind) in dict.fromkeys((r["check"], r["fault"]["kind"]) for r in faults):
        rs = [r for r in faults if r["check"] == check_file and r["fault"]["kind"] == kind]
        sevs = sorted({r["fault"]["severity"] for r in rs})
        names = list(dict.fromkeys(k for r in rs for k in r["checks"]))
        failing = [n for n in names if any(r["checks"].get(n, {}).get("outcome") == "fail" for r in rs)]
        lines += [f"### {check_file}, `{kind}`: rejects by severity (over fault seeds)", "",
                  "| " + " | ".join(["severity", "whole check file", *failing]) + " |", "|" + "---|" * (2 + len(failing))]
        for s in sevs:
            at = [r for r in rs if r["fault"]["severity"] == s]
            cells = [f"{s:g}", f"{sum(r['decision'] == 'REJECT' for r in at)}/{len(at)}",
                     *(f"{sum(r['checks'].get(n, {}).get('outcome') == 'fail' for r in at)}/{len(at)}" for n in failing)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for n in ["(whole file)", *names]:
            first = None
            for s in sevs:
                at = [r for r in rs if r["fault"]["severity"] == s]
                k = sum(r["decision"] == "REJECT" for r in at) if n == "(whole file)" else \
                    sum(r["checks"].get(n, {}).get("outcome") == "fail" for r in at)
                if at and k / len(at) >= DETECTED:
                    first = f"{s:g} ({k}/{len(at)}; lower 95 % bound {clopper_pearson(k, len(at))[0]:.2f})"
                    break
            smallest[(check_file, n)][kind] = first or f"none up to {sevs[-1]:g}"
    kinds = list(dict.fromkeys(r["fault"]["kind"] for r in faults))
    lines += [f"### Smallest severity rejected in ≥ {DETECTED:.0%} of the seeds", "",
              "| check file | check | " + " | ".join(kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for (f, n), by_kind in smallest.items():
        lines.append(f"| {f} | {n} | " + " | ".join(by_kind.get(k, "–") for k in kinds) + " |")
    return lines


def render(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    errors = [r for r in results if r["decision"] == "ERROR"]
    head = [f"# Error rates ({meta.get('started')}, {meta.get('device')}, {meta.get('dtype')}"
            f"{', tiny budgets' if meta.get('tiny') else ''})", "",
            f"`{meta.get('command')}` — {len(results)} of {meta.get('jobs_planned')} runs in {meta.get('seconds')} s "
            f"({meta.get('stopped', 'running')}), {meta.get('workers')} worker(s), {meta.get('platform')}.", ""]
    tail = ["", "## Runs that broke", ""] + [f"- {r['name']}: {r['error']}" for r in errors] if errors else []
    return "\n".join(head + healthy_tables(results) + [""] + detection_tables(results) + tail) + "\n"


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(render(data["meta"], data["results"]))

"""report.md: the verdict first, then every check, then each gate's evidence."""

from __future__ import annotations

from typing import Any


def fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".") or "0"


def interval(c: dict[str, Any]) -> str:
    return f"[{fmt(c['lo'])}, {fmt(c['hi'])}]" if c.get("lo") is not None else "–"


def checks_table(checks: list[dict[str, Any]]) -> list[str]:
    lines = ["| gate | metric | value | 95% interval | threshold | outcome |", "|---|---|---|---|---|---|"]
    for c in checks:
        sign = "≤" if c["op"] == "max" else "≥"
        thr = f"{sign} {fmt(c['limit'])} ({c['source']})"
        if c.get("min_detectable_effect") is not None:
            thr += f", detects ≥ {fmt(c['min_detectable_effect'])}"
        mark = "PASS" if c["outcome"] == "pass" else "**FAIL**"
        lines.append(f"| {c['gate']} | {c['metric']} | {fmt(c['value'])} | {interval(c)} | {thr} | {mark} |")
    return lines


def estimate(e: dict[str, Any] | None) -> str:
    if not e:
        return "–"
    s = fmt(e.get("value"))
    if e.get("stderr") is not None:
        s += f" ± {fmt(e['stderr'], 2)}"
    return s


def agreement_section(g: dict[str, Any]) -> list[str]:
    d, m = g["details"], g["measurements"]
    lines = [f"Scored {d.get('scored_positions')} positions: {d.get('chunks')} chunks of {d.get('ctx')} tokens, "
             f"second half of each ({d.get('dataset')})."]
    if d.get("shortfall"):
        lines.append(f"Note: {d['shortfall']}.")
    kld = d.get("kld", {})
    lines += ["", "| figure | value |", "|---|---|",
              f"| top-1 agreement | {estimate(m.get('top1'))} |",
              f"| KLD mean | {estimate(kld.get('mean'))} |"]
    for k in ("median", "p90", "p99", "p99.9", "max"):
        lines.append(f"| KLD {k} | {fmt(kld.get(k))} |")
    dp = d.get("delta_p", {})
    lines += [f"| Δp mean | {estimate(dp.get('mean'))} |", f"| Δp RMS | {fmt(dp.get('rms'))} |",
              f"| Δp p1 / p99 | {fmt(dp.get('p1'))} / {fmt(dp.get('p99'))} |"]
    return lines


def generic_section(g: dict[str, Any]) -> list[str]:
    lines = ["| figure | value | 95% interval |", "|---|---|---|"]
    for k, e in g["measurements"].items():
        iv = f"[{fmt(e.get('lo'))}, {fmt(e.get('hi'))}]" if e.get("lo") is not None else "–"
        lines.append(f"| {k} | {estimate(e)} | {iv} |")
    for note in g["details"].get("notes", []):
        lines.append(f"\nNote: {note}")
    return lines


SECTIONS = {"agreement": ("Gate 1 — logits agreement", agreement_section)}


def render_markdown(r: dict[str, Any]) -> str:
    v = r["verdict"]
    cand = r["candidate"]
    out = [f"# qval: {r['name']} — {v['decision']}", ""]
    if r.get("description"):
        out += [r["description"], ""]
    model = r["model"]
    out += [f"- Reference: {model.get('name', '?')} (fingerprint `{str(model.get('fingerprint'))[:12]}`), "
            f"computed in {model.get('compute_dtype', '?')} on {model.get('device', '?')}",
            f"- Candidate: {cand['format']} weights, KV cache {cand['kv_cache']}, excluded {', '.join(cand['exclude']) or 'nothing'}; "
            f"engine {cand['engine'].get('backend')}" + ("" if cand["engine"].get("executed", True) else " (NOT EXECUTED here)"),
            f"- {v['failed_checks']} of {len(v['checks'])} checks failed; run took {r['seconds']} s; created {r['created']}"]
    for note in model.get("notes", []):
        out.append(f"- Note: {note}")
    out += ["", "## Checks", "", *checks_table(v["checks"]), ""]
    fails = [c for c in v["checks"] if c["outcome"] != "pass"]
    if fails:
        out += ["Why it was rejected:", ""] + [f"- {c['gate']}: {c['reason']}" for c in fails] + [""]
    for name, g in r["gates"].items():
        title, render = SECTIONS.get(name, (name, generic_section))
        out += [f"## {title}", ""]
        if g["status"] != "ok":
            out += [f"**{g['status']}**: {g['error']}", ""]
        if g["measurements"]:
            out += render(g) + [""]
    cal = r.get("calibration")
    if cal:
        c = cal.get("calibration", {})
        out += ["## Calibration", "", f"{c.get('samples_used')} samples × {c.get('seq_len')} tokens from {c.get('dataset')}, "
                f"{cal.get('quantizers_enabled')} quantizers enabled, {cal.get('calibration_seconds')} s."]
        if c.get("shortfall"):
            out.append(f"Note: {c['shortfall']}.")
        out.append("")
    out += ["## Stages", "", "| stage | cached | seconds |", "|---|---|---|"]
    out += [f"| {k} | {'yes' if s['cached'] else 'no'} | {s['seconds']} |" for k, s in r["stages"].items()]
    env = r["environment"]
    out += ["", "## Environment", "", ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v), f"device: {env['device']}", ""]
    return "\n".join(out)

"""report.md: the verdict first, then every check, then each gate's evidence."""

from __future__ import annotations

from typing import Any

from .diagnostics_md import diagnostics_markdown
from .numbers import fmt


def interval(c: dict[str, Any]) -> str:
    return f"[{fmt(c['lo'])}, {fmt(c['hi'])}]" if c.get("lo") is not None else "–"


def threshold_text(c: dict[str, Any]) -> str:
    """'≤ 0.037 (sized), detects ≥ 0.049': the limit, and for a sized one the value of the figure
    a candidate must reach to be rejected with the configured power (1 − β)."""
    sign = "≤" if c["op"] == "max" else "≥"
    thr = f"{sign} {fmt(c['limit'])} ({c['source']})"
    if c.get("detectable") is not None:
        thr += f", detects {'≥' if c['op'] == 'max' else '≤'} {fmt(c['detectable'])}"
    elif c.get("min_detectable_effect") is not None:  # reports written before `detectable` existed
        thr += f", detectable effect {fmt(c['min_detectable_effect'])}"
    return thr


def checks_table(checks: list[dict[str, Any]]) -> list[str]:
    lines = ["| gate | metric | value | 95% interval | threshold | outcome |", "|---|---|---|---|---|---|"]
    for c in checks:
        thr = threshold_text(c)
        mark = {"pass": "PASS", "uninformative": "uninformative"}.get(c["outcome"], "**FAIL**")
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


def quality_section(g: dict[str, Any]) -> list[str]:
    d, m = g["details"], g["measurements"]
    ppl, bleu = d.get("ppl", {}), d.get("bleu", {})
    lines = [f"Perplexity over {ppl.get('positions')} positions: {ppl.get('description', ppl.get('windowing'))}.", "",
             "| figure | value | 95% interval |", "|---|---|---|"]
    for key, label in (("ppl_ref", "PPL reference"), ("ppl_cand", "PPL candidate"), ("ppl_ratio", "PPL ratio (paired)")):
        if key in m:
            lines.append(f"| {label} | {estimate(m[key])} | {interval(m[key])} |")
    if not bleu:
        return lines
    ref_gen = bleu.get("reference_generation", {})
    lines += ["", f"BLEU/chrF on {bleu.get('prompts')} prompts of {bleu.get('dataset')} ({bleu.get('rendering')}, "
              f"{bleu.get('decoding')}, at most {bleu.get('max_new_tokens')} new tokens); the reference's generations "
              f"{'came from the shared cache' if ref_gen.get('cached') else 'were generated in this run and cached'}. "
              "Drops are reference − candidate with a paired-bootstrap 95% interval.", "",
              "| lang | n | BLEU ref | BLEU cand | BLEU drop | cand vs ref BLEU | chrF ref | chrF cand | chrF drop |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, grp in bleu.get("groups", {}).items():
        bd, cd = grp.get("bleu_drop", {}), grp.get("chrf_drop", {})
        lines.append(f"| {grp.get('lang', key)} | {grp.get('sentences')} | {fmt(grp.get('bleu_ref'))} | {fmt(grp.get('bleu_cand'))} | "
                     f"{fmt(bd.get('value'))} {interval(bd)} | {fmt(grp.get('bleu_cand_vs_ref'))} | {fmt(grp.get('chrf_ref'))} | "
                     f"{fmt(grp.get('chrf_cand'))} | {fmt(cd.get('value'))} {interval(cd)} |")
    sigs = {s for grp in bleu.get("groups", {}).values() for s in grp.get("signatures", {}).values()}
    lines += ["", "sacrebleu signatures: " + "; ".join(f"`{s}`" for s in sorted(sigs))]
    return lines


def longgen_section(g: dict[str, Any]) -> list[str]:
    d, m = g["details"], g["measurements"]
    ref_gen = d.get("reference_generation", {})
    lines = [f"{d.get('prompts')} prompts ({d.get('rendering')}), {d.get('new_tokens')} new tokens each, greedy, EOS "
             f"{'suppressed' if d.get('suppress_eos') else 'allowed'}; windows of {d.get('window')}, early = first "
             f"{d.get('edge')}, late = last {d.get('edge')} positions. The candidate scored the reference's continuation "
             f"through its KV cache ({d.get('piece')} tokens per piece). Reference generations "
             f"{'from the shared cache' if ref_gen.get('cached') else 'generated in this run and cached'}.", "",
             "| figure | value | 95% interval |", "|---|---|---|"]
    for key, label in (("early_top1", "top-1, early"), ("late_top1", "top-1, late"), ("top1_drift", "top-1 drift (early − late)"),
                       ("early_kld", "mean KLD, early"), ("late_kld", "mean KLD, late"), ("late_drift", "KLD drift (late − early)"),
                       ("seq_rep4_excess", "late seq-rep-4, cand − ref"), ("judge_nll_excess", "late judge NLL, cand − ref"),
                       ("loops_excess", "prompts ending in a loop, cand − ref"), ("premature_eos_excess", "early EOS stops, cand − ref"),
                       ("tf_late_seq_rep4", "late seq-rep-4 of the teacher-forced text (the reference's own)")):
        if key in m:
            lines.append(f"| {label} | {estimate(m[key])} | {interval(m[key])} |")
    lines += ["", f"Loops (period ≤ {d.get('loop_max_period')} through the last {d.get('loop_span')} tokens): reference "
              f"{d.get('ref_loops')}, candidate {d.get('cand_loops')} of {d.get('prompts')} prompts.", "",
              "| window | top-1 | KLD | seq-rep-4 ref / cand | distinct-2 ref / cand | NLL ref / judge cand | loops ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for w in d.get("windows", []):
        lines.append(f"| {w['start']}–{w['end']} | {fmt(w['top1'])} | {fmt(w['kld'])} | {fmt(w['ref_seq_rep4'])} / {fmt(w['cand_seq_rep4'])} | "
                     f"{fmt(w['ref_distinct2'])} / {fmt(w['cand_distinct2'])} | {fmt(w['ref_nll'])} / {fmt(w['cand_judge_nll'])} | "
                     f"{w['ref_loops']} / {w['cand_loops']} |")
    lines += ["", "| prompt | lang | kind | first divergence | late KLD | late seq-rep-4 ref / cand | loop period ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for p in d.get("per_prompt", []):
        lines.append(f"| {p['id']} | {p.get('lang') or '–'} | {p.get('kind') or '–'} | {fmt(p['first_divergence'])} | {fmt(p['late_kld'])} | "
                     f"{fmt(p['ref_late_seq_rep4'])} / {fmt(p['cand_late_seq_rep4'])} | {fmt(p['ref_loop_period'])} / {fmt(p['cand_loop_period'])} |")
    return lines


def depth_section(g: dict[str, Any]) -> list[str]:
    d = g["details"]
    div = d.get("divergence", {})
    first = div.get("first_difference")
    lines = [f"Scored {d.get('scored_positions')} positions: {d.get('chunks')} chunks of {d.get('ctx')} tokens of "
             f"{d.get('dataset')}, every position, both models filling their KV caches {d.get('piece')} tokens at a time.",
             "", "The candidate " + ("reproduces the reference at every depth." if first is None
                                     else f"first departs from the reference (KLD > 1e-6) at depth {first}.")]
    if d.get("shortfall"):
        lines.append(f"Note: {d['shortfall']}.")
    lines += ["", "| depth | positions | top-1 | mean KLD | p99 KLD | Δp mean | NLL ref / cand |", "|---|---|---|---|---|---|---|"]
    for b in d.get("buckets", []):
        k = b.get("kld", {})
        lines.append(f"| {b['label']} | {b['positions']} | {estimate(b.get('top1'))} | {estimate(k.get('mean'))} | {fmt(k.get('p99'))} | "
                     f"{estimate(b.get('delta_p', {}).get('mean'))} | {fmt(b.get('nll_ref'))} / {fmt(b.get('nll_cand'))} |")
    series = div.get("series", [])
    if series:
        lines += ["", f"Per window of {div.get('window')} positions (mean over chunks):", "", "| depth | mean KLD | top-1 |", "|---|---|---|"]
        lines += [f"| {w['start']}–{w['end']} | {fmt(w['kld'])} | {fmt(w['top1'])} |" for w in series]
    return lines


def retrieval_section(g: dict[str, Any]) -> list[str]:
    d, m = g["details"], g["measurements"]
    lines = [f"{d.get('trials')} trials: context lengths {d.get('lengths')} × needle depths {d.get('depths')} × "
             f"{d.get('trials_per_cell')} trials per cell, haystacks from {d.get('haystack')} ({d.get('rendering')}). Both "
             "models score each prompt followed by the true pass code through their KV caches; a model is right when "
             "greedy decoding gives exactly the code. Drop = reference − candidate accuracy, "
             f"{d.get('interval')}.", "",
             "| context | trials | reference | candidate | drop [interval] | detects drops ≥ | flips (right→wrong) | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]
    for x in d.get("per_length", []) + [{"length": "all", **d.get("overall", {}), "n": None}]:
        dr = x.get("drop", {})
        lines.append(f"| {x['length']} | {dr.get('n')} | {fmt(dr.get('ref_accuracy'))} | {fmt(dr.get('cand_accuracy'))} | "
                     f"{fmt(dr.get('drop'))} [{fmt(dr.get('lo'))}, {fmt(dr.get('hi'))}] | {fmt(dr.get('detectable_drop'))} | "
                     f"{x.get('counts', {}).get('ref_only', 0) + x.get('counts', {}).get('cand_only', 0)} "
                     f"({x.get('counts', {}).get('ref_only')}) | {fmt(dr.get('mcnemar_p'))} |")
    depths = d.get("depths", [])
    at = {(c["length"], c["depth"]): c for c in d.get("cells", [])}
    lines += ["", "Right answers per cell, reference / candidate (of the cell's trials):", "",
              "| context \\ depth | " + " | ".join(f"{x:.0%}" for x in depths) + " |", "|---" * (len(depths) + 1) + "|"]
    for L in d.get("lengths", []):
        lines.append(f"| {L} | " + " | ".join(f"{at[(L, x)]['ref_right']} / {at[(L, x)]['cand_right']}" if (L, x) in at else "–"
                                               for x in depths) + " |")
    if "answer_kld" in m:
        lines += ["", f"On the pass-code tokens (teacher-forced): mean KLD {estimate(m['answer_kld'])}, top-1 {estimate(m.get('answer_top1'))}."]
    flips = d.get("flipped", [])
    if flips:
        lines += ["", "Trials the two models answer differently (greedy answers):", "",
                  "| context | depth | key | reference answered | candidate answered | right |", "|---|---|---|---|---|---|"]
        for f in flips:
            lines.append(f"| {f['length']} | {f['depth']:.0%} | {f['key']} | {f.get('ref_answer', '–')!r} | {f.get('cand_answer', '–')!r} | "
                         f"{'reference' if f['ref_right'] else 'candidate'} |")
    return lines


def _cell_text(x: Any, chars: int = 60) -> str:
    """An answer or excerpt for a table cell: one line, pipes escaped, cut to `chars`."""
    t = " ".join(str(x if x is not None else "–").split()).replace("|", "\\|")
    return t if len(t) <= chars else t[: chars - 1] + "…"


def _score_suites(suites: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in suites if s.get("kind") in ("mean", "loglik")]


def lmeval_rows(suites: list[dict[str, Any]]) -> list[list[Any]]:
    """Per lm-eval suite: the task as lm-eval ran it, lm-eval's own figure for each model and
    qval's from the paired documents (the same number when lm-eval averages per document)."""
    out = []
    for s in suites:
        m = s.get("lmeval")
        if not m:
            continue
        shots, limit = m.get("num_fewshot"), m.get("limit")
        how = f"{m.get('output_type')}, {m.get('key')}, {'?' if shots is None else shots}-shot"
        how += "" if limit is None else f", first {limit} documents"
        out.append([s["suite"], f"{m.get('task')} ({how})", s.get("n"), m.get("reference"), m.get("qval_reference"), m.get("candidate"), m.get("qval_candidate"),
                    m.get("lm_eval_version")])
    return out


def tasks_section(g: dict[str, Any]) -> list[str]:
    d = g["details"]
    suites = d.get("suites", [])
    binary = [s for s in suites if s not in _score_suites(suites)]
    lines = [f"Gate 4 took {fmt(g.get('seconds'))} s (reference and candidate). Both models answer every item; a suite "
             "passes when the one-sided upper bound of its drop (reference − candidate: the accuracy, with Newcombe's "
             "paired interval; for a suite scored per document, the metric's paired mean difference or the perplexity's "
             "log ratio, with a normal interval) is within its margin. Every item is in the stage folder's items.jsonl."]
    if d.get("shortfall"):
        lines.append(f"Note: {d['shortfall']}.")
    if binary:
        lines += ["", "| suite | items | chance | reference [Wilson] | candidate [Wilson] | drop [interval] | detects drops ≥ | "
                  "flips (right→wrong) [exact] | McNemar p | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in binary:
        dr = s.get("drop", {})
        ri, ci, fi = dr.get("ref_interval") or [None, None], dr.get("cand_interval") or [None, None], dr.get("flip_interval") or [None, None]
        flips = s["counts"]["ref_only"] + s["counts"]["cand_only"]
        lines.append(f"| {s['suite']} ({s.get('source')}) | {s.get('n')} | {fmt(s.get('chance'))} | {fmt(dr.get('ref_accuracy'))} "
                     f"[{fmt(ri[0])}, {fmt(ri[1])}] | {fmt(dr.get('cand_accuracy'))} [{fmt(ci[0])}, {fmt(ci[1])}] | "
                     f"{fmt(dr.get('drop'))} [{fmt(dr.get('lo'))}, {fmt(dr.get('hi'))}] | {fmt(dr.get('detectable_drop'))} | "
                     f"{flips} ({s['counts']['ref_only']}) [{fmt(fi[0])}, {fmt(fi[1])}] | {fmt(dr.get('mcnemar_p'))} | {fmt(s.get('seconds'))} |")
    scores = _score_suites(suites)
    if scores:
        lines += ["", "Suites scored per document (the drop in the unit named):", "",
                  "| suite | documents | metric | reference | candidate | drop [interval] | unit of the drop | detects drops ≥ | seconds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in scores:
            dr = s.get("drop", {})
            lines.append(f"| {s['suite']} ({s.get('source')}) | {s.get('n')} | {(s.get('lmeval') or {}).get('key', '–')} | "
                         f"{fmt(dr.get('ref_value'))} | {fmt(dr.get('cand_value'))} | {fmt(dr.get('drop'))} "
                         f"[{fmt(dr.get('lo'))}, {fmt(dr.get('hi'))}] | {_cell_text(dr.get('unit'), 90)} | "
                         f"{fmt(dr.get('detectable_drop'))} | {fmt(s.get('seconds'))} |")
    lm = lmeval_rows(suites)
    if lm:
        lines += ["", "lm-evaluation-harness suites: lm-eval's own figure for each model (its results table) beside "
                  "qval's from the paired documents:", "",
                  "| suite | task (output, metric,filter, shots) | documents | lm-eval: reference | qval: reference | "
                  "lm-eval: candidate | qval: candidate | lm-eval |", "|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_cell_text(x, 90) if isinstance(x, str) else fmt(x) for x in row) + " |" for row in lm]
    flips = [f for s in suites for f in s.get("flipped", [])]
    if flips:
        lines += ["", "Items the two models mark differently:", "",
                  "| suite | item | prompt (end) | expected | reference answered | candidate answered | right |",
                  "|---|---|---|---|---|---|---|"]
        for f in flips:
            lines.append(f"| {f['suite']} | {f['id']} | {_cell_text(f.get('excerpt'), 80)} | {_cell_text(f.get('expected'))} | "
                         f"{_cell_text(f.get('ref_answer'))} | {_cell_text(f.get('cand_answer'))} | "
                         f"{'reference' if f['ref_right'] else 'candidate'} |")
    drops = [f for s in scores for f in s.get("largest_drops", [])]
    if drops:
        lines += ["", "Documents whose score dropped most:", "",
                  "| suite | item | text (end) | expected | reference | candidate | drop |", "|---|---|---|---|---|---|---|"]
        for f in drops:
            lines.append(f"| {f['suite']} | {f['id']} | {_cell_text(f.get('excerpt'), 80)} | {_cell_text(f.get('expected'))} | "
                         f"{_cell_text(f.get('ref_answer'))} | {_cell_text(f.get('cand_answer'))} | {fmt(f.get('item_drop'))} |")
    return lines


SECTIONS = {"agreement": ("Gate 1 — logits agreement", agreement_section),
            "depth": ("Gate 1 at depth — long context", depth_section),
            "retrieval": ("Retrieval matrix — context length × needle depth", retrieval_section),
            "quality": ("Gate 2 — perplexity and BLEU/chrF", quality_section),
            "longgen": ("Gate 3 — long-generation stability", longgen_section),
            "tasks": ("Gate 4 — answers, item by item", tasks_section)}


def reference_text(model: dict[str, Any]) -> str:
    fp = str(model.get("fingerprint"))[:12]
    if "name" not in model:
        return f"Reference: fingerprint {fp}, not loaded in this run (every stage reused) and not described by an earlier one"
    text = f"Reference: {model['name']} (fingerprint {fp}), computed in {model.get('compute_dtype', '?')} on {model.get('device', '?')}"
    return text + (" (as described by the run that computed the stages; not loaded in this one)" if model.get("loaded") is False else "")


def runtime_text(r: dict[str, Any]) -> str:
    """'run took 0.04 s (every stage reused from an earlier run, which computed them in 1107 s)':
    a fully cached run must not read as if the gates took no time."""
    text = f"run took {r['seconds']} s"
    stages = r.get("stages") or {}
    reused = [st for st in stages.values() if st.get("cached")]
    if reused:
        earlier = sum(float(st.get("seconds") or 0.0) for st in reused)
        which = "every stage" if len(reused) == len(stages) else f"{len(reused)} of {len(stages)} stages"
        text += f" ({which} reused from an earlier run, which computed {'them' if len(reused) > 1 else 'it'} in {fmt(earlier)} s)"
    return text


def render_markdown(r: dict[str, Any]) -> str:
    v = r["verdict"]
    cand = r["candidate"]
    out = [f"# qval: {r['name']} — {v['decision']}", ""]
    if r.get("description"):
        out += [r["description"], ""]
    model = r["model"]
    out += [f"- {reference_text(model)}",
            f"- Candidate: {cand['format']} weights, KV cache {cand['kv_cache']}, excluded {', '.join(cand['exclude']) or 'nothing'}; "
            f"engine {cand['engine'].get('backend')}" + ("" if cand["engine"].get("executed", True) else " (NOT EXECUTED here)"),
            f"- {v['failed_checks']} of {len(v['checks'])} checks failed"
            + (f", {v['uninformative_checks']} uninformative (the data cannot show a loss there)" if v.get("uninformative_checks") else "")
            + f"; {runtime_text(r)}; created {r['created']}"]
    for note in model.get("notes", []):
        out.append(f"- Note: {note}")
    for note in cand["engine"].get("notes", []):  # what the candidate's engine really ran (e.g. emulated GEMMs)
        out.append(f"- Engine: {note}")
    out += ["", "## Checks", "", *checks_table(v["checks"]), ""]
    fails = [c for c in v["checks"] if c["outcome"] == "fail"]
    if fails:
        out += ["Why it was rejected:", ""] + [f"- {c['gate']}: {c['reason']}" for c in fails] + [""]
    blind = [c for c in v["checks"] if c["outcome"] == "uninformative"]
    if blind:
        out += ["Uninformative (not a pass: this data cannot show a loss):", ""] + [f"- {c['gate']}/{c['metric']}: {c['reason']}" for c in blind] + [""]
    for name, g in r["gates"].items():
        title, render = SECTIONS.get(name, (name, generic_section))
        out += [f"## {title}", ""]
        if g["status"] != "ok":
            out += [f"**{g['status']}**: {g['error']}", ""]
        if g["measurements"]:
            out += render(g) + [""]
    out += diagnostics_markdown(r)
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
    out += ["", "## Environment", "", ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v), f"device: {env['device']}"]
    if numerics := numerics_line(env.get("determinism")):  # GPU runs only: a CPU report reads as before
        out.append(numerics)
    out.append("")
    return "\n".join(out)


def numerics_line(d: dict[str, Any] | None) -> str | None:
    """The GPU numerics a run used, in one line; None where nothing was set (a CPU run).

    >>> numerics_line({"mode": "cpu"}) is None
    True
    >>> numerics_line({"mode": "on", "attention": "no-cudnn", "cublas_workspace_config": ":4096:8"})
    'numerics: deterministic mode (attention no-cudnn, CUBLAS_WORKSPACE_CONFIG :4096:8; qval/determinism.py)'
    """
    if not d or d.get("mode") not in ("on", "off"):
        return None
    if d["mode"] == "off":
        return "numerics: deterministic mode off (QVAL_DETERMINISTIC=0): figures may differ from run to run"
    return (f"numerics: deterministic mode (attention {d.get('attention')}, CUBLAS_WORKSPACE_CONFIG "
            f"{d.get('cublas_workspace_config')}; qval/determinism.py)")

"""report.md: the verdict first, then every check, then each gate's evidence."""

from __future__ import annotations

from typing import Any

from .diagnostics_md import diagnostics_markdown
from .formatting import (CHECK_COLUMNS, DROP_COLUMNS, FLIP_COLUMNS, LMEVAL_COLUMNS, LMEVAL_NOTE, TITLES, answer_text, bracket,
                         calibration_text, candidate_text, check_rows, estimate, failed_text, interval, kld_bound_text,
                         lmeval_rows, numerics_line, reference_text, right, runtime_text, snapshot_text,
                         stage_columns, stage_rows, versions_text)
from .error_rates import SIZE_COLUMN, SIZE_NOTE, file_text, size_cell
from .numbers import fmt
from ..results import (TYPES, AgreementDetails, DepthDetails, ExportFidelityDetails, LonggenDetails, QualityDetails,
                       RetrievalDetails, parse)
from ..results.retrieval import NonInferiority
from ..results.tasks import ScoreDrop, TasksDetails


def table(headers: tuple[str, ...] | list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table; each cell is printed as it is (the caller formats its numbers)."""
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows])


#: how report.md marks a check's outcome (formatting.outcome)
MARKS = {"pass": "PASS", "fail": "**FAIL**", "uninformative": "uninformative"}
CHECK_SHOWN = ("gate", "metric", "value", "95% interval", "threshold", "outcome", SIZE_COLUMN)


def checks_table(checks: list[dict[str, Any]], rates: dict[str, Any] | None = None) -> list[str]:
    rows = [dict(zip(CHECK_COLUMNS, row), **{SIZE_COLUMN: size_cell(c, rates)}) for row, c in zip(check_rows(checks), checks)]
    return table(CHECK_SHOWN, [[fmt(r[k]) if k != "outcome" else MARKS[r[k]] for k in CHECK_SHOWN] for r in rows])


def agreement_section(g: dict[str, Any]) -> list[str]:
    d, m = parse(AgreementDetails, g["details"], "report.json's gate agreement"), g["measurements"]
    lines = [f"Scored {d.scored_positions} positions: {d.chunks} chunks of {d.ctx} tokens, "
             f"second half of each ({d.dataset})."]
    if d.shortfall:
        lines.append(f"Note: {d.shortfall}.")
    kld, dp = d.kld, d.delta_p
    lines += ["", "| figure | value |", "|---|---|",
              f"| top-1 agreement | {estimate(m.get('top1'))} |",
              f"| KLD mean | {estimate(kld.mean)} |"]
    for k, x in (("median", kld.median), ("p90", kld.p90), ("p99", kld.p99), ("p99.9", kld.p99_9), ("max", kld.max)):
        lines.append(f"| KLD {k} | {fmt(x)} |")
    lines += [f"| Δp mean | {estimate(dp.mean)} |", f"| Δp RMS | {fmt(dp.rms)} |",
              f"| Δp p1 / p99 | {fmt(dp.p1)} / {fmt(dp.p99)} |"]
    if bound := kld_bound_text(d):
        lines += ["", bound]
    return lines


def generic_section(g: dict[str, Any]) -> list[str]:
    """A gate without a section of its own, or a typed gate that did not finish: its measurements, and
    the notes its details carry."""
    lines = ["| figure | value | 95% interval |", "|---|---|---|"]
    for k, e in g["measurements"].items():
        lines.append(f"| {k} | {estimate(e)} | {interval(e)} |")
    for note in g["details"].get("notes", []):
        lines.append(f"\nNote: {note}")
    return lines


def export_fidelity_section(g: dict[str, Any]) -> list[str]:
    """The export check: its two counts, and a note per fidelity check that did not pass."""
    d = parse(ExportFidelityDetails, g["details"], "report.json's gate export_fidelity")
    return generic_section({**g, "details": {"notes": d.notes}})


def quality_section(g: dict[str, Any]) -> list[str]:
    d, m = parse(QualityDetails, g["details"], "report.json's gate quality"), g["measurements"]
    ppl, bleu = d.ppl, d.bleu
    lines = [f"Perplexity over {ppl.positions} positions: {ppl.description}.", "",
             "| figure | value | 95% interval |", "|---|---|---|"]
    for key, label in (("ppl_ref", "PPL reference"), ("ppl_cand", "PPL candidate"), ("ppl_ratio", "PPL ratio (paired)")):
        if key in m:
            lines.append(f"| {label} | {estimate(m[key])} | {interval(m[key])} |")
    if bleu is None:
        return lines
    lines += ["", f"BLEU/chrF on {bleu.prompts} prompts of {bleu.dataset} ({bleu.rendering}, "
              f"{bleu.decoding}, at most {bleu.max_new_tokens} new tokens); the reference's generations "
              f"{'came from the shared cache' if bleu.reference_generation.get('cached') else 'were generated in this run and cached'}. "
              "Drops are reference − candidate with a paired-bootstrap 95% interval.", "",
              "| lang | n | BLEU ref | BLEU cand | BLEU drop | cand vs ref BLEU | chrF ref | chrF cand | chrF drop |",
              "|---|---|---|---|---|---|---|---|---|"]
    for grp in bleu.groups.values():
        bd, cd = grp.bleu_drop, grp.chrf_drop
        lines.append(f"| {grp.lang} | {grp.sentences} | {fmt(grp.bleu_ref)} | {fmt(grp.bleu_cand)} | "
                     f"{fmt(bd.get('value'))} {interval(bd)} | {fmt(grp.bleu_cand_vs_ref)} | {fmt(grp.chrf_ref)} | "
                     f"{fmt(grp.chrf_cand)} | {fmt(cd.get('value'))} {interval(cd)} |")
    sigs = {s for grp in bleu.groups.values() for s in grp.signatures.values()}
    lines += ["", "sacrebleu signatures: " + "; ".join(f"`{s}`" for s in sorted(sigs))]
    return lines


def longgen_section(g: dict[str, Any]) -> list[str]:
    d, m = parse(LonggenDetails, g["details"], "report.json's gate longgen"), g["measurements"]
    lines = [f"{d.prompts} prompts ({d.rendering}), {d.new_tokens} new tokens each, greedy, EOS "
             f"{'suppressed' if d.suppress_eos else 'allowed'}; windows of {d.window}, early = first "
             f"{d.edge}, late = last {d.edge} positions. The candidate scored the reference's continuation "
             f"through its KV cache ({d.piece} tokens per piece). Reference generations "
             f"{'from the shared cache' if d.reference_generation.get('cached') else 'generated in this run and cached'}.", "",
             "| figure | value | 95% interval |", "|---|---|---|"]
    for key, label in (("early_top1", "top-1, early"), ("late_top1", "top-1, late"), ("top1_drift", "top-1 drift (early − late)"),
                       ("early_kld", "mean KLD, early"), ("late_kld", "mean KLD, late"), ("late_drift", "KLD drift (late − early)"),
                       ("seq_rep4_excess", "late seq-rep-4, cand − ref"), ("judge_nll_excess", "late judge NLL, cand − ref"),
                       ("loops_excess", "prompts ending in a loop, cand − ref"), ("premature_eos_excess", "early EOS stops, cand − ref"),
                       ("tf_late_seq_rep4", "late seq-rep-4 of the teacher-forced text (the reference's own)")):
        if key in m:
            lines.append(f"| {label} | {estimate(m[key])} | {interval(m[key])} |")
    lines += ["", f"Loops (period ≤ {d.loop_max_period} through the last {d.loop_span} tokens): reference "
              f"{d.ref_loops}, candidate {d.cand_loops} of {d.prompts} prompts.", "",
              "| window | top-1 | KLD | seq-rep-4 ref / cand | distinct-2 ref / cand | NLL ref / judge cand | loops ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for w in d.windows:
        lines.append(f"| {w.start}–{w.end} | {fmt(w.top1)} | {fmt(w.kld)} | {fmt(w.ref_seq_rep4)} / {fmt(w.cand_seq_rep4)} | "
                     f"{fmt(w.ref_distinct2)} / {fmt(w.cand_distinct2)} | {fmt(w.ref_nll)} / {fmt(w.cand_judge_nll)} | "
                     f"{w.ref_loops} / {w.cand_loops} |")
    lines += ["", "| prompt | lang | kind | first divergence | late KLD | late seq-rep-4 ref / cand | loop period ref / cand |",
              "|---|---|---|---|---|---|---|"]
    for p in d.per_prompt:
        lines.append(f"| {p.id} | {p.lang or '–'} | {p.kind or '–'} | {fmt(p.first_divergence)} | {fmt(p.late_kld)} | "
                     f"{fmt(p.ref_late_seq_rep4)} / {fmt(p.cand_late_seq_rep4)} | {fmt(p.ref_loop_period)} / {fmt(p.cand_loop_period)} |")
    return lines


def depth_section(g: dict[str, Any]) -> list[str]:
    d = parse(DepthDetails, g["details"], "report.json's gate depth")
    div, first = d.divergence, d.divergence.first_difference
    lines = [f"Scored {d.scored_positions} positions: {d.chunks} chunks of {d.ctx} tokens of "
             f"{d.dataset}, every position, both models filling their KV caches {d.piece} tokens at a time.",
             "", "The candidate " + ("reproduces the reference at every depth." if first is None
                                     else f"first departs from the reference (KLD > 1e-6) at depth {first}.")]
    if d.shortfall:
        lines.append(f"Note: {d.shortfall}.")
    lines += ["", "| depth | positions | top-1 | mean KLD | p99 KLD | Δp mean | NLL ref / cand |", "|---|---|---|---|---|---|---|"]
    for b in d.buckets:
        lines.append(f"| {b.label} | {b.positions} | {estimate(b.top1)} | {estimate(b.kld.mean)} | {fmt(b.kld.p99)} | "
                     f"{estimate(b.delta_p.mean)} | {fmt(b.nll_ref)} / {fmt(b.nll_cand)} |")
    if div.series:
        lines += ["", f"Per window of {div.window} positions (mean over chunks):", "", "| depth | mean KLD | top-1 |", "|---|---|---|"]
        lines += [f"| {w.start}–{w.end} | {fmt(w.kld)} | {fmt(w.top1)} |" for w in div.series]
    if bound := kld_bound_text(d):
        lines += ["", bound]
    return lines


def retrieval_section(g: dict[str, Any]) -> list[str]:
    d, m = parse(RetrievalDetails, g["details"], "report.json's gate retrieval"), g["measurements"]
    lines = [f"{d.trials} trials: context lengths {d.lengths} × needle depths {d.depths} × "
             f"{d.trials_per_cell} trials per cell, haystacks from {d.haystack} ({d.rendering}). Both "
             "models score each prompt followed by the true pass code through their KV caches; a model is right when "
             "greedy decoding gives exactly the code. Drop = reference − candidate accuracy, "
             f"{d.interval}.", "",
             "| context | trials | reference | candidate | drop [interval] | detects drops ≥ | flips (right→wrong) | McNemar p |",
             "|---|---|---|---|---|---|---|---|"]
    for label, x in [(x.length, x) for x in d.per_length] + [("all", d.overall)]:
        dr, c = x.drop, x.counts
        lines.append(f"| {label} | {dr.n} | {fmt(dr.ref_accuracy)} | {fmt(dr.cand_accuracy)} | "
                     f"{fmt(dr.drop)} {bracket(dr.lo, dr.hi)} | {fmt(dr.detectable_drop)} | "
                     f"{c.ref_only + c.cand_only} ({c.ref_only}) | {fmt(dr.mcnemar_p)} |")
    at = {(c.length, c.depth): c for c in d.cells}
    lines += ["", "Right answers per cell, reference / candidate (of the cell's trials):", "",
              "| context \\ depth | " + " | ".join(f"{x:.0%}" for x in d.depths) + " |", "|---" * (len(d.depths) + 1) + "|"]
    for L in d.lengths:
        lines.append(f"| {L} | " + " | ".join(f"{at[(L, x)].ref_right} / {at[(L, x)].cand_right}" if (L, x) in at else "–"
                                               for x in d.depths) + " |")
    if "answer_kld" in m:
        lines += ["", f"On the pass-code tokens (teacher-forced): mean KLD {estimate(m['answer_kld'])}, top-1 {estimate(m.get('answer_top1'))}."]
    if d.flipped:
        lines += ["", "Trials the two models answer differently (greedy answers):", ""]
        lines += table(("context", "depth", "key", "reference answered", "candidate answered", "right"),
                       [[f.length, f"{f.depth:.0%}", f.key, repr(answer_text(f.ref_answer)),
                         repr(answer_text(f.cand_answer)), right(f.ref_right)] for f in d.flipped])
    return lines


def _cell_text(x: Any, chars: int = 60) -> str:
    """An answer or excerpt for a table cell: one line, pipes escaped, cut to `chars`."""
    t = " ".join(str(x if x is not None else "–").split()).replace("|", "\\|")
    return t if len(t) <= chars else t[: chars - 1] + "…"


def tasks_section(g: dict[str, Any]) -> list[str]:
    d = parse(TasksDetails, g["details"], "report.json's gate tasks")
    binary, scores = d.split()
    lines = [f"Gate 4 took {fmt(g.get('seconds'))} s (reference and candidate). Both models answer every item; a suite "
             "passes when the one-sided upper bound of its drop (reference − candidate: the accuracy, with Newcombe's "
             "paired interval; for a suite scored per document, the metric's paired mean difference or the perplexity's "
             "log ratio, with a normal interval) is within its margin. Every item is in the stage folder's items.jsonl."]
    if d.shortfall:
        lines.append(f"Note: {d.shortfall}.")
    if binary:
        lines += ["", "| suite | items | chance | reference [Wilson] | candidate [Wilson] | drop [interval] | detects drops ≥ | "
                  "flips (right→wrong) [exact] | McNemar p | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in binary:
        dr, c = s.drop, s.counts
        assert isinstance(dr, NonInferiority) and c is not None  # a right/wrong suite's figures (Suite's validator)
        lines.append(f"| {s.suite} ({s.source}) | {s.n} | {fmt(s.chance)} | {fmt(dr.ref_accuracy)} "
                     f"{bracket(*dr.ref_interval)} | {fmt(dr.cand_accuracy)} {bracket(*dr.cand_interval)} | "
                     f"{fmt(dr.drop)} {bracket(dr.lo, dr.hi)} | {fmt(dr.detectable_drop)} | "
                     f"{c.ref_only + c.cand_only} ({c.ref_only}) {bracket(*dr.flip_interval)} | {fmt(dr.mcnemar_p)} | {fmt(s.seconds)} |")
    if scores:
        lines += ["", "Suites scored per document (the drop in the unit named):", "",
                  "| suite | documents | metric | reference | candidate | drop [interval] | unit of the drop | detects drops ≥ | seconds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in scores:
            sd = s.drop
            assert isinstance(sd, ScoreDrop)
            lines.append(f"| {s.suite} ({s.source}) | {s.n} | {s.lmeval.key if s.lmeval else '–'} | "
                         f"{fmt(sd.ref_value)} | {fmt(sd.cand_value)} | {fmt(sd.drop)} "
                         f"{bracket(sd.lo, sd.hi)} | {_cell_text(sd.unit, 90)} | "
                         f"{fmt(sd.detectable_drop)} | {fmt(s.seconds)} |")
    lm = lmeval_rows(d.suites)
    if lm:
        lines += ["", LMEVAL_NOTE + ":", ""]
        lines += table(LMEVAL_COLUMNS, [[_cell_text(x, 90) if isinstance(x, str) else fmt(x) for x in row] for row in lm])
    flips = [f for s in d.suites for f in s.flipped]
    if flips:
        lines += ["", "Items the two models mark differently:", ""]
        lines += table(FLIP_COLUMNS, [[f.suite, f.id, _cell_text(f.excerpt, 80), _cell_text(f.expected),
                                       _cell_text(f.ref_answer), _cell_text(f.cand_answer), right(bool(f.ref_right))] for f in flips])
    drops = [f for s in scores for f in s.largest_drops or []]
    if drops:
        lines += ["", "Documents whose score dropped most:", ""]
        lines += table(DROP_COLUMNS, [[f.suite, f.id, _cell_text(f.excerpt, 80), _cell_text(f.expected),
                                       _cell_text(f.ref_answer), _cell_text(f.cand_answer), fmt(f.item_drop)]
                                      for f in drops])
    return lines


#: each gate's evidence; a gate not named here shows its measurements (generic_section)
SECTIONS = {"agreement": agreement_section, "depth": depth_section, "retrieval": retrieval_section,
            "quality": quality_section, "longgen": longgen_section, "tasks": tasks_section,
            "export_fidelity": export_fidelity_section}


def render_markdown(r: dict[str, Any]) -> str:
    v = r["verdict"]
    cand = r["candidate"]
    out = [f"# qval: {r['name']} — {v['decision']}", ""]
    if r.get("description"):
        out += [r["description"], ""]
    model = r["model"]
    out += [f"- {reference_text(model)}",
            f"- {candidate_text(cand)}" + ("" if cand["engine"].get("executed", True) else " (NOT EXECUTED here)"),
            f"- {failed_text(v)}"
            + (f", {v['uninformative_checks']} uninformative (the data cannot show a loss there)" if v.get("uninformative_checks") else "")
            + f"; {runtime_text(r)}; created {r['created']}"]
    if snap := snapshot_text(model):
        out.append(f"- {snap}")
    for note in model.get("notes", []):
        out.append(f"- Note: {note}")
    for note in cand["engine"].get("notes", []):  # what the candidate's engine really ran (e.g. emulated GEMMs)
        out.append(f"- Engine: {note}")
    out += ["", "## Checks", "", *checks_table(v["checks"], r.get("error_rates")), ""]
    if "error_rates" in r:  # reports written before the error rates were stated have no such section
        out += [SIZE_NOTE, file_text(r["error_rates"]), ""]
    fails = [c for c in v["checks"] if c["outcome"] == "fail"]
    if fails:
        out += ["Why it was rejected:", ""] + [f"- {c['gate']}: {c['reason']}" for c in fails] + [""]
    blind = [c for c in v["checks"] if c["outcome"] == "uninformative"]
    if blind:
        out += ["Uninformative (not a pass: this data cannot show a loss):", ""] + [f"- {c['gate']}/{c['metric']}: {c['reason']}" for c in blind] + [""]
    for name, g in r["gates"].items():
        # a typed gate's section reads its finished details; an unfinished result (error, non-finite) has only
        # what the gate knew before it stopped: its measurements as they are
        render = SECTIONS.get(name, generic_section) if name not in TYPES or g["status"] == "ok" else generic_section
        out += [f"## {TITLES.get(name, name)}", ""]
        if g["status"] != "ok":
            out += [f"**{g['status']}**: {g['error']}", ""]
        if g["measurements"]:
            out += render(g) + [""]
    out += diagnostics_markdown(r)
    cal = r.get("calibration")
    if cal:
        out += ["## Calibration", "", calibration_text(cal)]
        if (cal.get("calibration") or {}).get("shortfall"):
            out.append(f"Note: {cal['calibration']['shortfall']}.")
        out.append("")
    out += ["## Stages", "", *table(stage_columns(r["stages"]), stage_rows(r["stages"]))]
    env = r["environment"]
    out += ["", "## Environment", "", versions_text(env), f"device: {env['device']}"]
    if numerics := numerics_line(env.get("determinism")):  # GPU runs only: a CPU report reads as before
        out.append(numerics)
    out.append("")
    return "\n".join(out)


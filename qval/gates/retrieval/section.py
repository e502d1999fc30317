"""The retrieval matrix: report.md's per-length table, the right answers per cell and the flipped trials,
report.html's three heatmaps; both read `RetrievalDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report import charts
from ...report.formatting import answer_text, bracket, estimate, right
from ...report.html_parts import figure, table as html_table
from ...report.md_parts import table
from ...report.numbers import fmt
from ...results import parse
from .result import RetrievalDetails


def markdown(g: dict[str, Any]) -> list[str]:
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


def html(g: dict[str, Any]) -> str:
    """The retrieval matrix as three heatmaps (length × depth): reference, candidate, difference."""
    d = parse(RetrievalDetails, g["details"], "report.json's gate retrieval") if g.get("status") == "ok" else None
    if d is None or not d.cells:
        return '<p class="note">No retrieval cells in this gate\'s details.</p>'
    at = {(c.length, c.depth): c for c in d.cells}

    def grid(side: str) -> list[list[float | None]]:
        return [[getattr(at[(L, x)], side) / at[(L, x)].n if (L, x) in at and at[(L, x)].n else None for x in d.depths]
                for L in d.lengths]

    ref, cand = grid("ref_right"), grid("cand_right")
    diff = [[(c - r) if r is not None and c is not None else None for r, c in zip(rr, cc)] for rr, cc in zip(ref, cand)]
    rows, cols = [str(L) for L in d.lengths], [f"{x:.0%}" for x in d.depths]
    out = [figure(charts.heatmap(rows, cols, ref, "Reference accuracy", "needle depth", "context tokens"), "reference accuracy"),
           figure(charts.heatmap(rows, cols, cand, "Candidate accuracy", "needle depth", "context tokens"), "candidate accuracy"),
           figure(charts.heatmap(rows, cols, diff, "Candidate − reference", "needle depth", "context tokens", -1.0, 1.0,
                                 diverging=True), "accuracy difference", "red: the candidate loses trials the reference solves")]
    if d.flipped:
        out.append(html_table(["length", "depth", "key", "reference answer", "candidate answer", "right"],
                         ([f.length, f"{f.depth:.0%}", f.key, answer_text(f.ref_answer), answer_text(f.cand_answer), right(f.ref_right)]
                          for f in d.flipped)))
    return "".join(out)

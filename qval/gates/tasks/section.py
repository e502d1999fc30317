"""Gate 4 — answers, item by item: report.md's tables per kind of suite (right/wrong marks, scores), lm-eval's
own figures, the flipped items and the largest drops; report.html's accuracy bars and the same tables; both read
`TasksDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report import charts
from ...report.formatting import (DROP_COLUMNS, FLIP_COLUMNS, LMEVAL_COLUMNS, LMEVAL_NOTE, answer_text, bracket,
                                  lmeval_rows, right)
from ...report.html_parts import figure, num, table as html_table
from ...report.md_parts import cell_text, table
from ...report.numbers import fmt
from ...results import parse
from .result import TasksDetails


def markdown(g: dict[str, Any]) -> list[str]:
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
        dr, c = s.marks
        lines.append(f"| {s.suite} ({s.source}) | {s.n} | {fmt(s.chance)} | {fmt(dr.ref_accuracy)} "
                     f"{bracket(*dr.ref_interval)} | {fmt(dr.cand_accuracy)} {bracket(*dr.cand_interval)} | "
                     f"{fmt(dr.drop)} {bracket(dr.lo, dr.hi)} | {fmt(dr.detectable_drop)} | "
                     f"{c.ref_only + c.cand_only} ({c.ref_only}) {bracket(*dr.flip_interval)} | {fmt(dr.mcnemar_p)} | {fmt(s.seconds)} |")
    if scores:
        lines += ["", "Suites scored per document (the drop in the unit named):", "",
                  "| suite | documents | metric | reference | candidate | drop [interval] | unit of the drop | detects drops ≥ | seconds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in scores:
            sd = s.score
            lines.append(f"| {s.suite} ({s.source}) | {s.n} | {s.lmeval.key if s.lmeval else '–'} | "
                         f"{fmt(sd.ref_value)} | {fmt(sd.cand_value)} | {fmt(sd.drop)} "
                         f"{bracket(sd.lo, sd.hi)} | {cell_text(sd.unit, 90)} | "
                         f"{fmt(sd.detectable_drop)} | {fmt(s.seconds)} |")
    lm = lmeval_rows(d.suites)
    if lm:
        lines += ["", LMEVAL_NOTE + ":", ""]
        lines += table(LMEVAL_COLUMNS, [[cell_text(x, 90) if isinstance(x, str) else fmt(x) for x in row] for row in lm])
    flips = [f for s in d.suites for f in s.flipped]
    if flips:
        lines += ["", "Items the two models mark differently:", ""]
        lines += table(FLIP_COLUMNS, [[f.suite, f.id, cell_text(f.excerpt, 80), cell_text(f.expected),
                                       cell_text(f.ref_answer), cell_text(f.cand_answer), right(bool(f.ref_right))] for f in flips])
    drops = [f for s in scores for f in s.largest_drops or []]
    if drops:
        lines += ["", "Documents whose score dropped most:", ""]
        lines += table(DROP_COLUMNS, [[f.suite, f.id, cell_text(f.excerpt, 80), cell_text(f.expected),
                                       cell_text(f.ref_answer), cell_text(f.cand_answer), fmt(f.item_drop)]
                                      for f in drops])
    return lines


def html(g: dict[str, Any]) -> str:
    """Gate 4: both accuracies per right/wrong suite with their Wilson intervals, the suites scored
    per document, lm-eval's own figures beside qval's, the flipped items and the largest drops."""
    d = parse(TasksDetails, g["details"], "report.json's gate tasks") if g.get("status") == "ok" else None
    if d is None or not d.suites:
        return '<p class="note">No task suites in this gate\'s details.</p>'
    binary, scores = d.split()
    out = []
    if binary:
        marks = [s.marks for s in binary]
        bars = []
        for s, (dr, _) in zip(binary, marks):
            for who, acc, (lo, hi) in (("reference", dr.ref_accuracy, dr.ref_interval[:2]),
                                       ("candidate", dr.cand_accuracy, dr.cand_interval[:2])):
                bars.append((f"{s.suite} · {who}", num(acc), num(lo), num(hi)))
        out.append(figure(charts.interval_bars([b for b in bars if b[1] is not None], "Accuracy per suite", "accuracy (Wilson 95% interval)"),
                          "accuracy per suite", f"gate 4 took {fmt(num(g.get('seconds')))} s; chance per suite: "
                          + ", ".join(f"{s.suite} {fmt(num(s.chance))}" for s in binary)))
        out.append(html_table(["suite", "source", "items", "reference", "candidate", "drop", "upper bound", "detects ≥", "flips (right→wrong)",
                          "McNemar p", "seconds"],
                         ([s.suite, s.source, s.n, dr.ref_accuracy, dr.cand_accuracy, dr.drop, dr.hi, dr.detectable_drop,
                           f"{c.ref_only + c.cand_only} ({c.ref_only})", dr.mcnemar_p, s.seconds] for s, (dr, c) in zip(binary, marks)),
                         [2, 3, 4, 5, 6, 7, 9, 10]))
    if scores:
        out.append('<p class="note">Suites scored per document: the drop is in the unit named.</p>')
        out.append(html_table(["suite", "source", "documents", "metric", "reference", "candidate", "drop", "upper bound", "unit", "detects ≥", "seconds"],
                         ([s.suite, s.source, s.n, s.lmeval.key if s.lmeval else "–", sd.ref_value, sd.cand_value, sd.drop, sd.hi, sd.unit,
                           sd.detectable_drop, s.seconds] for s, sd in zip(scores, [s.score for s in scores])), [2, 4, 5, 6, 7, 9, 10]))
    lm = lmeval_rows(d.suites)
    if lm:
        out.append(f'<p class="note">{LMEVAL_NOTE}.</p>')
        out.append(html_table(LMEVAL_COLUMNS, lm, [2, 3, 4, 5, 6]))
    flips = [f for s in d.suites for f in s.flipped]
    if flips:
        out.append(html_table(FLIP_COLUMNS, ([f.suite, f.id, f.excerpt or "", f.expected or "", answer_text(f.ref_answer),
                                        answer_text(f.cand_answer), right(bool(f.ref_right))] for f in flips)))
    largest = [f for s in scores for f in s.largest_drops or []]
    if largest:
        out.append(html_table(DROP_COLUMNS, ([f.suite, f.id, f.excerpt or "", f.expected or "", answer_text(f.ref_answer),
                           answer_text(f.cand_answer), f.item_drop] for f in largest), [6]))
    return "".join(out)

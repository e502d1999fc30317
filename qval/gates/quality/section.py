"""Gate 2 — perplexity and BLEU/chrF: report.md's perplexity figures and BLEU/chrF per language (report.html
shows its measurements only); reads `QualityDetails`.
"""

from __future__ import annotations

from typing import Any

from ...report.formatting import estimate, interval
from ...report.numbers import fmt
from ...results import parse
from .result import QualityDetails


def markdown(g: dict[str, Any]) -> list[str]:
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

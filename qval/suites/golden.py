"""The user's own items: a JSONL file, one question per line, in one of two forms.

    {"id": "q1", "prompt": "Capital of France?", "answer": "Paris", "match": "exact"}
    {"id": "q2", "prompt": "2 + 2 =", "answer": "4", "match": "numeric", "tolerance": 0}
    {"id": "q3", "prompt": "The sky is", "choices": ["blue", "green"], "label": 0}

`match` is exact (default), contains, regex or numeric; a choice item is answered by summed
log-probability. Prompts are a user turn of the tokenizer's chat template (with the assistant's
opening), as `qval.reference.render_prompts` renders them, or raw text without a template.
"""

from __future__ import annotations

from typing import Any, Callable

from ..data import _read_jsonl
from ..errors import DataError
from ..reference import render_prompts
from .base import SUITES, Item, excerpt
from .builtin import split_continuation
from .scoring import MATCHERS


def _check(path: Any, n: int, r: dict[str, Any]) -> str:
    where = f"{path}: item {n}"
    if not isinstance(r.get("prompt"), str) or not r["prompt"]:
        raise DataError(f"{where}: needs a non-empty string 'prompt'.")
    if "choices" in r:
        ch = r["choices"]
        if not isinstance(ch, list) or len(ch) < 2 or not all(isinstance(c, str) and c for c in ch):
            raise DataError(f"{where}: 'choices' must be a list of two or more non-empty strings.")
        if not isinstance(r.get("label"), int) or isinstance(r["label"], bool) or not 0 <= r["label"] < len(ch):
            raise DataError(f"{where}: 'label' must be the index (0 to {len(ch) - 1}) of the right choice.")
        return "choice"
    if not isinstance(r.get("answer"), (str, int, float)) or isinstance(r.get("answer"), bool):
        raise DataError(f"{where}: needs an 'answer' (for a generated answer) or 'choices' and 'label' (multiple choice).")
    match = r.get("match", "exact")
    if match not in MATCHERS:
        raise DataError(f"{where}: {MATCHERS.unknown_message(str(match))}")
    tol = r.get("tolerance", 0.0)
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or tol < 0:
        raise DataError(f"{where}: 'tolerance' must be a number >= 0.")
    if "tolerance" in r and match != "numeric":
        raise DataError(f"{where}: 'tolerance' applies to match numeric only.")
    return "generate"


def rendered(tokenizer: Any, prompt: str) -> str:
    """The prompt's text as the model reads it: as `render_prompts`, kept as text so a choice
    can follow it (after the assistant's opening, or after a space without a template)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return prompt


@SUITES.register("golden")
def golden(suite: Any, tokenizer: Any, resolve: Callable[[str], Any], seed: int) -> list[Item]:
    path = resolve(suite.golden)
    if not path.is_file():
        raise DataError(f"{suite.golden}: no such golden file (looked at {path}).")
    records = _read_jsonl(path)
    if not records:
        raise DataError(f"{suite.golden}: the golden file is empty.")
    kinds = [_check(suite.golden, n, r) for n, r in enumerate(records, 1)]
    ids = [str(r.get("id", n)) for n, r in enumerate(records, 1)]
    if len(set(ids)) != len(ids):
        raise DataError(f"{suite.golden}: item ids must be distinct; {sorted({i for i in ids if ids.count(i) > 1})[:5]} repeat.")
    gen = [r["prompt"] for r, k in zip(records, kinds) if k == "generate"]
    gen_ids = iter(render_prompts(tokenizer, gen)[0]) if gen else iter(())
    sep = "" if getattr(tokenizer, "chat_template", None) else " "
    items = []
    for item_id, r, kind in zip(ids, records, kinds):
        if kind == "generate":
            items.append(Item(id=item_id, kind="generate", prompt=next(gen_ids), excerpt=excerpt(r["prompt"]),
                              answer=str(r["answer"]), match=r.get("match", "exact"), tolerance=float(r.get("tolerance", 0.0))))
            continue
        head, conts = rendered(tokenizer, r["prompt"]), []
        prompt: list[int] = []
        for c in r["choices"]:
            prompt, cont = split_continuation(tokenizer, head, sep + c, special=bool(sep))
            conts.append(cont)
        items.append(Item(id=item_id, kind="choice", prompt=prompt, excerpt=excerpt(r["prompt"]), choices=conts,
                          choice_texts=list(r["choices"]), label=r["label"]))
    return items

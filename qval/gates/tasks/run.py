"""Gate 4 — answers, item by item: both models answer the same items, each marked right or wrong.

Suites (`qval/suites/`) give items of three forms. A `word` item (cloze) and a `choice` item are
scored teacher-forced through each engine's KV cache (`logits_pieces`), so a quantized KV cache is
exercised: a word is right when greedy decoding gives exactly it (every token the argmax, then
the word ends); a choice is the continuation with the highest summed log-probability. A
`generate` item is answered greedily and marked by its matcher. Every item (id, excerpt, both
answers, both marks) goes to the stage folder's items.jsonl.

An `lm_eval` suite runs an lm-evaluation-harness task through lm-eval's own API on each engine
(qval/suites/lmeval.py) and pairs the two runs' per-document marks: right/wrong for a metric such
as acc or exact_match, a per-document score (paired mean difference) or a perplexity (the
log-likelihood lost per word or byte) otherwise. lm-eval's own figure for each model is kept in
the suite's details beside qval's paired ones.

Per suite (its figures: qval/gates/tasks/judge.py), the rule is non-inferiority: the one-sided (1 − α)
upper bound of the accuracy drop (Newcombe's paired interval; for scores, the normal interval of
the paired difference) must not exceed the suite's margin; an optional limit on the flip rate is
met by its exact upper bound. A suite whose reference is not clearly above chance is
"uninformative", never a pass.
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from ...config import GateConfig
from ...data import dataset_identity
from ...engines.concurrent import side_by_side
from ...errors import ConfigError, DataError
from ...io import atomic_write_text, file_fingerprint, tree_fingerprint
from ...logits import all_finite, cat
from ...progress import SILENT
from ...snapshot.engine import NOT_IN_MEMORY, ReferenceAbsent
from ...suites import lmeval, lmeval_task
from ...suites.base import OPEN_CHANCE, SUITES, Item
from ...suites.scoring import MATCHERS, continuation_logprob, pick, word_mark
from ...verdict import GateResult
from ..base import GateContext, GateSpec, candidate_dependent
from .config import TaskSuite
from .judge import enabled, summarize, thresholds
from .metrics import TASKS

WORD_SHOWN = 6  # greedy tokens decoded to show what a model answered on a flipped cloze item


class NonFinite(Exception):
    def __init__(self, who: str, item: Item | str) -> None:
        super().__init__(f"the {who} produced non-finite logits on item {getattr(item, 'id', item)}")
        self.who = who


def build_items(ctx: GateContext, suite: TaskSuite) -> list[Item]:
    builder = SUITES.get("golden" if suite.golden else str(suite.builtin))
    items = builder(suite, ctx.tokenizer, ctx.config.resolve, ctx.config.seed)
    if not items:
        raise DataError(f"gates.tasks suite {suite.label}: no items could be built from {suite.golden or suite.dataset}; "
                        "give a file with (more) English prose, or a golden file with items.")
    return items


def forced(engine: Any, prompt: list[int], cont: list[int], rows: int, piece: int) -> torch.Tensor:
    """Logits [rows, V] from the row predicting cont[0] on (prompt + cont through the KV cache)."""
    ids = prompt + cont
    first = len(prompt) - 1
    parts = [x[0].float() for x in engine.logits_pieces(torch.tensor([ids]), piece)]
    out = cat(parts)  # raw logits, or compact (the snapshot's reference, a served candidate)
    return out[first : first + rows]


def _finite(who: str, item: Item, x: Any) -> None:
    if not all_finite(x):
        raise NonFinite(who, item)


def score_word(ctx: GateContext, item: Item, piece: int) -> dict[str, Any]:
    out = {}
    for who, engine in (("reference", ctx.reference), ("candidate", ctx.candidate)):
        # the word's tokens, then one more position: the token after the word must end it
        lg = forced(engine, item.prompt, item.target, len(item.target) + 1, piece)
        _finite(who, item, lg)
        right, said = word_mark(lg, item.target, lambda t: ctx.tokenizer.decode([t]))
        out[who] = (right, ctx.tokenizer.decode(said).strip())
    return {"ref_right": out["reference"][0], "cand_right": out["candidate"][0],
            "ref_answer": out["reference"][1], "cand_answer": out["candidate"][1]}


def score_choice(ctx: GateContext, item: Item, piece: int) -> dict[str, Any]:
    out = {}
    for who, engine in (("reference", ctx.reference), ("candidate", ctx.candidate)):
        scores = []
        for c in item.choices:
            lg = forced(engine, item.prompt, c, len(c), piece)
            _finite(who, item, lg)
            scores.append(continuation_logprob(lg, c))
        out[who] = (pick(scores), scores)
    (r, rs), (c, cs) = out["reference"], out["candidate"]
    return {"ref_right": r == item.label, "cand_right": c == item.label, "ref_answer": item.choice_texts[r],
            "cand_answer": item.choice_texts[c], "ref_pick": r, "cand_pick": c, "ref_logprobs": rs, "cand_logprobs": cs}


def score_generated(ctx: GateContext, items: list[Item], new_tokens: int, batch: int) -> list[dict[str, Any]]:
    prompts = [it.prompt for it in items]
    engines = [ctx.reference, ctx.candidate]
    # the two models' answers are independent: on a CPU they decode side by side (engines/concurrent.py)
    gens, _ = side_by_side([lambda e=e: e.generate(prompts, new_tokens, suppress_eos=False, batch_size=batch) for e in engines], engines)
    answers = {}
    for who, gen in zip(("reference", "candidate"), gens):
        for it, bad in zip(items, gen.first_nonfinite_step):
            if bad is not None:
                raise NonFinite(who, it)
        answers[who] = [ctx.tokenizer.decode(t, skip_special_tokens=True) for t in gen.tokens]
    rows = []
    for it, ra, ca in zip(items, answers["reference"], answers["candidate"]):
        m = MATCHERS.get(it.match)
        rows.append({"ref_right": m(ra, it.answer, it.tolerance), "cand_right": m(ca, it.answer, it.tolerance),
                     "ref_answer": ra, "cand_answer": ca})
    return rows


def _greedy_answers(ctx: GateContext, items: list[Item], rows: list[dict[str, Any]]) -> None:
    """What each model actually says on the flipped cloze items (teacher forcing stops at the
    first wrong token): a few greedy tokens from each."""
    flipped = [i for i, (it, r) in enumerate(zip(items, rows)) if it.kind == "word" and r["ref_right"] != r["cand_right"]]
    if not flipped:
        return
    prompts = [items[i].prompt for i in flipped]
    for key, engine in (("ref_answer", ctx.reference), ("cand_answer", ctx.candidate)):
        try:
            with candidate_dependent(ctx):  # which items to answer depends on the candidate
                texts = [ctx.tokenizer.decode(t, skip_special_tokens=True)
                         for t in engine.generate(prompts, WORD_SHOWN, suppress_eos=False, batch_size=1).tokens]
        except ReferenceAbsent:  # a sequential run's candidate phase: the marks stand, the text is not shown
            texts = [NOT_IN_MEMORY] * len(prompts)
        for k, i in enumerate(flipped):
            rows[i][key] = texts[k]


def chance_of(items: list[Item]) -> float:
    """A suite's guessing accuracy when its config sets no `chance`: 1/choices (averaged over the
    choice items), OPEN_CHANCE for an open answer."""
    if not items:
        return OPEN_CHANCE
    return sum(1.0 / len(it.choices) if it.kind == "choice" else OPEN_CHANCE for it in items) / len(items)


def run_suite(ctx: GateContext, suite: TaskSuite, advance: Any) -> tuple[list[Item], list[dict[str, Any]]]:
    g = ctx.config.gates.tasks
    items = build_items(ctx, suite)
    rows: list[dict[str, Any] | None] = [None] * len(items)
    for i, it in enumerate(items):
        if it.kind == "word":
            rows[i] = score_word(ctx, it, g.piece)
        elif it.kind == "choice":
            rows[i] = score_choice(ctx, it, g.piece)
    gen = [i for i, it in enumerate(items) if it.kind == "generate"]
    if gen:
        for i, r in zip(gen, score_generated(ctx, [items[i] for i in gen], suite.max_new_tokens, g.batch_size)):
            rows[i] = r
    done = [r for r in rows if r is not None]
    _greedy_answers(ctx, items, done)
    advance(1)
    return items, done


def lmeval_max_length(ctx: GateContext, suite: TaskSuite) -> int:
    """The context of an lm-eval suite: its max_length, else the reference's positions as lm-eval's
    HFLM reads them (n_positions, max_position_embeddings or n_ctx; 2048 when none is given)."""
    if suite.max_length is not None:
        return suite.max_length
    from lm_eval.models.utils import resolve_max_length

    config = ctx.reference.model_config
    return resolve_max_length(config, ctx.tokenizer, default=2048)


def run_lmeval_suite(ctx: GateContext, suite: TaskSuite) -> dict[str, Any]:
    """One lm-eval task on both engines, paired by document: the suite's entry with its rows."""
    lmeval_task.require(suite)
    from ...suites.lmeval_lm import EngineLM, NonFiniteLogits

    g = ctx.config.gates.tasks
    length = lmeval_max_length(ctx, suite)
    results, how, task, note = {}, None, None, None
    for who, engine in (("reference", ctx.reference), ("candidate", ctx.candidate)):
        tm, task = lmeval_task.load_task(suite, ctx.config.resolve)  # a fresh task per model: lm-eval keeps state in it
        if how is None:
            how = lmeval.pick_metric(suite, task)
            where = f"gates.tasks.suites[{g.suites.index(suite)}].limit"
            note = lmeval.limit_note(suite, task, where, ctx.config.max_shortfall)
        try:
            # lm-eval scores options beyond its input (one-token choices share one context), which the
            # snapshot's compact rows do not hold: its suites run on the reference model itself
            real = getattr(engine, "real", engine)
            if real is None:
                raise ConfigError(f"gates.tasks suite {suite.label}: an lm-eval suite needs the reference model in "
                                  "memory beside the candidate; a sequential run (snapshot.sequential: true) cannot run "
                                  "it: set snapshot.sequential: false or drop the suite.")
            results[who] = lmeval.evaluate(EngineLM(real, ctx.tokenizer, who, length, g.batch_size, g.piece), suite, tm, task)
        except NonFiniteLogits as err:
            raise NonFinite(err.who, f"document {err.doc_id}") from None
    kind, rows = lmeval.pair_rows(suite, task, how, results["reference"], results["candidate"])
    if kind == "binary" and suite.margin > 1:
        raise ConfigError(f"gates.tasks suite {suite.label}: margin {suite.margin} is an accuracy drop (metric "
                          f"{how['metric']} marks right/wrong), a fraction: it must be at most 1.")
    if kind != "binary" and suite.max_flip_rate is not None:
        raise ConfigError(f"gates.tasks suite {suite.label}: metric {how['metric']} of task {suite.lm_eval} is a score, "
                          "not right/wrong marks: max_flip_rate does not apply; remove it.")
    cfg = task.config
    info = {**how, "task": task.task_name, "output_type": task.OUTPUT_TYPE, "lm_eval_version": lmeval_task.version(),
            "task_version": (getattr(cfg, "metadata", None) or {}).get("version"),
            "num_fewshot": results["reference"].get("n-shot", {}).get(task.task_name),
            "limit": suite.limit, "include_path": suite.include_path, "max_length": length,
            "reference": lmeval.figure(how, results["reference"], task),
            "candidate": lmeval.figure(how, results["candidate"], task)}
    return {"suite": suite.label, "source": f"lm-eval:{suite.lm_eval}", "kinds": [task.OUTPUT_TYPE], "kind": kind,
            "output_type": task.OUTPUT_TYPE, "default_chance": lmeval.default_chance(task, results["reference"], how["filter"]),
            "lmeval": info, "rows": rows, **({"shortfall": note} if note else {})}


def run(ctx: GateContext) -> GateResult:
    t0 = time.perf_counter()
    g = ctx.config.gates.tasks
    suites, lines = [], []
    with (ctx.progress or SILENT).task(f"tasks: {len(g.suites)} suite(s)", len(g.suites)) as advance:
        for suite in g.suites:
            s0 = time.perf_counter()
            try:
                if suite.lm_eval is not None:
                    entry = run_lmeval_suite(ctx, suite)
                    advance(1)
                    lines += [json.dumps({"suite": suite.label, "kind": f"lm-eval:{entry['output_type']}", **r},
                                         ensure_ascii=False) for r in entry["rows"]]
                    suites.append({**entry, "seconds": round(time.perf_counter() - s0, 2)})
                    continue
                items, rows = run_suite(ctx, suite, advance)
            except NonFinite as err:
                status = "error" if err.who == "reference" else "nonfinite"
                return GateResult("tasks", status, details={"suites": suites}, seconds=time.perf_counter() - t0,
                                  error=f"{err} (suite {suite.label})")
            for it, r in zip(items, rows):
                lines.append(json.dumps({"suite": suite.label, "id": it.id, "kind": it.kind, "excerpt": it.excerpt,
                                         "expected": it.expected, **({"choices": it.choice_texts} if it.kind == "choice" else {}),
                                         **r}, ensure_ascii=False))
            suites.append({"suite": suite.label, "source": suite.golden or f"builtin:{suite.builtin}",
                           "kinds": sorted({it.kind for it in items}), "default_chance": chance_of(items),
                           "seconds": round(time.perf_counter() - s0, 2),
                           "rows": [{"id": it.id, "excerpt": it.excerpt, "expected": it.expected, **r} for it, r in zip(items, rows)]})
    atomic_write_text(ctx.folder / "items.jsonl", "\n".join(lines) + "\n")
    return summarize(ctx.config, suites, time.perf_counter() - t0)


def inputs(cfg: GateConfig) -> dict[str, Any]:
    g = cfg.gates.tasks
    data = {}
    for s in g.suites:
        if s.golden:
            path = cfg.resolve(s.golden)
            data[s.label] = {"spec": s.golden, "fingerprint": file_fingerprint(path, full=True) if path.is_file() else "missing"}
        elif s.builtin in ("cloze", "choice"):
            data[s.label] = dataset_identity(s.dataset, cfg.resolve(s.dataset))
        elif s.lm_eval is not None:
            data[s.label] = lmeval_identity(cfg, s)
    return {"gate": g.model_dump(mode="json", exclude=TASKS.cache_exclude()), "data": data}


def lmeval_identity(cfg: GateConfig, suite: TaskSuite) -> dict[str, Any]:
    """What a stage key knows of an lm-eval suite's data: the task's name, the lm-eval version, and
    the content of the include_path folder (the user's YAMLs and the local data beside them)."""
    out: dict[str, Any] = {"spec": f"lm-eval:{suite.lm_eval}", "lm_eval": lmeval_task.version()}
    if suite.include_path is not None:
        folder = lmeval_task.include_folder(suite, cfg.resolve)
        out["include_path"] = {"spec": suite.include_path, "fingerprint": tree_fingerprint(folder)}
    return out


def check(cfg: GateConfig, tokenizer: Any) -> str | None:
    """Preflight of the lm-eval suites. Without a tokenizer: lm-eval installed, the include_path a
    folder, the task a name lm-eval knows and one task, not a group or tag. With it (the budget
    pass): the task loaded (its data read), its metric one with a per-document score, and its
    documents against the suite's limit (a shortfall note)."""
    notes = []
    for i, suite in enumerate(cfg.gates.tasks.suites):
        if suite.lm_eval is None:
            continue
        if tokenizer is None:
            lmeval_task.find_task(suite, cfg.resolve)
            continue
        if suite.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"gates.tasks.suites[{i}] ({suite.label}): chat_template is true but the model's tokenizer "
                              "has no chat template; remove chat_template, or use a model whose tokenizer has one.")
        _, task = lmeval_task.load_task(suite, cfg.resolve)
        lmeval.pick_metric(suite, task)
        notes.append(lmeval.limit_note(suite, task, f"gates.tasks.suites[{i}].limit", cfg.max_shortfall))
    return "; ".join(n for n in notes if n) or None


SPEC = GateSpec("tasks", run, thresholds, inputs, enabled, check=check)

"""Gate 4's lm-evaluation-harness suites: a task by name, run through lm-eval's own API on both
models, its per-document marks paired by document.

Each engine is wrapped as an lm-eval model (`lmeval_lm.EngineLM`), and `lm_eval.simple_evaluate`
runs the task on it with the samples logged, so lm-eval's prompts, few-shot selection, filters
and metrics are exactly lm-eval's. The two runs' samples are paired by `doc_id` (their prompts
must be identical: lm-eval's few-shot sampler is seeded). The suite's metric marks each
document:

- a metric lm-eval aggregates by its mean whose per-document values are all 0 or 1 (acc,
  acc_norm, exact_match, …) marks right/wrong: the gate's paired rule for accuracies applies;
- any other mean-aggregated metric is a per-document score: the paired mean difference with its
  normal interval;
- perplexity, word/byte perplexity and bits per byte are aggregated over the corpus from
  per-document log-likelihoods: the drop is Σ(ll_ref − ll_cand) / Σ weight (words, bytes or
  documents), which is ln(PPL_cand / PPL_ref) (for bits_per_byte, in bits: bpb_cand − bpb_ref),
  with the ratio estimator's interval;
- a metric with no per-document score (bleu, f1, mcc: computed on the whole set) is refused.

Finding, loading and quieting the task (and saying what to install without lm-eval) is
lmeval_task.py's.
"""

from __future__ import annotations

import contextlib
import math
import random
from typing import Any, Iterator
from unittest import mock

from ..errors import ConfigError, DataError, QvalError
from ..shortfall import shortfall
from .base import OPEN_CHANCE, excerpt
from .lmeval_task import quiet

BINARY_VALUES = (0.0, 1.0)
LOGLIK_AGGREGATIONS = ("perplexity", "weighted_perplexity", "bits_per_byte")


# --- the metric ---------------------------------------------------------------------------------

def _aggregation_name(fn: Any) -> str:
    from lm_eval.api.registry import AGGREGATION_REGISTRY

    return next((k for k, v in AGGREGATION_REGISTRY.items() if v is fn), getattr(fn, "__name__", str(fn)))


def pick_metric(suite: Any, task: Any) -> dict[str, Any]:
    """The metric and filter that mark the suite's documents, and their family: "mean" (lm-eval
    averages the per-document values) or "loglik" (a perplexity of per-document log-likelihoods).
    Refuses a metric the task does not report and one without a per-document score."""
    metrics = list(task.aggregation())
    filters = [f.name for f in getattr(task, "_filters", [])] or ["none"]
    name, _, filt = (suite.metric or "").partition(",")
    if not name:
        name = "acc" if "acc" in metrics else "exact_match" if "exact_match" in metrics else (metrics[0] if metrics else "")
    if name not in metrics:
        raise ConfigError(f"gates.tasks suite {suite.label}: task {suite.lm_eval} reports no metric {name!r}; "
                          f"it reports {', '.join(metrics) or 'none'}.")
    if filt and filt not in filters:
        raise ConfigError(f"gates.tasks suite {suite.label}: task {suite.lm_eval} has no filter {filt!r}; its filters: "
                          f"{', '.join(filters)} (metric: {name},{filters[0]}).")
    filt = filt or ("none" if "none" in filters else filters[0])
    agg = _aggregation_name(task.aggregation()[name])
    pairable = [m for m in metrics if _aggregation_name(task.aggregation()[m]) in ("mean", *LOGLIK_AGGREGATIONS)]
    if agg == "mean":
        family = "mean"
    elif agg in LOGLIK_AGGREGATIONS:
        family = "loglik"
    else:
        raise ConfigError(f"gates.tasks suite {suite.label}: metric {name} of task {suite.lm_eval} is computed by lm-eval "
                          f"over the whole set (aggregation {agg}), so no document has a score of its own to pair; "
                          f"choose one of {', '.join(pairable) or '(none: this task has no per-document metric)'}.")
    if family == "loglik" and (suite.max_flip_rate is not None or suite.chance is not None):
        raise ConfigError(f"gates.tasks suite {suite.label}: metric {name} is a perplexity, not right/wrong marks: "
                          "max_flip_rate and chance do not apply; remove them.")
    higher = task.higher_is_better().get(name)
    if family == "mean" and higher is None:
        raise ConfigError(f"gates.tasks suite {suite.label}: task {suite.lm_eval} does not say whether a higher {name} "
                          "is better (higher_is_better in its metric_list); set it in the task's YAML.")
    return {"metric": name, "filter": filt, "key": f"{name},{filt}", "aggregation": agg, "family": family,
            "higher_is_better": bool(higher) if higher is not None else False}


def limit_note(suite: Any, task: Any, where: str, max_fraction: float) -> str | None:
    """A shortfall note when the task has fewer documents than the suite's limit asks for (a
    DataError past max_shortfall, as every budget); None without a limit."""
    if suite.limit is None:
        return None
    try:
        n = len(task.eval_docs)
    except Exception as err:  # noqa: BLE001 - lm-eval: a task with neither test nor validation docs
        raise DataError(f"gates.tasks suite {suite.label}: task {suite.lm_eval} has no documents to evaluate: {err}") from None
    return shortfall(where, suite.limit, n, f"documents of task {suite.lm_eval}", max_fraction)


# --- running ------------------------------------------------------------------------------------

@contextlib.contextmanager
def kept_rng() -> Iterator[None]:
    """simple_evaluate seeds python's, numpy's and torch's global generators; put them back after."""
    import numpy as np
    import torch

    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])


def evaluate(lm: Any, suite: Any, tm: Any, task: Any) -> dict[str, Any]:
    """lm-eval's results for one model on the suite's task, with every sample logged."""
    from lm_eval import simple_evaluate

    from .lmeval_lm import EngineFailed, NonFiniteLogits

    import lm_eval.evaluator as ev

    try:
        # simple_evaluate's environment report (`git describe` in the working directory, torch's
        # collect_env) is skipped: it prints "fatal: not a git repository" outside a checkout, and
        # qval's report records its own environment
        with quiet(), kept_rng(), mock.patch.object(ev, "get_git_commit_hash", lambda: None), \
                mock.patch.object(ev, "add_env_info", lambda storage: None):
            # bootstrap_iters=0: lm-eval's own standard errors are not used (qval's paired intervals
            # are), and its bootstrap would start a process pool for a perplexity metric
            results = simple_evaluate(model=lm, tasks=[task], num_fewshot=suite.num_fewshot, limit=suite.limit,
                                      log_samples=True, bootstrap_iters=0, task_manager=tm,
                                      apply_chat_template=bool(suite.chat_template))
    except (QvalError, NonFiniteLogits):
        raise
    except EngineFailed as err:
        raise err.__cause__ from None  # qval's engine failed: an internal error, reported as one
    except Exception as err:  # noqa: BLE001 - lm-eval or the task's own code (process_results, filters)
        raise DataError(f"gates.tasks suite {suite.label}: lm-eval failed running task {suite.lm_eval} on the {lm.who}: "
                        f"{type(err).__name__}: {str(err).strip()[:400]}") from None
    if not results or task.task_name not in results.get("samples", {}):
        raise DataError(f"gates.tasks suite {suite.label}: lm-eval returned no samples for task {suite.lm_eval}.")
    return results


# --- pairing and marking ------------------------------------------------------------------------

def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    try:
        import numpy as np

        if isinstance(x, np.generic) and np.isscalar(x):
            return float(x)
    except ImportError:
        pass
    return None


def loglik_pair(value: Any) -> tuple[float, float] | None:
    """(log-likelihood, weight) of one document's perplexity-family value: (ll, words|bytes), or a
    bare ll (weight 1)."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        a, w = _number(value[0]), _number(value[1])
        return (a, w) if a is not None and w is not None else None
    a = _number(value)
    return (a, 1.0) if a is not None else None


def _choice_pick(metric: str, lls: list[float], choices: list[str]) -> int:
    """The option lm-eval's metric picks (acc: highest log-likelihood; acc_norm: per character;
    acc_bytes: per byte; acc_mutual_info: minus the unconditional log-likelihood)."""
    import numpy as np

    n = len(choices)
    cond = np.array(lls[:n])
    if metric == "acc_norm":
        cond = cond / np.array([float(len(c)) for c in choices])
    elif metric == "acc_bytes":
        cond = cond / np.array([float(len(c.encode("utf-8"))) for c in choices])
    elif metric == "acc_mutual_info" and len(lls) == 2 * n:
        cond = cond - np.array(lls[n:])
    return int(np.argmax(cond))


def describe(task: Any, sample: dict[str, Any], metric: str) -> tuple[str, str, str]:
    """(prompt excerpt, expected answer, the model's answer) of one logged sample, as text."""
    out_type = task.OUTPUT_TYPE
    args = sample.get("arguments") or [()]
    prompt = args[0][0] if args and args[0] and isinstance(args[0][0], str) else ""
    resps = sample.get("filtered_resps") or []
    target = sample.get("target")
    if out_type == "multiple_choice":
        choices = list(task.doc_to_choice(sample["doc"]))
        lls = [float(r[0]) if isinstance(r, (tuple, list)) else float(r) for r in resps]
        gold = target if isinstance(target, int) and 0 <= target < len(choices) else None
        expected = choices[gold] if gold is not None else str(target)
        answer = choices[_choice_pick(metric, lls, choices)] if lls else ""
        return excerpt(prompt), expected, answer
    if out_type == "generate_until":
        return excerpt(prompt), str(target), str(resps[0]) if resps else ""
    if out_type == "loglikelihood":
        r = resps[0] if resps else (float("nan"), False)
        return excerpt(prompt), str(target), f"log p {float(r[0]):.3f}, {'greedy' if r[1] else 'not greedy'}"
    r = resps[0] if resps else float("nan")  # loglikelihood_rolling: the text is the target
    return excerpt(str(target)), "", f"log p {float(r):.2f}"


def _by_doc(samples: list[dict[str, Any]], filt: str) -> dict[Any, dict[str, Any]]:
    return {s["doc_id"]: s for s in samples if s.get("filter") == filt}


def pair_rows(suite: Any, task: Any, how: dict[str, Any], ref: dict[str, Any], cand: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """("binary" | "mean" | "loglik", one row per document): both models' samples paired by doc_id."""
    name = task.task_name
    r, c = _by_doc(ref["samples"][name], how["filter"]), _by_doc(cand["samples"][name], how["filter"])
    if set(r) != set(c):
        raise DataError(f"gates.tasks suite {suite.label}: lm-eval scored different documents of task {name} for the two "
                        f"models ({len(r)} and {len(c)}); qval can only pair the same documents.")
    if not r:
        raise DataError(f"gates.tasks suite {suite.label}: task {name} gave no documents (filter {how['filter']}).")
    metric = how["metric"]
    rows = []
    for doc_id in sorted(r, key=lambda d: (not isinstance(d, int), d)):
        a, b = r[doc_id], c[doc_id]
        if a.get("prompt_hash") != b.get("prompt_hash"):
            raise DataError(f"gates.tasks suite {suite.label}: lm-eval gave the two models different prompts for document "
                            f"{doc_id} of task {name}; qval pairs identical items only: make the task's few-shot "
                            "selection deterministic.")
        shown, expected, ref_answer = describe(task, a, metric)
        cand_answer = describe(task, b, metric)[2]
        rows.append({"id": str(doc_id), "excerpt": shown, "expected": expected, "ref_answer": ref_answer,
                     "cand_answer": cand_answer, "_ref": a.get(metric), "_cand": b.get(metric)})
    if how["family"] == "loglik":
        for row in rows:
            ra, ca = loglik_pair(row.pop("_ref")), loglik_pair(row.pop("_cand"))
            if ra is None or ca is None or ra[1] != ca[1]:
                raise DataError(f"gates.tasks suite {suite.label}: document {row['id']} of task {name} has no "
                                f"(log-likelihood, weight) value for {metric}.")
            row.update(ref_ll=ra[0], cand_ll=ca[0], weight=ra[1], ref_score=ra[0] / ra[1] if ra[1] else math.nan,
                       cand_score=ca[0] / ca[1] if ca[1] else math.nan)
        return "loglik", rows
    values = []
    for row in rows:
        ra, ca = _number(row.pop("_ref")), _number(row.pop("_cand"))
        if ra is None or ca is None:
            raise DataError(f"gates.tasks suite {suite.label}: document {row['id']} of task {name} has no number for "
                            f"metric {metric}; choose a metric with a per-document score.")
        values += [ra, ca]
        row.update(ref_score=ra, cand_score=ca)
    if all(v in BINARY_VALUES for v in values):
        for row in rows:
            row["ref_right"], row["cand_right"] = bool(row.pop("ref_score")), bool(row.pop("cand_score"))
        return "binary", rows
    return "mean", rows


def default_chance(task: Any, ref: dict[str, Any], filt: str) -> float:
    """Guessing accuracy: the mean of 1/choices over the documents of a multiple-choice task; an
    open answer's 0.05 otherwise."""
    if task.OUTPUT_TYPE != "multiple_choice":
        return OPEN_CHANCE
    docs = _by_doc(ref["samples"][task.task_name], filt).values()
    inv = [1.0 / len(task.doc_to_choice(s["doc"])) for s in docs]
    return sum(inv) / len(inv) if inv else OPEN_CHANCE


def figure(how: dict[str, Any], results: dict[str, Any], task: Any) -> float | None:
    """lm-eval's own aggregate of the suite's metric (its results table)."""
    v = results.get("results", {}).get(task.task_name, {}).get(how["key"])
    return _number(v)

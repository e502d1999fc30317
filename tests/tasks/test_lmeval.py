"""Gate 4's lm-evaluation-harness suites, offline: the config rules, the errors a user can cause
(exit 2: lm-eval missing, an unknown task, a group, a missing data file, a metric with no
per-document score), the score rules on hand-built marks, and on the real model: through the
shipped local task (calib_data/lmeval/*.yaml + JSONL) the reference's accuracy and per-document
marks are lm-eval's own (HFLM), the identity candidate has no flips and passes, a damaged one is
rejected, rolling log-likelihood and generate_until match HFLM."""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from qval.config import parse_config
from qval.errors import BackendUnavailable, ConfigError, DataError, QvalError
from qval.gates import GATES
from qval.gates.base import GateContext
from qval.gates.tasks.judge import summarize
from qval.verdict import decide

from ..conftest import ROOT, small_config, write_config

LMEVAL = ROOT / "calib_data/lmeval"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No hub: every task here reads local files."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets
    import huggingface_hub

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)


def _data(*suites):
    data = small_config("lmeval-test", "none")
    data["gates"]["agreement"]["enabled"] = False
    data["gates"]["tasks"] = {"suites": list(suites)}
    return data


def _cfg(*suites):
    return parse_config(_data(*suites), "<lmeval test>")


def _suite(**kw):
    return {"lm_eval": "qval_choice", "include_path": str(LMEVAL), "margin": 0.1, **kw}


# --- config ---------------------------------------------------------------------------------------

def test_config_takes_exactly_one_source_and_lm_eval_keys_only_with_it():
    s = _cfg(_suite()).gates.tasks.suites[0]
    assert s.label == "qval_choice" and s.num_fewshot is None and s.limit is None and s.metric is None
    assert _cfg(_suite(margin=2.5)).gates.tasks.suites[0].margin == 2.5  # a score's unit may exceed 1
    for suite, says in (({"builtin": "choice", "lm_eval": "qval_choice", "margin": 0.1}, "this suite gives builtin and lm_eval"),
                        ({"golden": "g.jsonl", "lm_eval": "qval_choice", "margin": 0.1}, "exactly one of builtin"),
                        ({"builtin": "choice", "include_path": "x", "margin": 0.1}, "include_path apply to lm_eval suites only"),
                        ({"builtin": "choice", "num_fewshot": 2, "limit": 5, "margin": 0.1}, "limit, num_fewshot apply to lm_eval"),
                        (_suite(size=10), "size do not apply to an lm_eval suite"),
                        ({"builtin": "choice", "margin": 1.5}, "must be at most 1"),
                        (_suite(num_fewshot=-1), "num_fewshot"), (_suite(limit=0), "limit"),
                        (_suite(lm_eval=""), "lm_eval"),
                        ({"builtin": "recall", "chat_template": True, "margin": 0.1}, "chat_template apply to lm_eval suites only")):
        with pytest.raises(ConfigError, match=says):
            _cfg(suite)


def test_the_shipped_tasks_never_overlap_calibration():
    """calib_data's rule for held-out sets holds for the lm-eval tasks' data too."""
    from tests.test_data import spans, texts

    calib = set().union(*(spans(t) for t in texts("general_mix.jsonl")))
    for name in ("qval_choice.jsonl", "qval_choice_dev.jsonl", "qval_recall.jsonl"):
        rows = [json.loads(x) for x in (LMEVAL / name).read_text(encoding="utf-8").splitlines()]
        assert rows and len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            shown = " ".join(str(v) for k, v in r.items() if k != "id")
            assert not spans(shown) & calib, (name, r["id"])


# --- finding and loading tasks ----------------------------------------------------------------------

def test_unknown_task_group_and_tag_are_config_errors_naming_them():
    from qval.suites import lmeval_task

    cfg = _cfg(_suite(lm_eval="qval_choise"))
    with pytest.raises(ConfigError, match=r"qval_choise is not a task lm-eval knows.*Close names: qval_choice"):
        lmeval_task.find_task(cfg.gates.tasks.suites[0], cfg.resolve)
    for name, says in (("mmlu", r"mmlu is an lm-eval group of tasks \(mmlu_stem"), ("ai2_arc", r"ai2_arc is an lm-eval tag of tasks \(arc_")):
        cfg = _cfg(_suite(lm_eval=name))  # not under include_path: found among lm-eval's own (one index, kept)
        with pytest.raises(ConfigError, match=says):
            lmeval_task.find_task(cfg.gates.tasks.suites[0], cfg.resolve)
    cfg = _cfg(_suite(include_path="no/such/folder"))
    with pytest.raises(ConfigError, match="include_path no/such/folder: no such folder"):
        lmeval_task.find_task(cfg.gates.tasks.suites[0], cfg.resolve)


def test_relative_data_files_resolve_against_the_yaml_whatever_the_working_directory(tmp_path, monkeypatch):
    from qval.suites import lmeval_task

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text("{}\n")
    cfg = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": "data/a.jsonl", "dev": ["data/*.jsonl", "/abs/x", "https://host/x.jsonl"],
                                                                     "gone": "missing.jsonl"}, "data_dir": "data"}}
    out = lmeval_task.local_paths(cfg, tmp_path)
    files = out["dataset_kwargs"]["data_files"]
    assert files["test"] == str(tmp_path / "data/a.jsonl") and files["dev"] == [str(tmp_path / "data/*.jsonl"), "/abs/x", "https://host/x.jsonl"]
    assert files["gone"] == "missing.jsonl" and out["dataset_kwargs"]["data_dir"] == str(tmp_path / "data")
    assert out["dataset_path"] == "json" and cfg["dataset_kwargs"]["data_files"]["test"] == "data/a.jsonl"  # input untouched

    monkeypatch.chdir(tmp_path)  # lm-eval (datasets) alone would look for qval_choice.jsonl here
    suite = _cfg(_suite()).gates.tasks.suites[0]
    _, task = lmeval_task.load_task(suite, Path)
    assert task.task_name == "qval_choice" and len(task.test_docs()) == 40 and len(task.fewshot_docs()) == 5


def test_a_task_whose_data_file_is_missing_is_a_data_error(tmp_path):
    from qval.suites import lmeval_task

    (tmp_path / "broken.yaml").write_text((LMEVAL / "qval_choice.yaml").read_text().replace("task: qval_choice", "task: qval_broken")
                                          .replace("qval_choice.jsonl", "nowhere.jsonl"))
    cfg = _cfg(_suite(lm_eval="qval_broken", include_path=str(tmp_path)))
    with pytest.raises(DataError, match=r"lm-eval could not load task qval_broken \(.*broken.yaml\): FileNotFoundError"):
        lmeval_task.load_task(cfg.gates.tasks.suites[0], cfg.resolve)
    (tmp_path / "broken.yaml").write_text("task: qval_broken\nprocess_docs: !function nowhere.fix\n")
    with pytest.raises(DataError, match=r"lm-eval could not read .*broken.yaml: ImportError: Cannot import module 'nowhere'"):
        lmeval_task.load_task(cfg.gates.tasks.suites[0], cfg.resolve)


def test_the_metric_is_chosen_and_checked_before_any_model_runs(tmp_path):
    from qval.suites import lmeval, lmeval_task

    def pick(**kw):
        suite = _cfg(_suite(**kw)).gates.tasks.suites[0]
        return lmeval.pick_metric(suite, lmeval_task.load_task(suite, Path)[1])

    assert {k: pick()[k] for k in ("key", "family", "higher_is_better")} == {"key": "acc,none", "family": "mean", "higher_is_better": True}
    assert pick(metric="acc_norm")["key"] == "acc_norm,none"
    assert pick(lm_eval="qval_recall")["key"] == "exact_match,first-number"  # its one filter
    with pytest.raises(ConfigError, match="reports no metric 'f1'; it reports acc, acc_norm"):
        pick(metric="f1")
    with pytest.raises(ConfigError, match="no filter 'strict'; its filters: first-number"):
        pick(lm_eval="qval_recall", metric="exact_match,strict")
    (tmp_path / "b.yaml").write_text((LMEVAL / "qval_recall.yaml").read_text().replace("task: qval_recall", "task: qval_bleu")
                                     .replace("qval_recall.jsonl", str(LMEVAL / "qval_recall.jsonl"))
                                     .replace("metric: exact_match\n    aggregation: mean", "metric: bleu\n    aggregation: bleu"))
    (tmp_path / "r.yaml").write_text(PROSE_TASK.replace("prose.jsonl", str(tmp_path / "prose.jsonl")))
    (tmp_path / "prose.jsonl").write_text('{"text": "A short passage of prose."}\n')
    assert pick(lm_eval="qval_prose_rolling", include_path=str(tmp_path))["key"] == "word_perplexity,none"
    with pytest.raises(ConfigError, match="is a perplexity, not right/wrong marks: max_flip_rate and chance do not apply"):
        pick(lm_eval="qval_prose_rolling", include_path=str(tmp_path), chance=0.1)
    with pytest.raises(ConfigError, match=r"metric bleu of task qval_bleu is computed by lm-eval over the whole set "
                                          r"\(aggregation bleu\).*\(none: this task has no per-document metric\)"):
        pick(lm_eval="qval_bleu", include_path=str(tmp_path))


def test_without_lm_eval_validate_and_gate_say_what_to_install(tmp_path, monkeypatch):
    from tests.reliability.helpers import clean_error, word_config

    from qval.suites import lmeval_task

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now raises ImportError
    cfg = word_config(tmp_path)
    cfg["gates"]["tasks"] = {"suites": [_suite()]}
    with pytest.raises(BackendUnavailable) as err:
        lmeval_task.require(parse_config(cfg).gates.tasks.suites[0])
    assert err.value.exit_code == 2
    path = write_config(tmp_path, cfg)
    for cmd in (("validate", "--config", path), ("gate", "--config", path, "--out", tmp_path / "runs", "-q")):
        out = clean_error(*cmd)
        assert 'needs lm-evaluation-harness' in out and 'pip install "lm-eval==0.4.13"' in out and '.[lmeval]' in out, out


def test_validate_names_an_unknown_task_a_bad_metric_and_a_short_task(tmp_path):
    from tests.reliability.helpers import cli, clean_error, word_config

    cfg = word_config(tmp_path)
    cfg["gates"]["tasks"] = {"suites": [_suite(lm_eval="qval_recal")]}
    out = clean_error("validate", "--config", write_config(tmp_path, cfg))
    assert "lm_eval: qval_recal is not a task lm-eval knows" in out and "Close names: qval_recall" in out, out
    cfg["gates"]["tasks"] = {"suites": [_suite(lm_eval="qval_recall", limit=50)]}
    code, out = cli("validate", "--config", write_config(tmp_path, cfg))
    assert code == 0 and ": valid" in out, out
    assert "shortfall: gates.tasks.suites[0].limit: asked for 50 documents of task qval_recall, the data holds 30 (40% short)" in out
    for suite, says in ((_suite(lm_eval="qval_recall", limit=100), "shortfall beyond max_shortfall"),
                        (_suite(metric="f1"), "task qval_choice reports no metric 'f1'")):
        cfg["gates"]["tasks"] = {"suites": [suite]}
        assert says in clean_error("validate", "--config", write_config(tmp_path, cfg))


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


class FlatEngine:
    """Equal logits everywhere (every option scores the same) and a fixed generation (`says`,
    optionally NaN from step `nan_at`), or an engine that fails."""

    model_config = None  # the engine interface's: no model configuration known (lm-eval's default length)

    def __init__(self, vocab: int, fail: bool = False, says: list[int] | None = None, nan_at: int | None = None) -> None:
        self.vocab, self.fail, self.says, self.nan_at = vocab, fail, says or [], nan_at

    def logits_pieces(self, input_ids, piece):
        if self.fail:
            raise RuntimeError("a bug in the engine")
        yield torch.zeros(1, input_ids.shape[1], self.vocab)

    def generate(self, prompts, max_new_tokens, *, suppress_eos, batch_size, progress=None):
        from qval.engines.base import Generation

        if self.fail:
            raise RuntimeError("a bug in the engine")
        return Generation([self.says[:max_new_tokens] for _ in prompts], [self.nan_at for _ in prompts])


def _request(kind, args, doc_id=0):
    from lm_eval.api.instance import Instance

    return Instance(kind, {}, args, 0, ("t", doc_id, 1))


def test_the_wrapper_refuses_what_it_cannot_score_and_cuts_generations_as_hflm(tokenizer):
    from qval.suites.lmeval_lm import EngineFailed, EngineLM, NonFiniteLogits

    flat = EngineLM(FlatEngine(len(tokenizer)), tokenizer, "candidate", 16)
    assert flat.tok_encode("one two three", left_truncate_len=1) == tokenizer.encode("one two three")[-1:]
    with pytest.raises(DataError, match="empty continuation"):
        flat.loglikelihood([_request("loglikelihood", ("Some context", ""))])
    with pytest.raises(DataError, match="a continuation of .* tokens is longer than the context \\(16 tokens\\)"):
        flat.loglikelihood([_request("loglikelihood", ("Hi", " one two three four five six seven eight nine ten eleven twelve thirteen "
                                                       "fourteen fifteen sixteen seventeen"))])
    with pytest.raises(ConfigError, match="generates 20 tokens, which leaves no room for a prompt"):
        flat.generate_until([_request("generate_until", ("Hi", {"until": ["\n"], "max_gen_toks": 20}))])
    says = tokenizer.encode(" 437.\nMore", add_special_tokens=False)
    gen = [_request("generate_until", ("Code:", {"until": ["\n"], "max_gen_toks": 8}), i) for i in range(2)]
    assert EngineLM(FlatEngine(len(tokenizer), says=says), tokenizer, "x", 64).generate_until(gen) == [" 437.", " 437."]
    late = EngineLM(FlatEngine(len(tokenizer), says=says, nan_at=len(says) - 1), tokenizer, "x", 64)
    assert late.generate_until(gen[:1]) == [" 437."]  # NaN after where HFLM would have stopped: never produced
    with pytest.raises(NonFiniteLogits, match="the candidate produced non-finite logits on document 1"):
        EngineLM(FlatEngine(len(tokenizer), says=says, nan_at=0), tokenizer, "candidate", 64).generate_until(gen[1:])
    with pytest.raises(EngineFailed):
        EngineLM(FlatEngine(len(tokenizer), fail=True), tokenizer, "x", 64).generate_until(gen)


def test_pairing_refuses_what_it_cannot_pair():
    from types import SimpleNamespace

    from qval.suites import lmeval

    task = SimpleNamespace(task_name="t", OUTPUT_TYPE="loglikelihood")
    suite = _cfg(_suite(lm_eval="t")).gates.tasks.suites[0]
    how = {"metric": "acc", "filter": "none", "family": "mean"}

    def sample(doc_id, acc, prompt="p", ll=-1.5):
        return {"doc_id": doc_id, "filter": "none", "prompt_hash": prompt, "arguments": [("The end of a", " sentence")],
                "filtered_resps": [(ll, bool(acc))], "target": " sentence", "acc": acc}

    def pair(ref, cand, how=how):
        return lmeval.pair_rows(suite, task, how, {"samples": {"t": ref}}, {"samples": {"t": cand}})

    kind, rows = pair([sample(0, 1), sample(1, 0)], [sample(1, 1), sample(0, 1)])
    assert kind == "binary" and [(r["id"], r["ref_right"], r["cand_right"]) for r in rows] == [("0", True, True), ("1", False, True)]
    assert rows[0]["ref_answer"] == "log p -1.500, greedy" and rows[0]["expected"] == " sentence"
    kind, rows = pair([sample(0, 0.5)], [sample(0, 1)])
    assert kind == "mean" and (rows[0]["ref_score"], rows[0]["cand_score"]) == (0.5, 1.0)
    kind, rows = pair([sample(0, (-3.0, 2))], [sample(0, (-4.0, 2))], {**how, "family": "loglik"})
    assert kind == "loglik" and (rows[0]["ref_ll"], rows[0]["weight"], rows[0]["cand_score"]) == (-3.0, 2.0, -2.0)
    for ref, cand, says in (([sample(0, 1)], [sample(1, 1)], "scored different documents"),
                            ([sample(0, 1)], [sample(0, 1, prompt="q")], "different prompts for document 0"),
                            ([sample(0, "yes")], [sample(0, 1)], "has no number for metric acc"),
                            ([], [], "gave no documents")):
        with pytest.raises(DataError, match=says):
            pair(ref, cand)
    with pytest.raises(DataError, match="no \\(log-likelihood, weight\\) value"):
        pair([sample(0, "x")], [sample(0, (-1.0, 1))], {**how, "family": "loglik"})
    # the option each multiple-choice metric picks
    assert [lmeval._choice_pick(m, [-4.0, -6.0, -1.0, -5.0], ["a", "bbbbbb", "cc", "d"]) for m in ("acc", "acc_norm")] == [2, 2]
    assert lmeval._choice_pick("acc_norm", [-4.0, -6.0], ["a", "bbbbbbbbbbbbbbb"]) == 1
    assert lmeval._choice_pick("acc_bytes", [-4.0, -6.0], ["é", "bbbbbbbbbbbb"]) == 1
    assert lmeval._choice_pick("acc_mutual_info", [-4.0, -6.0, -1.0, -9.0], ["a", "b"]) == 1


SCORED_TASK = """task: qval_scored
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: label
process_results: !function scored.process
metric_list:
  - metric: score
    aggregation: mean
{higher}metadata:
  version: 1.0
"""


def test_a_per_document_score_is_gated_on_its_mean_and_needs_a_direction(tmp_path, tokenizer):
    """A task whose metric is a score (here half a point for the first option): the mean rule, on the
    whole gate path; max_flip_rate does not apply to it, and a metric of unknown direction is refused."""
    (tmp_path / "scored.py").write_text("def process(doc, results):\n    return {'score': 0.5 if doc['label'] == 0 else 0.0}\n")
    flat = FlatEngine(len(tokenizer))
    for higher in ("    higher_is_better: true\n", ""):
        (tmp_path / "qval_scored.yaml").write_text(SCORED_TASK.format(data=LMEVAL / "qval_choice.jsonl", higher=higher))
        cfg = _cfg(_suite(lm_eval="qval_scored", include_path=str(tmp_path), margin=0.05))
        if not higher:
            with pytest.raises(ConfigError, match="does not say whether a higher score is better"):
                GATES.get("tasks").run(GateContext(cfg, flat, flat, tokenizer, tmp_path))
            continue
        r = GATES.get("tasks").run(GateContext(cfg, flat, flat, tokenizer, tmp_path))
        s = r.details.suites[0]
        assert s.kind == "mean" and s.drop.ref_value == pytest.approx(0.125) == s.lmeval.reference
        assert decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r)).approved and "ref_score@qval_scored" in r.measurements
        cfg = _cfg(_suite(lm_eval="qval_scored", include_path=str(tmp_path), margin=0.05, max_flip_rate=0.1))
        with pytest.raises(ConfigError, match="is a score, not right/wrong marks: max_flip_rate does not apply"):
            GATES.get("tasks").run(GateContext(cfg, flat, flat, tokenizer, tmp_path))
    cfg = _cfg(_suite(margin=1.5, limit=4))
    with pytest.raises(ConfigError, match="margin 1.5 is an accuracy drop .* it must be at most 1"):
        GATES.get("tasks").run(GateContext(cfg, flat, flat, tokenizer, tmp_path))


def test_a_failing_task_is_a_data_error_and_a_failing_engine_is_not(tmp_path, tokenizer):
    """The task's own code failing (here its process_results) is the user's to fix: DataError,
    exit 2, naming the task. The engine failing is qval's: its own exception, not a DataError."""
    from qval.suites import lmeval, lmeval_task
    from qval.suites.lmeval_lm import EngineLM

    (tmp_path / "boom.py").write_text("def process(doc, results):\n    raise ValueError('no answer key in this doc')\n")
    (tmp_path / "boom.yaml").write_text((LMEVAL / "qval_choice.yaml").read_text().replace("task: qval_choice", "task: qval_boom")
                                        .replace("qval_choice", str(LMEVAL / "qval_choice")) + "process_results: !function boom.process\n")
    suite = _cfg(_suite(lm_eval="qval_boom", include_path=str(tmp_path), limit=2)).gates.tasks.suites[0]
    lm = EngineLM(FlatEngine(len(tokenizer)), tokenizer, "reference", 256)
    tm, task = lmeval_task.load_task(suite, Path)
    with pytest.raises(DataError, match="lm-eval failed running task qval_boom on the reference: ValueError: no answer key"):
        lmeval.evaluate(lm, suite, tm, task)
    suite = _cfg(_suite(limit=2)).gates.tasks.suites[0]
    tm, task = lmeval_task.load_task(suite, Path)
    with pytest.raises(RuntimeError, match="a bug in the engine") as err:
        lmeval.evaluate(EngineLM(FlatEngine(len(tokenizer), fail=True), tokenizer, "candidate", 256), suite, tm, task)
    assert not isinstance(err.value, QvalError)
    tm, task = lmeval_task.load_task(suite, Path)
    samples = lmeval.evaluate(lm, suite, tm, task)["samples"]["qval_choice"]  # flat logits: ties, lm-eval picks the first
    assert [s["acc"] for s in samples] == [1.0, 0.0] and samples[0]["filtered_resps"][0][0] == pytest.approx(-math.log(len(tokenizer)))


def test_the_gate_on_flat_engines_notes_a_short_task_and_finds_it_uninformative(tmp_path, tokenizer):
    """The whole gate path without a model: equal logits make every option tie, lm-eval then picks
    the first, which is right on a quarter of the shipped questions: exactly chance."""
    from qval.gates.tasks import section as tasks

    cfg = _cfg(_suite(limit=50))
    flat = FlatEngine(len(tokenizer))
    r = GATES.get("tasks").run(GateContext(cfg, flat, flat, tokenizer, tmp_path))
    assert r.status == "ok", r.error
    s = r.details.suites[0]
    assert s.n == 40 and s.drop.ref_accuracy == 0.25 == s.lmeval.reference and s.lmeval.max_length == 2048
    note = "gates.tasks.suites[0].limit: asked for 50 documents of task qval_choice, the data holds 40 (20% short)"
    assert r.details.shortfall == note and f"Note: {note}." in "\n".join(tasks.markdown(r.to_dict()))
    check = decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r)).checks[0]
    assert check.outcome == "uninformative" and "answers 10 of 40 items of suite qval_choice" in check.reason


# --- the score rules, on hand-built marks -----------------------------------------------------------

def _score_entry(label, kind, rows, metric, **info):
    return {"suite": label, "source": f"lm-eval:{label}", "kinds": ["generate_until"], "kind": kind, "output_type": "x",
            "default_chance": 0.05, "seconds": 1.0, "rows": rows,
            "lmeval": {"task": label, "metric": metric, "filter": "none", "key": f"{metric},none", "family": kind,
                       "higher_is_better": kind == "mean", "output_type": "x", "num_fewshot": 0, "limit": None,
                       "max_length": 2048, "reference": None, "candidate": None, "lm_eval_version": "0.4.13", **info}}


def test_scores_pair_by_mean_difference_and_perplexities_by_their_log_ratio():
    from qval.gates.tasks import section as tasks

    ref = [0.9, 0.8, 0.7, 0.6] * 5
    rows = lambda cand: [{"id": str(i), "excerpt": "…", "expected": "x", "ref_answer": "r", "cand_answer": "c",  # noqa: E731
                          "ref_score": r, "cand_score": c} for i, (r, c) in enumerate(zip(ref, cand))]
    cfg = _cfg(_suite(lm_eval="f1ish", margin=0.05), _suite(lm_eval="ppl", margin=0.02), _suite(lm_eval="bpb", margin=0.02))
    ll = [-50.0, -80.0, -20.0, -65.0]
    words = [10.0, 16.0, 5.0, 12.0]

    def run(cand, cand_ll, metric_scale=1.0):
        entries = [_score_entry("f1ish", "mean", rows(cand), "f1ish", higher_is_better=True),
                   _score_entry("ppl", "loglik", [{"id": str(i), "excerpt": "…", "expected": "", "ref_answer": "", "cand_answer": "",
                                                   "ref_ll": a, "cand_ll": b, "weight": w, "ref_score": a / w, "cand_score": b / w}
                                                  for i, (a, b, w) in enumerate(zip(ll, cand_ll, words))],
                                "word_perplexity", aggregation="weighted_perplexity"),
                   _score_entry("bpb", "loglik", [{"id": str(i), "excerpt": "…", "expected": "", "ref_answer": "", "cand_answer": "",
                                                   "ref_ll": a, "cand_ll": b, "weight": w * 5, "ref_score": 0, "cand_score": 0}
                                                  for i, (a, b, w) in enumerate(zip(ll, cand_ll, words))],
                                "bits_per_byte", aggregation="bits_per_byte")]
        r = summarize(cfg, entries, 1.0)
        return r, decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r))

    r, v = run(ref, ll)
    assert v.approved and not v.uninformative, [c.reason for c in v.checks]
    assert r.measurements["drop@f1ish"].value == 0.0 and r.measurements["drop@ppl"].value == 0.0
    ppl = math.exp(-sum(ll) / sum(words))
    assert r.measurements["ref_score@ppl"].value == pytest.approx(ppl) and r.details.suites[1].lmeval.qval_reference == pytest.approx(ppl)
    lower = [x - 0.1 for x in ref]  # every document 0.1 worse
    worse = [x - 0.05 * w for x, w in zip(ll, words)]  # 0.05 nats per word lost
    r, v = run(lower, worse)
    m = r.measurements
    assert m["drop@f1ish"].value == pytest.approx(0.1) and m["drop@ppl"].value == pytest.approx(0.05)
    assert m["cand_score@ppl"].value / m["ref_score@ppl"].value == pytest.approx(math.exp(0.05))
    assert m["drop@bpb"].value == pytest.approx(0.05 / 5 / math.log(2))  # bits per byte, over 5 bytes a word
    assert m["ref_score@bpb"].value == pytest.approx(-sum(ll) / (5 * sum(words)) / math.log(2))
    assert {c.metric for c in v.failures} == {"drop@f1ish", "drop@ppl"}  # bpb: 0.0144 bits/byte is within 0.02
    by = {s.suite: s for s in r.details.suites}
    assert by["ppl"].drop.unit.startswith("ln(perplexity_candidate / perplexity_reference)") and "per word" in by["ppl"].drop.unit
    assert len(by["f1ish"].largest_drops) == 5 and by["f1ish"].largest_drops[0].item_drop == pytest.approx(0.1)
    md = "\n".join(tasks.markdown(r.to_dict()))
    assert "Suites scored per document" in md and "| ppl (lm-eval:ppl) | 4 | word_perplexity,none |" in md
    assert "Documents whose score dropped most" in md and "lm-eval: reference" in md
    html = tasks.html(r.to_dict())
    assert "bits per byte: candidate − reference" in html and "<img" not in html  # no accuracy bars without a right/wrong suite


def test_a_score_suite_with_a_chance_is_uninformative_below_it():
    rows = [{"id": str(i), "excerpt": "", "expected": "", "ref_answer": "", "cand_answer": "", "ref_score": s, "cand_score": s}
            for i, s in enumerate([0.1, 0.2, 0.15, 0.12] * 3)]
    for chance, informative in ((0.5, False), (0.05, True)):
        cfg = _cfg(_suite(lm_eval="f1ish", margin=0.1, chance=chance))
        r = summarize(cfg, [_score_entry("f1ish", "mean", copy.deepcopy(rows), "f1ish", higher_is_better=True)], 1.0)
        check = decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r)).checks[0]
        assert (check.outcome != "uninformative") == informative, check.reason


# --- the real model -----------------------------------------------------------------------------------

PROSE_TASK = """task: qval_prose_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: prose.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
"""


@pytest.fixture(scope="module")
def prose_task(tmp_path_factory):
    """A rolling log-likelihood task of four short passages of the shipped held-out prose."""
    folder = tmp_path_factory.mktemp("prose_task")
    docs = [json.loads(x)["text"] for x in (ROOT / "calib_data/heldout_eval.jsonl").read_text().splitlines()[:4]]
    (folder / "prose.jsonl").write_text("".join(json.dumps({"text": d[:600]}) + "\n" for d in docs))
    (folder / "qval_prose_rolling.yaml").write_text(PROSE_TASK)
    return folder


def _gate(cfg, reference, candidate, tokenizer, folder):
    folder.mkdir(parents=True, exist_ok=True)
    r = GATES.get("tasks").run(GateContext(cfg, reference, candidate, tokenizer, folder))
    return r, decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r))


@pytest.fixture(scope="module")
def identity_run(default_model, prose_task, tmp_path_factory):
    from qval.engines.hf import HFEngine

    cfg = _cfg(_suite(margin=0.1), _suite(lm_eval="qval_recall", limit=12, margin=0.2),
               _suite(lm_eval="qval_prose_rolling", include_path=str(prose_task), max_length=128, margin=0.01))
    m = default_model
    folder = tmp_path_factory.mktemp("identity")
    return _gate(cfg, HFEngine(m.model, m.tokenizer), HFEngine(m.model, m.tokenizer), m.tokenizer, folder), folder


def _hflm(default_model, task_name, include, **kw):
    """lm-eval's own run of the task on the same loaded model: HFLM, batch size 1, the task by name
    from its folder, run in that folder (lm-eval reads relative data_files against the working directory)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=default_model.model, tokenizer=copy.deepcopy(default_model.tokenizer), batch_size=1,
              max_length=kw.pop("max_length", None))
    here = os.getcwd()
    os.chdir(include)
    try:
        return simple_evaluate(model=lm, tasks=[task_name], task_manager=TaskManager(include_path=str(include), include_defaults=False),
                               log_samples=True, bootstrap_iters=0, **kw)
    finally:
        os.chdir(here)


@pytest.mark.slow
def test_the_identity_candidate_has_no_flips_and_passes(identity_run):
    (r, v), folder = identity_run
    assert r.status == "ok", r.error
    assert v.approved and not v.uninformative, [c.reason for c in v.checks]
    by = {s.suite: s for s in r.details.suites}
    assert by["qval_choice"].kind == "binary" and by["qval_choice"].n == 40 and by["qval_choice"].flipped == []
    assert by["qval_recall"].n == 12 and by["qval_recall"].lmeval.key == "exact_match,first-number"
    assert by["qval_prose_rolling"].kind == "loglik" and by["qval_prose_rolling"].drop.drop == 0.0
    for s in by.values():
        assert s.drop.drop == 0.0 and s.lmeval.reference == s.lmeval.candidate
        assert s.lmeval.qval_reference == pytest.approx(s.lmeval.reference, rel=1e-12)  # qval's figure is lm-eval's
    lines = [json.loads(x) for x in (folder / "items.jsonl").read_text().splitlines()]
    choice = [x for x in lines if x["suite"] == "qval_choice"]
    assert len(choice) == 40 and choice[0]["kind"] == "lm-eval:multiple_choice" and choice[0]["excerpt"].endswith("Answer:")
    assert {x["ref_answer"] for x in choice} <= {c for x in choice for c in json.loads(
        (LMEVAL / "qval_choice.jsonl").read_text().splitlines()[int(x["id"])])["choices"]}
    recall = [x for x in lines if x["suite"] == "qval_recall"]
    assert all(x["expected"].isdigit() for x in recall) and any(x["ref_right"] for x in recall)
    from qval.gates.tasks import section as tasks

    md = "\n".join(tasks.markdown(r.to_dict()))
    assert "| qval_choice (lm-eval:qval_choice) | 40 | 0.25 |" in md
    assert "qval_choice (multiple_choice, acc,none, 0-shot)" in md and "qval_recall (generate_until, exact_match,first-number, 0-shot, first 12 documents)" in md


@pytest.mark.slow
def test_the_references_accuracy_is_lm_evals_own(identity_run, default_model, prose_task):
    """The done-when of the lm-eval suites: qval's accuracy for the reference on the shipped local
    task equals lm_eval.simple_evaluate's with lm-eval's HFLM on the same model, document by document."""
    (r, _), folder = identity_run
    by = {s.suite: s for s in r.details.suites}
    theirs = _hflm(default_model, "qval_choice", LMEVAL)
    acc = theirs["results"]["qval_choice"]["acc,none"]
    ours = by["qval_choice"].drop.ref_accuracy
    print(f"\nqval_choice, 40 documents: qval's reference accuracy {ours!r}, lm-eval HFLM acc {acc!r}")
    assert ours == acc == by["qval_choice"].lmeval.reference
    marks = {str(s["doc_id"]): bool(s["acc"]) for s in theirs["samples"]["qval_choice"]}
    items = {x["id"]: x["ref_right"] for x in map(json.loads, (folder / "items.jsonl").read_text().splitlines())
             if x["suite"] == "qval_choice"}
    assert items == marks and len(marks) == 40

    theirs = _hflm(default_model, "qval_recall", LMEVAL, limit=12)
    assert by["qval_recall"].drop.ref_accuracy == theirs["results"]["qval_recall"]["exact_match,first-number"]
    assert {x["id"]: x["ref_answer"] for x in map(json.loads, (folder / "items.jsonl").read_text().splitlines())
            if x["suite"] == "qval_recall"} == {str(s["doc_id"]): s["filtered_resps"][0] for s in theirs["samples"]["qval_recall"]}
    theirs = _hflm(default_model, "qval_prose_rolling", prose_task, max_length=128)
    assert by["qval_prose_rolling"].drop.ref_value == pytest.approx(
        theirs["results"]["qval_prose_rolling"]["word_perplexity,none"], rel=1e-5)


@pytest.mark.slow
def test_a_chat_templated_task_is_lm_evals_own_with_apply_chat_template(default_model, tmp_path):
    """chat_template: true runs the task as lm_eval.simple_evaluate(apply_chat_template=True) does
    with HFLM: the same prompts (a user turn of the tokenizer's template), the same marks."""
    from qval.engines.hf import HFEngine

    m = default_model
    cfg = _cfg(_suite(limit=10, chat_template=True), _suite(lm_eval="qval_recall", limit=6, chat_template=True, margin=0.2))
    r, v = _gate(cfg, HFEngine(m.model, m.tokenizer), HFEngine(m.model, m.tokenizer), m.tokenizer, tmp_path)
    assert r.status == "ok", r.error
    assert all(s.drop.drop == 0.0 and s.flipped == [] for s in r.details.suites)  # the identity
    items = [json.loads(x) for x in (tmp_path / "items.jsonl").read_text().splitlines()]
    choice = [x for x in items if x["suite"] == "qval_choice"]
    assert choice and all("<|im_start|>assistant" in x["excerpt"] for x in choice), choice[0]["excerpt"]
    templated = {}
    for task, limit, key in (("qval_choice", 10, "acc,none"), ("qval_recall", 6, "exact_match,first-number")):
        theirs = templated[task] = _hflm(default_model, task, LMEVAL, limit=limit, apply_chat_template=True)
        ours = {s.suite: s for s in r.details.suites}[task]
        assert ours.drop.ref_accuracy == theirs["results"][task][key]
        if task == "qval_choice":
            assert {x["id"]: x["ref_right"] for x in choice} == {str(s["doc_id"]): bool(s["acc"]) for s in theirs["samples"][task]}
        else:
            assert {x["id"]: x["ref_answer"] for x in items if x["suite"] == task} == \
                {str(s["doc_id"]): s["filtered_resps"][0] for s in theirs["samples"][task]}
    plain = _hflm(default_model, "qval_choice", LMEVAL, limit=10)  # the same task without the template: other prompts
    assert plain["samples"]["qval_choice"][0]["arguments"] != templated["qval_choice"]["samples"]["qval_choice"][0]["arguments"]


def test_chat_template_without_a_template_in_the_tokenizer_is_a_config_error(tokenizer):
    import types

    from qval.gates.tasks.run import check

    cfg = _cfg(_suite(chat_template=True))
    with pytest.raises(ConfigError, match=r"suites\[0\] \(qval_choice\): chat_template is true but the model's tokenizer has no chat template"):
        check(cfg, types.SimpleNamespace(chat_template=None))
    assert check(cfg, tokenizer) is None  # the built-in tokenizer has one


def _wrapper(default_model, max_length=8192, engine=None):
    from qval.engines.hf import HFEngine
    from qval.suites.lmeval_lm import EngineLM

    return EngineLM(engine or HFEngine(default_model.model, default_model.tokenizer), default_model.tokenizer, "reference", max_length)


@pytest.mark.slow
def test_few_shot_prompts_and_log_likelihoods_are_lm_evals_own(default_model):
    from qval.suites import lmeval, lmeval_task

    theirs = _hflm(default_model, "qval_choice", LMEVAL, num_fewshot=2, limit=10)["samples"]["qval_choice"]
    suite = _cfg(_suite(num_fewshot=2, limit=10)).gates.tasks.suites[0]
    tm, task = lmeval_task.load_task(suite, Path)
    ours = lmeval.evaluate(_wrapper(default_model), suite, tm, task)["samples"]["qval_choice"]
    assert [s["prompt_hash"] for s in ours] == [s["prompt_hash"] for s in theirs] and len(ours) == 10
    assert "Question: What colour is fresh snow?" in ours[0]["arguments"][0][0]  # the dev split's first two, first_n
    assert [s["acc"] for s in ours] == [s["acc"] for s in theirs]
    lls = lambda samples: [r[0] for s in samples for r in s["filtered_resps"]]  # noqa: E731
    assert lls(ours) == pytest.approx(lls(theirs), abs=1e-4)


@pytest.mark.slow
def test_rolling_log_likelihood_and_generate_until_match_hflm(default_model):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    text = " ".join(json.loads((ROOT / "calib_data/heldout_eval.jsonl").read_text().splitlines()[1])["text"].split()[:60])
    hf = HFLM(pretrained=default_model.model, tokenizer=copy.deepcopy(default_model.tokenizer), batch_size=1, max_length=24)
    ours = _wrapper(default_model, max_length=24)
    assert len(ours.tok_encode(text)) > 2 * 24  # several rolling windows
    rolling = [Instance("loglikelihood_rolling", {}, (t,), 0, ("t", i, 1)) for i, t in enumerate((text, "Short text."))]
    a, b = ours.loglikelihood_rolling(rolling), hf.loglikelihood_rolling(rolling, disable_tqdm=True)
    print(f"\nrolling log-likelihood: qval {a}, HFLM {b}")
    assert a == pytest.approx(b, abs=1e-3) and a[0] < a[1] < 0
    pairs = [Instance("loglikelihood", {}, (c, x), 0, ("t", i, 1)) for i, (c, x) in
             enumerate((("The capital of France is", " Paris"), ("", "Hello there"), ("Two plus two is ", "four")))]
    for (ll, greedy), (ll2, greedy2) in zip(ours.loglikelihood(pairs), hf.loglikelihood(pairs, disable_tqdm=True)):
        assert ll == pytest.approx(ll2, abs=1e-4) and greedy == greedy2
    gen = [Instance("generate_until", {}, (c, {"until": ["\n", "."], "max_gen_toks": 12, "do_sample": False}), 0, ("t", i, 1))
           for i, c in enumerate(("The capital of France is", "Once upon a time", "1, 2, 3, 4,"))]
    hf = HFLM(pretrained=default_model.model, tokenizer=copy.deepcopy(default_model.tokenizer), batch_size=1)
    texts = _wrapper(default_model).generate_until(gen)
    assert texts == hf.generate_until(gen, disable_tqdm=True) and all("\n" not in t and "." not in t for t in texts), texts
    sampled = [Instance("generate_until", {}, ("Hi", {"until": ["\n"], "do_sample": True, "temperature": 0.7}), 0, ("t", 0, 1))]
    with pytest.raises(ConfigError, match="asks for sampled generations"):
        _wrapper(default_model).generate_until(sampled)


@pytest.mark.slow
def test_an_engine_known_by_its_top_k_scores_as_the_full_one(default_model):
    """A served engine's answers (top K and the actual token): the continuation goes into the input, so
    every log-likelihood and greedy flag is the full engine's, also for one-token options that HFLM's
    grouping would score from one shared row."""
    from lm_eval.api.instance import Instance

    from qval.engines.hf import HFEngine

    from ..engines.topk_engine import TopKEngine

    pairs = [Instance("loglikelihood", {}, (c, x), 0, ("t", i, 1)) for i, (c, x) in enumerate((
        ("The capital of France is", " Paris"), ("The capital of France is", " Rome"), ("", "Hello there"),
        ("Two plus two is ", "four"), ("Answer: A or B?", " A"), ("Answer: A or B?", " B")))]
    full = _wrapper(default_model).loglikelihood(pairs)
    topk = _wrapper(default_model, engine=TopKEngine(HFEngine(default_model.model, default_model.tokenizer), 5)).loglikelihood(pairs)
    assert [g for _, g in topk] == [g for _, g in full]
    assert [ll for ll, _ in topk] == pytest.approx([ll for ll, _ in full], abs=1e-4)


from ..gates.test_tasks import _damaged  # noqa: E402 — one damaged layer, the same as gate 4's own test


@pytest.mark.slow
def test_a_damaged_candidate_is_rejected_and_a_nan_one_is_nonfinite(default_model, tmp_path):
    from qval.engines.hf import HFEngine

    m = default_model
    cfg = _cfg(_suite(limit=20, margin=0.1))
    ref = HFEngine(m.model, m.tokenizer)
    r, v = _gate(cfg, ref, HFEngine(_damaged(m.model), m.tokenizer), m.tokenizer, tmp_path / "damaged")
    assert r.status == "ok" and not v.approved, [c.reason for c in v.checks]
    s = r.details.suites[0]
    assert s.flipped and s.counts.ref_only > s.counts.cand_only and s.lmeval.candidate < s.lmeval.reference
    assert s.lmeval.qval_candidate == s.lmeval.candidate

    class NaN(HFEngine):
        def logits_pieces(self, input_ids, piece):
            for x in super().logits_pieces(input_ids, piece):
                yield torch.full_like(x, float("nan"))

    r, _ = _gate(_cfg(_suite(limit=2)), ref, NaN(m.model, m.tokenizer), m.tokenizer, tmp_path / "nan")
    assert r.status == "nonfinite" and "candidate produced non-finite logits on item document 0" in r.error, r.error


@pytest.mark.slow
def test_qval_gate_with_an_lm_eval_suite_approves_the_identity_and_reuses_the_stage(tmp_path, patch_reference):
    """Through the CLI as a user runs it: format none, only gate 4, the shipped local task named by
    a path relative to the config file; report.json/md/html carry lm-eval's figures; a second run
    reuses the finished stage."""
    from typer.testing import CliRunner

    from qval.cli import app

    (tmp_path / "tasks").mkdir()
    for f in LMEVAL.iterdir():
        (tmp_path / "tasks" / f.name).write_bytes(f.read_bytes())
    data = small_config("lmeval-e2e", "none", diagnostics={"enabled": False, "sensitivity": "never"})
    data["gates"] = {"agreement": {"enabled": False},
                     "tasks": {"suites": [{"lm_eval": "qval_choice", "include_path": "tasks", "limit": 20, "margin": 0.15}]}}
    path = write_config(tmp_path, data)
    runs = []
    for _ in range(2):
        result = CliRunner().invoke(app, ["gate", "--config", str(path), "--out", str(tmp_path / "reports"), "-q"])
        runs.append(result)
        assert result.exit_code == 0, result.output
    run = tmp_path / "reports" / "lmeval-e2e"
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"]["decision"] == "APPROVE"
    s = report["gates"]["tasks"]["details"]["suites"][0]
    assert s["source"] == "lm-eval:qval_choice" and s["flipped"] == [] and s["n"] == 20
    assert s["lmeval"]["reference"] == s["lmeval"]["qval_reference"] == s["drop"]["ref_accuracy"]
    md = (run / "report.md").read_text()
    assert "| qval_choice | qval_choice (multiple_choice, acc,none, 0-shot, first 20 documents) | 20 |" in md
    assert "lm-eval: reference" in (run / "report.html").read_text()
    assert len((run / "gate_tasks" / "items.jsonl").read_text().splitlines()) == 20
    assert report["stages"]["gate_tasks"]["cached"] is True  # the second run's report: the stage was reused

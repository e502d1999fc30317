"""Gate 4 (tasks): each scorer on hand-made inputs, the built-in suites' determinism, the golden
reader, the paired rule and "uninformative" suites on hand-built marks, the gate's bookkeeping
with the closed-form fake engine, and on the real model: identity is exact, one damaged layer loses."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from qval.config import parse_config
from qval.errors import ConfigError, DataError
from qval.gates import GATES
from qval.gates.base import GateContext
from qval.gates.tasks.run import score_choice
from qval.gates.tasks.judge import summarize
from qval.suites import SUITES, Item
from qval.suites.builtin import cloze_candidates, sentences
from qval.suites.scoring import continuation_logprob, contains, exact, numeric, pick, regex, word_mark
from qval.verdict import decide

from ..conftest import ROOT, small_config
from .fakes import HIGH, LOW, P_HI, P_LO, FakeEngine, FakeTokenizer, walk

HELDOUT = str(ROOT / "calib_data/heldout_eval.jsonl")


def _cfg(*suites):
    data = small_config("tasks-test", "none")
    data["gates"]["agreement"]["enabled"] = False
    data["gates"]["tasks"] = {"suites": [{"dataset": HELDOUT, **s} for s in suites]}
    return parse_config(data, "<tasks test>")


# --- scorers, by hand ---------------------------------------------------------------------------

def test_exact_is_normalised_and_judges_the_first_line():
    assert exact("  PARIS. \nIt is the capital of France.", "Paris")
    assert exact("“the  Louvre”", "The Louvre")
    assert not exact("Paris, France", "Paris")
    assert not exact("", "Paris")


def test_contains_matches_whole_words_only():
    assert contains("I believe the answer is Paris, France.", "paris")
    assert not contains("a Parisian cafe", "Paris")
    assert not contains("anything", "")


def test_regex_searches_the_raw_response():
    assert regex("It happened in 1969.", r"\b19[6-7]\d\b")
    assert not regex("It happened in 1980.", r"\b19[6-7]\d\b")
    assert regex("ANSWER: B", r"(?i)answer:\s*b\b")


def test_numeric_takes_the_first_number_within_the_tolerance():
    assert numeric(" 437\n\nThe", "437") and not numeric(" 473", "437")
    assert numeric("about 3.1416 I think", "3.14159", 0.001) and not numeric("3.15", "3.14159", 0.001)
    assert numeric("It costs 1,250 dollars", "1250") and numeric("-2", "-2.0")
    assert not numeric("no number here", "4")


class _Tok:
    pieces = {0: " ott", 1: "er", 2: ".", 3: "s", 4: " the"}

    def decode(self, ids, **_):
        return "".join(self.pieces[i] for i in ids)


def _onehot(choices, v=5):
    out = torch.zeros(len(choices), v)
    for i, c in enumerate(choices):
        out[i, c] = 5.0
    return out


def test_word_mark_needs_every_token_and_the_word_to_end():
    tok = _Tok()
    dec = lambda t: tok.decode([t])  # noqa: E731
    assert word_mark(_onehot([0, 1, 2]), [0, 1], dec) == (True, [0, 1])  # " otter" then "."
    assert word_mark(_onehot([0, 1, 4]), [0, 1], dec)[0]  # then a new word: ends too
    assert word_mark(_onehot([0, 1, 3]), [0, 1], dec) == (False, [0, 1, 3])  # " otters": the word goes on
    assert word_mark(_onehot([0, 4, 2]), [0, 1], dec) == (False, [0, 4])  # a wrong second token


def test_continuation_logprob_and_pick_by_hand():
    lg = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
    assert continuation_logprob(lg, [0, 1]) == pytest.approx(math.log(0.5) + math.log(0.8))
    assert pick([-3.0, -1.0, -2.0]) == 1 and pick([-1.0, -1.0]) == 0 and pick([float("nan"), -5.0]) == 1


def test_choice_by_log_likelihood_with_the_fake_engine(tmp_path: Path):
    """The fake puts HIGH on walk(token, position): a continuation that follows the walk costs
    log p_hi per token, any other token log p_lo — so the summed log-likelihoods are known exactly."""
    prompt = [5, 10]  # positions 0, 1; walk(10, 1) = 11, walk(11, 2) = 13
    follows, strays = [11, 13], [11, 40]
    item = Item(id="c", kind="choice", prompt=prompt, excerpt="", choices=[strays, follows], choice_texts=["strays", "follows"], label=1)
    cfg = _cfg({"builtin": "choice", "margin": 0.1})
    ctx = GateContext(cfg, FakeEngine(walk), FakeEngine(lambda t, p: 40 if p == 2 else walk(t, p)), FakeTokenizer(), tmp_path)
    r = score_choice(ctx, item, piece=1)
    assert r["ref_logprobs"] == pytest.approx([math.log(P_HI) + math.log(P_LO), 2 * math.log(P_HI)], abs=1e-5)
    assert r["ref_right"] and r["ref_answer"] == "follows"
    # the candidate's rule prefers 40 at position 2: it picks the wrong continuation
    assert not r["cand_right"] and r["cand_pick"] == 0
    assert HIGH > LOW


# --- suites ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


def test_cloze_candidates_are_repeated_content_words():
    t = "word " * 60 + "The heron stood. Then the heron"
    spans = [t[a:b] for a, b in cloze_candidates(t)]
    assert spans == ["heron"]  # the second "word" has 59 words before it: too little context
    assert sentences("A b. C d? E\n\nf. g") == ["A b.", "C d?", "E f. g"]


@pytest.mark.parametrize("name", ["cloze", "choice", "recall"])
def test_builtin_suites_are_deterministic(tokenizer, name):
    cfg = _cfg({"builtin": name, "size": 12, "margin": 0.1})
    suite = cfg.gates.tasks.suites[0]
    a = SUITES.get(name)(suite, tokenizer, cfg.resolve, 0)
    b = SUITES.get(name)(suite, tokenizer, cfg.resolve, 0)
    c = SUITES.get(name)(suite, tokenizer, cfg.resolve, 1)
    assert len(a) == 12 and len({x.id for x in a}) == 12
    assert [(x.id, x.prompt, x.target, x.choices, x.label, x.answer) for x in a] == \
           [(x.id, x.prompt, x.target, x.choices, x.label, x.answer) for x in b]
    assert [x.id for x in a] != [x.id for x in c] or [x.prompt for x in a] != [x.prompt for x in c]
    for x in a:
        text = tokenizer.decode(x.prompt)
        if name == "cloze":
            assert tokenizer.decode(x.target).strip() == x.word and x.word.lower() in text.lower()  # the context predicts it
        elif name == "choice":
            assert len(x.choices) == 4 and tokenizer.decode(x.choices[x.label]).strip() == x.choice_texts[x.label]
        else:
            assert f"code is {x.answer}." in text and text.count(x.answer) == 1


def test_golden_items_and_their_errors(tmp_path: Path):
    path = tmp_path / "mine.jsonl"
    rows = [{"id": "a", "prompt": "Two plus two?", "answer": "4", "match": "numeric", "tolerance": 0},
            {"id": "b", "prompt": "The sky is", "choices": ["blue", "green", "loud"], "label": 0},
            {"id": "c", "prompt": "Capital of France?", "answer": "Paris"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _cfg({"golden": str(path), "margin": 0.2})
    suite = cfg.gates.tasks.suites[0]
    assert suite.label == "mine"
    items = SUITES.get("golden")(suite, FakeTokenizer(), cfg.resolve, 0)
    assert [(i.kind, i.match) for i in items] == [("generate", "numeric"), ("choice", "exact"), ("generate", "exact")]
    tok = FakeTokenizer()
    assert items[1].prompt == tok("The sky is")["input_ids"] and items[1].choices[0] == tok(" blue")["input_ids"]
    for bad, says in (({"id": "x", "prompt": "p", "answer": "1", "match": "fuzzy"}, "unknown match 'fuzzy'"),
                      ({"id": "x", "prompt": "p", "choices": ["a", "b"], "label": 2}, "'label' must be the index"),
                      ({"id": "x", "prompt": "p", "answer": "a", "tolerance": 1}, "applies to match numeric only"),
                      ({"id": "x", "prompt": "p"}, "needs an 'answer'")):
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(DataError, match=says):
            SUITES.get("golden")(suite, tok, cfg.resolve, 0)


def test_config_is_strict_and_off_by_default():
    data = small_config("t", "none")
    assert not parse_config(data).gates.tasks.enabled
    data["gates"]["agreement"]["enabled"] = False
    for suites, says in (([{"margin": 0.1}], "exactly one of builtin"),
                         ([{"builtin": "cloze", "golden": "x.jsonl", "margin": 0.1}], "exactly one of builtin"),
                         ([{"builtin": "cloze"}], "margin"),
                         ([{"builtin": "cloze", "margin": 0.1}, {"builtin": "cloze", "margin": 0.2}], "appears twice"),
                         ([], "no suites"), ([{"builtin": "lambada", "margin": 0.1}], "builtin"),
                         ([{"builtin": "cloze", "margin": 0.1, "margn": 0.1}], "Did you mean 'margin'.*Allowed here: builtin")):
        data["gates"]["tasks"] = {"suites": suites}
        with pytest.raises(ConfigError, match=says):
            parse_config(data)


# --- the paired rule ------------------------------------------------------------------------------

def _suite(label, ref, cand, chance=0.25):
    return {"suite": label, "source": f"builtin:{label}", "kinds": ["choice"], "default_chance": chance, "seconds": 0.0,
            "rows": [{"id": str(i), "excerpt": "…", "expected": "x", "ref_right": r, "cand_right": c, "ref_answer": "r", "cand_answer": "c"}
                     for i, (r, c) in enumerate(zip(ref, cand))]}


def _verdict(cfg, suites):
    r = summarize(cfg, suites, 1.0)
    return r, decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r))


def test_identical_marks_pass_and_a_loss_fails_on_the_upper_bound():
    cfg = _cfg({"builtin": "choice", "margin": 0.15, "max_flip_rate": 0.2})
    ref = [True] * 30 + [False] * 10
    r, v = _verdict(cfg, [_suite("choice", ref, ref)])
    assert v.approved, [c.reason for c in v.checks]
    m = r.measurements
    assert m["drop@choice"].value == 0.0 and m["drop@choice"].hi > 0 and m["flip_rate@choice"].value == 0.0
    assert r.details.suites[0].flipped == [] and r.details.suites[0].drop.mcnemar_p == 1.0
    lost = [x and i % 4 != 0 for i, x in enumerate(ref)]  # 8 right→wrong flips
    r, v = _verdict(cfg, [_suite("choice", ref, lost)])
    assert not v.approved and {c.metric for c in v.failures} == {"drop@choice", "flip_rate@choice"}
    assert any("upper bound of drop@choice" in c.reason for c in v.failures)
    s = r.details.suites[0]
    assert len(s.flipped) == 8 and all(f.ref_right and not f.cand_right for f in s.flipped)
    assert s.drop.net_loss == 8 and s.counts.ref_only == 8


def test_a_suite_the_reference_cannot_do_is_uninformative_never_a_pass():
    cfg = _cfg({"builtin": "choice", "margin": 0.5}, {"builtin": "cloze", "margin": 0.5})
    ok = [True] * 20
    near_chance = [i % 4 == 0 for i in range(20)]  # 5 of 20 with 4 choices
    r, v = _verdict(cfg, [_suite("choice", near_chance, near_chance), _suite("cloze", ok, ok, 0.05)])
    by = {c.metric: c for c in v.checks}
    assert by["drop@choice"].outcome == "uninformative" and "answers 5 of 20" in by["drop@choice"].reason
    assert by["drop@cloze"].outcome == "pass" and v.approved and len(v.uninformative) == 1
    r, v = _verdict(cfg, [_suite("choice", near_chance, near_chance), _suite("cloze", [False] * 20, [False] * 20, 0.05)])
    assert not v.approved and any("every check was uninformative" in c.reason for c in v.failures)


def test_a_missing_or_failed_gate_fails_every_suite():
    cfg = _cfg({"builtin": "choice", "margin": 0.5})
    v = decide({}, GATES.get("tasks").thresholds(cfg, None))
    assert not v.approved and "did not run" in v.checks[0].reason


def test_the_gate_runs_a_golden_choice_suite_on_the_fake_engine(tmp_path: Path):
    """Bookkeeping end to end without a model: items.jsonl holds every item, the flips are listed."""
    tok = FakeTokenizer()
    # prompt "ab" -> ids [37, 38]; a choice is read after a space (id 32, at position 2), and the
    # walk from there goes to (32 + 2) % 60 = 34, the id of '"': that choice follows the walk
    rows = [{"id": f"q{i}", "prompt": "ab", "choices": ['"', "z"], "label": 0} for i in range(6)]
    (tmp_path / "g.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _cfg({"golden": str(tmp_path / "g.jsonl"), "margin": 0.3, "chance": 0.0})
    ctx = GateContext(cfg, FakeEngine(walk), FakeEngine(walk), tok, tmp_path)
    r = GATES.get("tasks").run(ctx)
    assert r.status == "ok" and r.measurements["ref_accuracy@g"].value == 1.0 and r.measurements["drop@g"].value == 0.0
    lines = [json.loads(x) for x in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == [f"q{i}" for i in range(6)]
    assert all(x["ref_right"] and x["cand_answer"] == '"' and x["choices"] == ['"', "z"] for x in lines)
    bad = GATES.get("tasks").run(GateContext(cfg, FakeEngine(walk), FakeEngine(walk, nan_from=0), tok, tmp_path))
    assert bad.status == "nonfinite" and "candidate" in bad.error


def test_report_shows_suites_and_flips():
    from qval.gates.tasks import section as tasks

    cfg = _cfg({"builtin": "choice", "margin": 0.15})
    ref = [True] * 30 + [False] * 10
    r = summarize(cfg, [_suite("choice", ref, [x and i % 4 != 0 for i, x in enumerate(ref)])], 2.5)
    g = r.to_dict()
    md = "\n".join(tasks.markdown(g))
    assert "| choice (builtin:choice) | 40 |" in md and "Items the two models mark differently" in md and "2.5 s" in md
    html = tasks.html(g)
    assert "<img" in html and "reference answered" in html


# --- the real model -----------------------------------------------------------------------------

def _damaged(model: torch.nn.Module) -> torch.nn.Module:
    """One decoder layer's MLP output scaled ×30: that layer swamps the residual stream."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        m.model.layers[len(m.model.layers) // 2].mlp.down_proj.weight.mul_(30.0)
    return m


@pytest.mark.slow
def test_tasks_on_the_real_model_identity_is_exact_and_damage_is_rejected(default_model, tmp_path: Path):
    from qval.engines.hf import HFEngine

    cfg = _cfg({"builtin": "cloze", "size": 10, "margin": 0.5}, {"builtin": "choice", "size": 6, "margin": 0.5},
               {"builtin": "recall", "size": 10, "margin": 0.5})
    ref = HFEngine(default_model.model, default_model.tokenizer)
    out = {}
    for name, model in (("identity", default_model.model), ("damaged", _damaged(default_model.model))):
        folder = tmp_path / name
        folder.mkdir()
        r = GATES.get("tasks").run(GateContext(cfg, ref, HFEngine(model, default_model.tokenizer), default_model.tokenizer, folder))
        out[name] = (r, decide({"tasks": r}, GATES.get("tasks").thresholds(cfg, r)))
    r, v = out["identity"]
    assert r.status == "ok", r.error
    for s in r.details.suites:
        assert s.flipped == [] and s.drop.drop == 0.0, s.suite
    assert v.approved and not v.uninformative, [c.reason for c in v.checks]
    r, v = out["damaged"]
    assert r.status == "ok", r.error
    assert not v.approved
    assert any(s.flipped for s in r.details.suites)

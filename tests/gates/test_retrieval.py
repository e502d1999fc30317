"""The retrieval matrix: trial construction (deterministic, one needle, the true code as the
answer), greedy exact-match marks from logits worked by hand, the paired non-inferiority rule and
"uninformative" lengths, and the gate on the real model (identity exact; a damaged candidate loses)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from qval.config import parse_config
from qval.data import load_dataset, token_stream
from qval.gates import GATES
from qval.gates.base import GateContext
from qval.gates.needles import build_trials, snap_back
from qval.gates.retrieval.run import mark
from qval.gates.retrieval.judge import summarize
from qval.verdict import decide

from ..conftest import ROOT, small_config

HAY = ROOT / "calib_data/longctx_docs.jsonl"


def _cfg(**retrieval):
    data = small_config("retrieval-test", "none")
    data["gates"]["retrieval"] = {"haystack": str(HAY), "lengths": [256, 512], "depths": [0.0, 1.0], "trials": 1,
                                  "margin": 0.6, "margin_overall": 0.5, **retrieval}
    return parse_config(data, "<retrieval test>")


@pytest.fixture(scope="module")
def tokenizer(default_tokenizer):
    return default_tokenizer


@pytest.fixture(scope="module")
def stream(tokenizer):
    return token_stream(load_dataset(str(HAY)).texts(), tokenizer, tokenizer.eos_token_id)


def test_trials_are_deterministic_and_hold_one_needle_each(tokenizer, stream):
    a = build_trials(tokenizer, stream, [256, 1024], [0.0, 0.5, 1.0], 2, seed=0)
    b = build_trials(tokenizer, stream, [256, 1024], [0.0, 0.5, 1.0], 2, seed=0)
    c = build_trials(tokenizer, stream, [256, 1024], [0.0, 0.5, 1.0], 2, seed=1)
    assert [t.prompt for t in a] == [t.prompt for t in b]
    assert [t.key for t in a] != [t.key for t in c]
    assert len(a) == 12 and len({t.key for t in a}) == 12 and len({t.name for t in a}) == 12
    for t in a:
        text = tokenizer.decode(t.prompt)
        assert text.count(f"locker is {t.key}.") == 1  # the needle, once
        assert text.count(t.key) == 1  # the code appears nowhere else
        assert text.endswith(f"The pass code for the {t.name} locker is")
        assert tokenizer.decode(t.answer) == f" {t.key}."
        assert abs(t.tokens - t.length) <= 8, (t.tokens, t.length)
        where = text.index(f"locker is {t.key}") / len(text)
        assert (where < 0.3) if t.depth == 0.0 else (where > 0.75) if t.depth == 1.0 else (0.3 < where < 0.75)


def test_snap_back_moves_to_a_sentence_end():
    assert snap_back(["One", ".", " Two", " three"], 3) == 2
    assert snap_back(["no", " end", " here"], 2) == 2


class _Tok:
    def decode(self, ids):
        return {0: " ", 1: "1", 2: "2", 3: ".", 4: "x"}[ids[0]]


def _logits(choices):
    out = torch.zeros(len(choices), 5)
    for i, c in enumerate(choices):
        out[i, c] = 5.0
    return out


def test_mark_is_greedy_exact_match():
    from qval.gates.needles import Trial

    t = Trial(length=0, depth=0.0, trial=0, key="12", name="n", prompt=[4], answer=[0, 1, 2, 3], code_tokens=3, needle_at=0, offset=0)
    assert mark(_Tok(), _logits([0, 1, 2, 3]), t) == (True, None)
    assert mark(_Tok(), _logits([0, 1, 1, 3]), t) == (False, 2)  # a wrong digit
    assert mark(_Tok(), _logits([0, 1, 2, 1]), t) == (False, 3)  # the number goes on: "121…" is not "12"
    assert mark(_Tok(), _logits([0, 1, 2, 4]), t) == (True, None)  # anything but a digit ends it


def _rows(ref, cand, lengths=(256, 512), depths=(0.0, 1.0)):
    rows, i = [], 0
    for L in lengths:
        for d in depths:
            rows.append({"length": L, "depth": d, "trial": 0, "key": str(100000 + i), "prompt_tokens": L, "ref_right": ref[i],
                         "cand_right": cand[i], "answer_kld": 0.0 if ref[i] == cand[i] else 1.0, "answer_top1": 1.0})
            i += 1
    return rows


def _info(lengths=(256, 512), depths=(0.0, 1.0)) -> dict:
    """What the gate knows of its matrix before it scores (`trials_from`'s info)."""
    return {"haystack": "h", "haystack_tokens": 4096, "lengths": list(lengths), "depths": list(depths), "trials_per_cell": 1,
            "trials": len(lengths) * len(depths), "rendering": "raw"}


def _verdict(cfg, rows):
    r = summarize(cfg, rows, _info(), 0.0)
    return r, decide({"retrieval": r}, GATES.get("retrieval").thresholds(cfg, r))


def test_identical_answers_pass_and_a_collapse_fails_on_the_upper_bound():
    cfg = _cfg(lengths=[256, 512], depths=[0.0, 0.25, 0.5, 0.75, 1.0], trials=2, margin=0.5, margin_overall=0.3)
    depths = (0.0, 0.25, 0.5, 0.75, 1.0)
    n = 10
    rows = _rows([True] * n, [True] * n, depths=depths) + _rows([True] * n, [True] * n, depths=depths)
    for k, r in enumerate(rows):
        r["trial"] = k // n
    r, v = _verdict(cfg, rows)
    assert v.approved, [c.reason for c in v.checks]
    assert r.measurements["drop"].value == 0.0 and r.measurements["drop"].hi > 0  # an interval, not a point
    lost = [dict(x, cand_right=(i % 2 == 0)) for i, x in enumerate(rows)]
    r, v = _verdict(cfg, lost)
    assert not v.approved
    assert any("upper bound of drop" in c.reason for c in v.failures)
    assert r.details.flipped and len(r.details.flipped) == 10


def test_a_length_the_reference_cannot_solve_is_uninformative_never_a_pass():
    cfg = _cfg(margin=0.9, margin_overall=0.9)
    # the reference answers nothing at 512: that length cannot show a loss
    r, v = _verdict(cfg, _rows([True, True, False, False], [True, True, False, False]))
    by = {c.metric: c for c in v.checks}
    assert by["drop@512"].outcome == "uninformative" and "reference itself answers 0 of 2" in by["drop@512"].reason
    assert by["drop@256"].outcome == "pass"
    assert v.approved and len(v.uninformative) == 1
    # nothing informative at all: no evidence, no approval
    r, v = _verdict(cfg, _rows([False] * 4, [False] * 4))
    assert not v.approved and any("every check was uninformative" in c.reason for c in v.failures)


def test_limits_come_from_the_config_not_from_the_candidate():
    """A worse candidate never gets a looser limit: the margins are fixed, the bound only grows."""
    cfg = _cfg(lengths=[256, 512], depths=[0.0, 0.5, 1.0], trials=2)
    base = _rows([True] * 6, [True] * 6, depths=(0.0, 0.5, 1.0)) * 2
    limits, uppers = [], []
    for lost in range(0, 6):
        rows = [dict(x, cand_right=not (i < lost)) for i, x in enumerate(base)]
        r = summarize(cfg, rows, _info(), 0.0)
        limits.append([t.limit for t in GATES.get("retrieval").thresholds(cfg, r)])
        uppers.append(r.measurements["drop"].hi)
    assert all(x == limits[0] for x in limits)
    assert all(a <= b for a, b in zip(uppers, uppers[1:]))


def _damaged(model: torch.nn.Module) -> torch.nn.Module:
    """Half of every attention layer's value projection zeroed: the context is read badly."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.model.layers:
            w = layer.self_attn.v_proj.weight
            w[: w.shape[0] // 2] = 0
    return m


@pytest.mark.slow
def test_retrieval_on_the_real_model_identity_is_exact_and_damage_loses(default_model, tmp_path: Path):
    from qval.engines.hf import HFEngine

    cfg = _cfg(lengths=[256, 512], depths=[0.0, 0.5, 1.0], trials=1, max_answer_kld=0.0)
    ref = HFEngine(default_model.model, default_model.tokenizer)
    out = {}
    for name, model in (("identity", default_model.model), ("damaged", _damaged(default_model.model))):
        folder = tmp_path / name
        folder.mkdir()
        cand = HFEngine(model, default_model.tokenizer)
        r = GATES.get("retrieval").run(GateContext(cfg, ref, cand, default_model.tokenizer, folder))
        out[name] = (r, decide({"retrieval": r}, GATES.get("retrieval").thresholds(cfg, r)))
    r, v = out["identity"]
    assert r.measurements["ref_accuracy"].value >= 0.5  # the built-in model can do this task at these lengths
    assert r.measurements["drop"].value == 0.0 and r.measurements["answer_kld"].value == 0.0 and not r.details.flipped
    assert v.approved
    r, v = out["damaged"]
    assert r.measurements["cand_accuracy"].value < r.measurements["ref_accuracy"].value
    assert not v.approved
    flipped = r.details.flipped
    assert flipped and all(f.cand_answer is not None and f.ref_answer is not None for f in flipped)

"""A served engine reading what a hostile or broken server answers: every malformed answer is a
ServerError (exit 2) that names the server and the position, never a traceback; a well-formed one
is read exactly. No server runs: a fake client returns the answers."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from qval.engines.api import ServerError
from qval.engines.served import ServedEngine

VOCAB, K = 50, 3


class FakeClient:
    base = "http://fake:1"
    requests = retried = 0

    def __init__(self, answer):
        self.answer = answer

    def call(self, method, path, body=None, **kw):
        return copy.deepcopy(self.answer)


def entries(pairs):
    return {str(i): {"logprob": lp, "rank": r + 1, "decoded_token": "x"} for r, (i, lp) in enumerate(pairs)}


def good_answer(ids):
    """vLLM's shape: prompt_logprobs[0] is None, entry i (i >= 1) holds token i's log-probability and the top K."""
    rows = [None]
    for tok in ids[1:]:
        rows.append(entries([(tok, -0.5), (7, -1.0), (8, -2.0), (9, -3.0)]))
    last = [{f"token_id:{7}": -0.1, "token_id:8": -2.5, "token_id:9": -3.5}]
    return {"choices": [{"prompt_logprobs": rows, "logprobs": {"top_logprobs": last}}]}


def engine(answer):
    return ServedEngine(FakeClient(answer), "m", VOCAB, K, 1, [2], {})


IDS = [3, 4, 5, 6]


def test_a_well_formed_answer_is_read_exactly():
    block = engine(good_answer(IDS)).logits(torch.tensor([IDS]))
    assert block.best[0].tolist() == [4, 5, 6, 7]
    assert block.next_token[0].tolist() == [4, 5, 6, -1]
    assert block.next_logp[0, :3].tolist() == [-0.5, -0.5, -0.5] and math.isnan(block.next_logp[0, 3])
    assert block.top_idx[0, 0].tolist() == [4, 7, 8]


def _edit(fn):
    a = good_answer(IDS)
    fn(a)
    return a


def _row(a, i):
    return a["choices"][0]["prompt_logprobs"][i]


MALFORMED = {
    "a key that is not a token id": lambda a: _row(a, 2).update({"seven": {"logprob": -1.5}}),
    "a log-probability that is not a number": lambda a: _row(a, 1)["7"].update({"logprob": "high"}),
    "a log-probability above 0": lambda a: _row(a, 3)["8"].update({"logprob": 4.0}),
    "an entry that is a list": lambda a: a["choices"][0]["prompt_logprobs"].__setitem__(2, [1, 2, 3]),
    "no entry for the last position": lambda a: a["choices"][0]["logprobs"].update({"top_logprobs": [None]}),
    "a prompt_logprobs of the wrong length": lambda a: a["choices"][0]["prompt_logprobs"].pop(),
    "no choices": lambda a: a.update({"choices": []}),
    "the actual token missing": lambda a: _row(a, 1).pop("4"),
    "fewer than K log-probabilities": lambda a: a["choices"][0]["prompt_logprobs"].__setitem__(1, entries([(4, -0.5)])),
    "a token id outside the vocabulary": lambda a: _row(a, 1).update({"9999": {"logprob": -0.01}}),
    "a last-position key that is garbage": lambda a: a["choices"][0]["logprobs"].update({"top_logprobs": [{"token_id:": -1}]}),
}


@pytest.mark.parametrize("what", sorted(MALFORMED))
def test_a_malformed_answer_is_a_server_error_naming_the_server(what):
    with pytest.raises(ServerError, match="the server at http://fake:1"):
        engine(_edit(MALFORMED[what])).logits(torch.tensor([IDS]))


@pytest.mark.parametrize("answer", [{"choices": [{"text": "hi"}]}, {"choices": [{"token_ids": [3, 99999]}]}, {"choices": [{"logprobs": {"tokens": ["token_id:x"]}}]},
                                    {"choices": "none"}, []])
def test_a_malformed_generation_is_a_server_error(answer):
    with pytest.raises(ServerError, match="the server at http://fake:1"):
        engine(answer).generate([[3, 4]], 4, suppress_eos=False, batch_size=1)

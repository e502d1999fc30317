"""engines/concurrent.py: two CPU engines decode side by side (the first job in a forked process)
with the thread count they would have alone, the same tokens bit for bit, also beside a ModelOpt
fake-quant candidate (whose attention patches transformers process-wide); errors surface in the
caller; the thread count and the CPU attention patch are restored; GPU engines are never paired."""

from __future__ import annotations

import os
import time

import pytest
import torch

from qval.engines.concurrent import PartnerFailed, alone, can_pair, share, side_by_side
from qval.engines.hf import HFEngine

needs_two = pytest.mark.skipif(torch.get_num_threads() < 2 or not hasattr(os, "fork"), reason="needs two threads and fork")


class _Dev:
    def __init__(self, device: str) -> None:
        self.device = device


CPU2 = [_Dev("cpu"), _Dev("cpu")]


@needs_two
def test_the_first_job_runs_in_another_process_at_the_same_time():
    def job(wait: float) -> int:
        time.sleep(wait)
        return os.getpid()

    t0 = time.perf_counter()
    (theirs, mine), paired = side_by_side([lambda: job(0.6), lambda: job(0.6)], CPU2)
    assert paired and mine == os.getpid() and theirs != os.getpid()
    assert time.perf_counter() - t0 < 1.1  # overlapped, not 1.2 s in turn


@needs_two
def test_errors_on_either_side_reach_the_caller():
    with pytest.raises(PartnerFailed, match="ValueError: bad prompt"):
        side_by_side([lambda: (_ for _ in ()).throw(ValueError("bad prompt")), lambda: 1], CPU2)
    before = torch.get_num_threads()
    with pytest.raises(KeyError, match="mine"):
        side_by_side([lambda: time.sleep(30), lambda: {}["mine"]], CPU2)  # the partner is stopped, not awaited
    assert torch.get_num_threads() == before


@needs_two
def test_a_large_result_comes_back_whole():
    big = list(range(300_000))  # several MB pickled: more than a pipe's buffer
    (theirs, mine), _ = side_by_side([lambda: big, lambda: "here"], CPU2)
    assert theirs == big and mine == "here"


def test_gpu_engines_and_a_single_thread_are_not_paired(monkeypatch):
    assert not can_pair([_Dev("cuda:0"), _Dev("cpu")]) and share([_Dev("cuda:0"), _Dev("cuda:0")]) is None
    out, paired = side_by_side([os.getpid, os.getpid], [_Dev("cuda:0"), _Dev("cuda:0")])
    assert not paired and out == [os.getpid()] * 2  # here, in turn
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert share(CPU2) is None


@needs_two
def test_the_thread_count_is_shared_then_restored():
    before = torch.get_num_threads()
    seen, _ = side_by_side([torch.get_num_threads, torch.get_num_threads], CPU2)
    assert seen == [before // 2] * 2 and torch.get_num_threads() == before
    assert alone(torch.get_num_threads, CPU2) == before // 2 and torch.get_num_threads() == before


@pytest.mark.slow
@needs_two
def test_side_by_side_decoding_beside_a_fakequant_candidate_gives_the_tokens_of_decoding_alone(default_model, tmp_path):
    from qval.engines import BUILDERS
    from tests.engines.calibrated import build_context, calibrated_state, gate_config

    tok = default_model.tokenizer
    ref = HFEngine(default_model.model, tok)
    cfg = gate_config("pair", "fp8", kv="fp8")
    cand = BUILDERS.get("fakequant")(build_context(default_model, cfg, calibrated_state(default_model, "fp8", "fp8"), tmp_path))
    prompts = [tok(p)["input_ids"] for p in ("The capital of France is", "Once upon a time", "Water boils at")]
    pair = [ref, cand]

    def run(e):
        return e.generate(prompts, 24, suppress_eos=True, batch_size=3)

    (r, c), paired = side_by_side([lambda: run(ref), lambda: run(cand)], pair)
    assert paired and r.first_nonfinite_step == [None] * 3
    assert r.tokens == alone(lambda: run(ref), pair).tokens and c.tokens == alone(lambda: run(cand), pair).tokens
    # the case that broke threads: ModelOpt's attention patches transformers' process-wide function
    assert any(hasattr(m, "q_bmm_quantizer") for m in cand.model.modules())

"""The TensorRT-LLM adapter against a stand-in that follows the documented LLM API: what it asks
the library for, how it reads the answers, and that nothing claims it ran when it did not."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from qval.engines.tensorrt_llm import NOT_EXECUTED, TensorRTLLMEngine, TensorRTLLMOptions, import_llm_api, make_llm
from tests.engines import trtllm_standin


class Tiny(torch.nn.Module):
    """A model whose next token is (token + 1) % 7, with EOS = 3 most likely after 2."""

    def forward(self, input_ids: torch.Tensor) -> types.SimpleNamespace:
        logits = torch.full((*input_ids.shape, 7), -5.0)
        logits.scatter_(-1, ((input_ids + 1) % 7).unsqueeze(-1), 5.0)
        return types.SimpleNamespace(logits=logits)


@pytest.fixture
def engine():
    llm = trtllm_standin.LLM(model="unused")
    llm.hf_model = Tiny()
    return TensorRTLLMEngine(llm, trtllm_standin.api(), [3], executed=False, tp_size=2)


def test_missing_library_is_a_clear_error(monkeypatch):
    from qval.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails as if not installed
    with pytest.raises(BackendUnavailable, match=r"needs the tensorrt_llm package.*engine: \{backend: export\}"):
        import_llm_api()


def test_llm_is_opened_with_block_reuse_off_and_tp():
    llm = make_llm(trtllm_standin.api(), "/ckpt", TensorRTLLMOptions(tp_size=4, max_batch_size=16))
    assert llm.model_path == "/ckpt" and llm.tokenizer == "/ckpt" and llm.tensor_parallel_size == 4
    assert llm.kv_cache_config.enable_block_reuse is False and llm.kwargs["max_batch_size"] == 16


def test_context_logits(engine):
    logits = engine.logits(torch.tensor([[0, 1, 2], [4, 5, 6]]))
    assert logits.shape == (2, 3, 7)
    assert logits.argmax(-1).tolist() == [[1, 2, 3], [5, 6, 0]]
    prompts, params = engine.llm.calls[-1]
    assert prompts == [[0, 1, 2], [4, 5, 6]] and params.return_context_logits and params.max_tokens == 1


def test_pieces_slice_one_context_request(engine):
    pieces = list(engine.logits_pieces(torch.tensor([[0, 1, 2, 3, 4]]), piece=2))
    assert [p.shape[1] for p in pieces] == [2, 2, 1] and len(engine.llm.calls) == 1


def test_generation_with_and_without_eos(engine):
    free = engine.generate([[0, 1]], 5, suppress_eos=False, batch_size=4)
    assert free.tokens == [[2, 3]] and free.eos_step == [1] and free.first_nonfinite_step == [None]
    forced = engine.generate([[0, 1]], 5, suppress_eos=True, batch_size=4)
    _, params = engine.llm.calls[-1]
    assert params.bad_token_ids == [3] and params.ignore_eos and params.top_k == 1 and params.return_generation_logits
    assert len(forced.tokens[0]) == 5 and 3 not in forced.tokens[0] and forced.eos_step == [None]


def test_nonfinite_generation_logits_are_reported(engine):
    class Broken(Tiny):
        def forward(self, input_ids):  # noqa: ANN001, ANN202
            out = super().forward(input_ids)
            if input_ids.shape[1] >= 4:
                out.logits[:, -1, 0] = float("nan")
            return out

    engine.llm.hf_model = Broken()
    gen = engine.generate([[0, 1, 2]], 4, suppress_eos=True, batch_size=1)
    assert gen.first_nonfinite_step == [1]


def test_batches_follow_batch_size(engine):
    engine.generate([[0], [1], [2]], 2, suppress_eos=True, batch_size=2)
    assert [len(p) for p, _ in engine.llm.calls] == [2, 1]


def test_describe_says_not_executed(engine):
    d = engine.describe()
    assert d["executed"] is False and d["tp_size"] == 2 and d["kv_cache_block_reuse"] is False
    assert NOT_EXECUTED in d["notes"] and "NOT EXECUTED" in NOT_EXECUTED


def test_report_marks_it_not_executed(engine):
    from qval.report.markdown import render_markdown

    d = engine.describe()
    report = {"name": "trt", "verdict": {"decision": "REJECT", "failed_checks": 0, "checks": []}, "model": {},
              "candidate": {"format": "fp8", "kv_cache": "fp16", "exclude": [], "engine": d},
              "seconds": 0, "created": "now", "gates": {}, "stages": {}, "environment": {"versions": {}, "device": {}}}
    assert "NOT EXECUTED here" in render_markdown(report)

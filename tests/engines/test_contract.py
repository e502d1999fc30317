"""The engine interface contract, run against every engine that runs on a CPU: fakequant,
realquant, export, checkpoint (a qval export as the candidate) and the TensorRT-LLM adapter over
its stand-in. Each must: score a chunk as [B, T, V] finite logits; give the same logits piece by
piece through its KV cache, and for an answer after a prefilled prompt; decode greedily (the first token is the argmax of the teacher-forced
logits); honour EOS suppression; describe itself."""

from __future__ import annotations

import pytest
import torch

from tests.engines.calibrated import build_context, calibrated_state, exported, gate_config

pytestmark = pytest.mark.slow

PROMPT = "The committee published its report on Tuesday, and the"
ENGINES_ON_CPU = ["fakequant", "realquant", "export", "checkpoint", "tensorrt_llm"]


@pytest.fixture(scope="module")
def engines(default_model, tmp_path_factory):
    from qval.engines import BUILDERS
    from qval.engines.hf import HFEngine
    from qval.engines.tensorrt_llm import TensorRTLLMEngine
    from tests.engines import trtllm_standin

    state = calibrated_state(default_model, "fp8", "fp16")
    build = exported(default_model, "fp8", "fp16")
    run = tmp_path_factory.mktemp("contract")
    out = {}
    for name in ("fakequant", "realquant", "export"):
        cfg = gate_config(f"contract-{name}", "fp8", engine={"backend": name})
        ctx = build_context(default_model, cfg, state, build.folder.parent if name == "export" else run)
        out[name] = BUILDERS.get(name)(ctx)
    cfg = gate_config("contract-checkpoint", "fp8", engine={"backend": "checkpoint", "path": str(build.folder)})
    out["checkpoint"] = BUILDERS.get("checkpoint")(build_context(default_model, cfg, None, run))
    llm = trtllm_standin.LLM(model=str(build.folder))
    llm.hf_model = out["export"].model  # the stand-in computes with the export read back
    eos = HFEngine(default_model.model, default_model.tokenizer).eos_ids()
    out["tensorrt_llm"] = TensorRTLLMEngine(llm, trtllm_standin.api(), eos, executed=False, build=build)
    return out


@pytest.fixture(scope="module")
def ids(default_model):
    return torch.tensor([default_model.tokenizer(PROMPT)["input_ids"]])


@pytest.mark.parametrize("name", ENGINES_ON_CPU)
def test_logits_shape_and_finite(engines, ids, default_model, name):
    logits = engines[name].logits(ids.repeat(2, 1))
    vocab = default_model.model.config.vocab_size
    assert logits.shape == (2, ids.shape[1], vocab)
    assert bool(torch.isfinite(logits).all())
    torch.testing.assert_close(logits[0], logits[1])  # rows of a batch are independent


@pytest.mark.parametrize("name", ENGINES_ON_CPU)
def test_pieces_match_one_chunk(engines, ids, name):
    full = engines[name].logits(ids)
    pieces = torch.cat(list(engines[name].logits_pieces(ids, piece=5)), dim=1)
    assert pieces.shape == full.shape
    # Through the KV cache the float32 sums run in another order. A quantized model turns those
    # last-bit differences into different FP8 activation codes now and then (logits move by up to
    # ~1.5 here), so the contract is: same positions, same top token, a small divergence.
    assert torch.equal(pieces.argmax(-1), full.argmax(-1))
    lp, lf = pieces[0].log_softmax(-1), full[0].log_softmax(-1)
    assert float((lf.exp() * (lf - lp)).sum(-1).mean()) < 0.05


@pytest.mark.parametrize("name", ENGINES_ON_CPU)
def test_answer_logits_are_the_answer_rows_through_the_cache(engines, ids, name):
    """`answer_logits` (prompt prefilled into the cache, answer read through it; HF engines skip
    the prompt's own logits) gives the rows of `logits_pieces` that predict the answer."""
    from qval.engines.base import Engine

    e = engines[name]
    prompt, answer = ids[0, :-4].tolist(), ids[0, -4:].tolist()
    got = e.answer_logits(prompt, answer)
    want = Engine.answer_logits(e, prompt, answer)  # the interface's own definition, through logits_pieces
    assert got.shape == (4, want.shape[-1])
    # the decoder runs the same shapes both ways; only the prompt's lm_head runs on one row instead
    # of all of them (last-bit differences in the first row, which no quantizer sees: lm_head is excluded)
    torch.testing.assert_close(got[1:], want[1:], rtol=0, atol=0)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ENGINES_ON_CPU)
def test_greedy_generation(engines, ids, default_model, name):
    e = engines[name]
    gen = e.generate([ids[0].tolist()], 3, suppress_eos=True, batch_size=1)
    assert len(gen.tokens) == 1 and len(gen.tokens[0]) == 3 and gen.first_nonfinite_step == [None]
    assert gen.tokens[0][0] == int(e.logits(ids)[0, -1].argmax())
    assert default_model.tokenizer.eos_token_id not in gen.tokens[0]


@pytest.mark.parametrize("name", ENGINES_ON_CPU)
def test_describe(engines, name):
    d = engines[name].describe()
    assert d["backend"] == name and "device" in d and isinstance(d["executed"], bool)
    assert d["executed"] is (name != "tensorrt_llm")


def test_candidates_agree_with_each_other(engines, ids):
    """export, checkpoint(export) and the stand-in read the same files: identical logits.
    realquant and export hold the same FP8 codes (rounding ties resolved the same way)."""
    ex = engines["export"].logits(ids)
    torch.testing.assert_close(engines["checkpoint"].logits(ids), ex, rtol=0, atol=0)
    torch.testing.assert_close(engines["tensorrt_llm"].logits(ids), ex, rtol=0, atol=0)
    rq = engines["realquant"].logits(ids)
    assert torch.equal(rq.argmax(-1), ex.argmax(-1))

"""The decode runtime's contract on a GPU (skipped without CUDA; run on the H200 through the device
tool): the built-in model (fp16, qval's deterministic mode) with the runtime on — the static decoder,
CUDA graphs, the fused step (compiled RMSNorm / rotary / SiLU·mul, gemv.py's products) and
decode_kernel.py's split-KV attention — and off (`runtime="transformers"`: transformers' `generate`,
cache and sdpa).

Tolerances (stated before the first run):
- scoring (a chunk; 300 positions in pieces of 64 through the KV cache; an answer after a prompt):
  every logit within 1/16 of the plain path's (a few float16 ulps at the logits' scale);
- generation (8 left-padded prompts × 128 tokens, EOS suppressed): every token the runtime emits is,
  under transformers' own forward of the same row (teacher-forced), within 0.1 of that step's top
  logit among the tokens generation may emit (EOS excluded) — a row may part from the plain path's
  only where two tokens are that near a tie. The plain path's own tokens are held to the same bound.
The figures (and the decode speed with the fused step on and off, and on the plain path) are printed
as one JSON line, `RUNTIME_GPU {...}`, and written to $OUT/runtime_gpu.json when OUT is set."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.gpu]

SCORE_TOL = 1 / 16
TIE_TOL = 0.1
PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,", "def fibonacci(n):",
           "Water boils at", "The three primary colours are", "In 1969 the first humans", "A good recipe for bread needs",
           "Translate to French: the cat sleeps on the"]
FIGURES: dict = {}


@pytest.fixture(scope="module")
def engines(default_model):
    from qval.engines.hf import HFEngine

    m, tok = default_model.model, default_model.tokenizer
    assert next(m.parameters()).is_cuda
    unfused = HFEngine(m, tok)
    unfused.static_fused = False
    return {"plain": HFEngine(m, tok, runtime="transformers"), "unfused": unfused, "fused": HFEngine(m, tok)}


def test_scoring_on_and_off(engines, default_model):
    tok = default_model.tokenizer
    text = " ".join(["The committee published its report on Tuesday, and the members met again to discuss it."] * 20)
    ids = torch.tensor([tok(text)["input_ids"][:300]])
    on, off = engines["fused"], engines["plain"]
    prompt, answer = tok(PROMPTS[1])["input_ids"], tok(" and then they all went home.", add_special_tokens=False)["input_ids"]
    pairs = {
        "chunk": (on.logits(ids[:, :64].repeat(2, 1)), off.logits(ids[:, :64].repeat(2, 1))),
        "pieces": (torch.cat(list(on.logits_pieces(ids, 64)), 1), torch.cat(list(off.logits_pieces(ids, 64)), 1)),
        "answer": (on.answer_logits(prompt, answer), off.answer_logits(prompt, answer)),
    }
    FIGURES["scoring_max_abs_diff"] = {k: float((a.float() - b.float()).abs().max()) for k, (a, b) in pairs.items()}
    FIGURES["scoring_equal"] = {k: bool(torch.equal(a, b)) for k, (a, b) in pairs.items()}
    assert all(d <= SCORE_TOL for d in FIGURES["scoring_max_abs_diff"].values()), FIGURES


def gaps(engine, prompts, rows):
    """Per row, the largest (top logit − the emitted token's logit) over its steps, under `engine`'s
    own teacher-forced forward of prompt + tokens, over the tokens generation may emit (EOS is
    suppressed there: its logit is no competitor)."""
    out = []
    for p, r in zip(prompts, rows):
        logits = engine.logits(torch.tensor([p + r]))[0, len(p) - 1 : len(p) - 1 + len(r)].float()
        logits[:, engine.eos_ids()] = float("-inf")
        chosen = logits.gather(1, torch.tensor(r, device=logits.device)[:, None])[:, 0]
        out.append(float((logits.max(-1).values - chosen).max()))
    return out


def timed(engine, prompts, new_tokens, batch):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g = engine.generate(prompts, new_tokens, suppress_eos=True, batch_size=batch)
    torch.cuda.synchronize()
    return g, (time.perf_counter() - t0) * 1000 / new_tokens


def test_generation_on_and_off_and_the_process_unchanged(engines, default_model):
    import transformers.integrations.sdpa_attention as sdpa
    from transformers.models.llama import modeling_llama as ml

    def library():
        return [id(torch.nn.Linear.forward), id(ml.apply_rotary_pos_emb), id(ml.LlamaRMSNorm.forward),
                id(ml.LlamaMLP.forward), id(ml.LlamaAttention.forward), id(sdpa.use_gqa_in_sdpa), id(sdpa.sdpa_attention_forward)]

    before, inside = library(), []
    hook = default_model.model.model.layers[0].register_forward_pre_hook(lambda m, a: inside.append(library() == before))
    tok = default_model.tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    runs, speed = {}, {}
    for name, engine in engines.items():
        engine.generate(prompts, 128, suppress_eos=True, batch_size=8)  # warm-up, same shape: compiles, graph captures
        runs[name], speed[f"{name}_b8_ms_per_step"] = timed(engine, prompts, 128, 8)
        engine.generate(prompts[:1], 256, suppress_eos=True, batch_size=1)
        _, speed[f"{name}_b1_ms_per_step"] = timed(engine, prompts[:1], 256, 1)
    hook.remove()
    plain = runs["plain"].tokens
    FIGURES["speed"] = speed
    FIGURES["fused"] = engines["fused"].describe().get("decode_fused")
    FIGURES["notes"] = engines["fused"].describe()["notes"]
    for name in ("unfused", "fused"):
        rows = runs[name].tokens
        FIGURES[f"{name}_first_divergence"] = [next((i for i, (a, b) in enumerate(zip(r, s)) if a != b), None)
                                               for r, s in zip(rows, plain)]
        FIGURES[f"{name}_tie_gap"] = gaps(engines["plain"], prompts, rows)
    FIGURES["plain_tie_gap"] = gaps(engines["plain"], prompts, plain)  # the plain path's own, for scale
    FIGURES["library_unchanged"] = [library() == before, all(inside), len(inside)]
    write()
    assert engines["fused"].decode_path() == "static" and engines["plain"].decode_path() == "plain"
    assert FIGURES["fused"] and FIGURES["fused"]["rope"] > 0 and not engines["fused"].runtime.failures, FIGURES
    assert all(g <= TIE_TOL for g in FIGURES["fused_tie_gap"] + FIGURES["unfused_tie_gap"] + FIGURES["plain_tie_gap"]), FIGURES
    assert FIGURES["library_unchanged"][:2] == [True, True] and len(inside) > 100


def write() -> None:
    line = json.dumps(FIGURES, default=str)
    print("RUNTIME_GPU", line)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "runtime_gpu.json"), "w", encoding="utf-8") as f:
            f.write(line + "\n")

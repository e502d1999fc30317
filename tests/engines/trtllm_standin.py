"""A stand-in for the TensorRT-LLM LLM API, following its documented surface: `LLM(model=…,
tokenizer=…, tensor_parallel_size=…, kv_cache_config=…)`, `LLM.generate(prompts,
sampling_params=…, use_tqdm=…)` returning `RequestOutput`s with `context_logits` [prompt_len,
vocab] and `outputs[0]` (`CompletionOutput`: `token_ids`, `generation_logits` [steps, vocab]);
`SamplingParams(max_tokens, top_k, end_id, ignore_eos, bad_token_ids, return_context_logits,
return_generation_logits)`; `KvCacheConfig(enable_block_reuse, free_gpu_memory_fraction)`.

It computes with a transformers model (greedy, full forward per step, no cache), so the adapter
can be checked against the HF engine number for number. It records every call for the tests.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class KvCacheConfig:
    enable_block_reuse: bool = True
    free_gpu_memory_fraction: float | None = 0.9


@dataclass
class SamplingParams:
    max_tokens: int = 32
    top_k: int | None = None
    end_id: int | None = None
    ignore_eos: bool = False
    bad_token_ids: list[int] | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    generation_logits: torch.Tensor | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    context_logits: torch.Tensor | None = None


class LLM:
    instances: list["LLM"] = []

    def __init__(self, model: str, tokenizer: Any = None, tensor_parallel_size: int = 1,
                 kv_cache_config: KvCacheConfig | None = None, **kwargs: Any) -> None:
        self.model_path, self.tokenizer = model, tokenizer
        self.tensor_parallel_size, self.kv_cache_config, self.kwargs = tensor_parallel_size, kv_cache_config, kwargs
        self.hf_model: torch.nn.Module | None = None  # the tests attach the model that computes
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        LLM.instances.append(self)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling_params: SamplingParams, use_tqdm: bool = True) -> list[RequestOutput]:
        assert all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts), "token-id prompts"
        self.calls.append((prompts, sampling_params))
        sp, out = sampling_params, []
        for p in prompts:
            ids = torch.tensor([p])
            ctx = self.hf_model(input_ids=ids).logits[0].float()
            tokens, gen_logits = [], []
            logits = ctx[-1]
            for _ in range(sp.max_tokens):
                gen_logits.append(logits)
                scores = logits.clone()
                if sp.bad_token_ids:
                    scores[sp.bad_token_ids] = float("-inf")
                nxt = int(scores.argmax())
                tokens.append(nxt)
                if nxt == sp.end_id and not sp.ignore_eos:
                    break
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
                logits = self.hf_model(input_ids=ids).logits[0, -1].float()
            comp = CompletionOutput(0, tokens, torch.stack(gen_logits) if sp.return_generation_logits else None)
            out.append(RequestOutput(p, [comp], ctx if sp.return_context_logits else None))
        return out


def api() -> types.SimpleNamespace:
    """The namespace `import_llm_api` returns, without `real`: runs on it are not executed TensorRT-LLM."""
    return types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, KvCacheConfig=KvCacheConfig)

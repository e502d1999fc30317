"""`tensorrt_llm`: the candidate as a TensorRT-LLM engine, through the LLM API.

NOT EXECUTED HERE: no machine qval was developed on has `tensorrt_llm`. The adapter is written
against the documented LLM API and tested against a stand-in that follows it
(tests/engines/trtllm_standin.py); every report of a run whose engine was not a real
`tensorrt_llm.LLM` says "NOT EXECUTED here" (`executed = False`).

The build exports the calibrated candidate (ModelOpt's unified HF checkpoint, which the LLM
API's PyTorch backend loads directly), runs the fidelity check, then opens the checkpoint with
`LLM(model=…, tensor_parallel_size=tp_size, kv_cache_config=KvCacheConfig(enable_block_reuse=False))`.
Block reuse is off because with prefix reuse a request whose prefix is cached only returns
context logits for the recomputed suffix (ModelOpt's own runner asserts the same).

- `logits`: `SamplingParams(max_tokens=1, return_context_logits=True)`; `RequestOutput.context_logits`
  is [prompt_len, vocab].
- `logits_pieces`: one context request (the LLM API has no teacher-forced incremental call),
  its logits yielded `piece` rows at a time; the full [T, vocab] tensor exists once, on the
  library's side.
- `generate`: greedy (`top_k=1`), `return_generation_logits=True` to watch for NaN/Inf per step;
  EOS suppression is `bad_token_ids=eos` with `ignore_eos=True`, the same as the HF engine's −inf.
"""

from __future__ import annotations

import types
from typing import Any, Iterator

import torch

from ..errors import BackendUnavailable
from ..export.build import BuildResult, build_export, fidelity_summary
from ..export.formats import check_exportable
from .base import BuildContext, Engine, Generation
from .hf import HFEngine
from ..backends import TensorRTLLMOptions  # noqa: F401  (declared with the backend's name; re-exported here)

NOT_EXECUTED = "TensorRT-LLM adapter NOT EXECUTED here: it ran against a stand-in object, not tensorrt_llm.LLM"


def import_llm_api() -> types.SimpleNamespace:
    """`LLM`, `SamplingParams`, `KvCacheConfig` from tensorrt_llm, or a clear error."""
    try:
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi import KvCacheConfig
    except ImportError as err:
        raise BackendUnavailable(
            f"engine backend tensorrt_llm needs the tensorrt_llm package ({err}); it installs on Linux with an NVIDIA GPU "
            "(pip install tensorrt_llm). Elsewhere gate the same export with engine: {backend: export}."
        ) from None
    return types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, KvCacheConfig=KvCacheConfig, real=True)


def make_llm(api: Any, folder: str, options: TensorRTLLMOptions, trust_remote_code: bool = False) -> Any:
    kv = api.KvCacheConfig(enable_block_reuse=False, free_gpu_memory_fraction=options.free_gpu_memory_fraction)
    kwargs: dict[str, Any] = {"model": folder, "tokenizer": folder, "tensor_parallel_size": options.tp_size,
                              "kv_cache_config": kv, "trust_remote_code": trust_remote_code}
    if options.max_batch_size is not None:
        kwargs["max_batch_size"] = options.max_batch_size
    return api.LLM(**kwargs)


class TensorRTLLMEngine(Engine):
    backend = "tensorrt_llm"

    def __init__(self, llm: Any, api: Any, eos_ids: list[int], *, executed: bool, build: BuildResult | None = None,
                 tp_size: int = 1) -> None:
        self.llm, self.api, self.eos = llm, api, list(eos_ids)
        self.executed = executed
        self.build = build
        self.tp_size = tp_size

    @property
    def device(self) -> str:
        return "cuda (tensorrt_llm)" if self.executed else "stand-in"

    @property
    def fidelity(self) -> dict[str, Any] | None:
        return self.build.fidelity if self.build else None

    def _run(self, prompts: list[list[int]], params: Any) -> list[Any]:
        return list(self.llm.generate(prompts, sampling_params=params, use_tqdm=False))

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        params = self.api.SamplingParams(max_tokens=1, return_context_logits=True)
        outs = self._run(input_ids.tolist(), params)
        return torch.stack([torch.as_tensor(o.context_logits).float().cpu() for o in outs])

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[torch.Tensor]:
        full = self.logits(input_ids[:1])
        for start in range(0, full.shape[1], piece):
            yield full[:, start : start + piece]
        del full

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int, progress: Any = None
    ) -> Generation:
        params = self.api.SamplingParams(max_tokens=max_new_tokens, top_k=1, end_id=self.eos[0],
                                         return_generation_logits=True, ignore_eos=suppress_eos,
                                         bad_token_ids=list(self.eos) if suppress_eos else None)
        tokens: list[list[int]] = []
        bad: list[int | None] = []
        eos_at: list[int | None] = []
        for b0 in range(0, len(prompts), batch_size):
            group = prompts[b0 : b0 + batch_size]
            for out in self._run(group, params):
                comp = out.outputs[0]
                row = list(comp.token_ids)
                stop = None if suppress_eos else next((i for i, t in enumerate(row) if t in self.eos), None)
                tokens.append(row if stop is None else row[: stop + 1])
                eos_at.append(stop)
                logits = comp.generation_logits
                finite = torch.isfinite(torch.as_tensor(logits).float()).all(dim=-1) if logits is not None else None
                bad.append(None if finite is None or bool(finite.all()) else int((~finite).nonzero()[0, 0]))
            if progress is not None:
                progress(len(group))
        return Generation(tokens=tokens, first_nonfinite_step=bad, eos_step=eos_at)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["tp_size"] = self.tp_size
        d["kv_cache_block_reuse"] = False
        d["notes"] = ([] if self.executed else [NOT_EXECUTED]) + [
            "logits_pieces: one context-logits request sliced into pieces (no teacher-forced incremental call in the LLM API)"]
        if self.build is not None:
            d["export"] = {"folder": str(self.build.folder), "reused": self.build.cached}
            d["fidelity"] = fidelity_summary(self.build.fidelity)
        return d


def build_tensorrt_llm(ctx: BuildContext) -> TensorRTLLMEngine:
    api = import_llm_api()  # first: no export is written for an engine that cannot run
    options = TensorRTLLMOptions.model_validate(ctx.config.engine.options)
    build = build_export(ctx.config, ctx.reference, ctx.calib_state, ctx.run_dir, options, ctx.log)
    llm = make_llm(api, str(build.folder), options, ctx.config.model.trust_remote_code)
    eos = HFEngine(ctx.reference.model, ctx.reference.tokenizer).eos_ids()
    return TensorRTLLMEngine(llm, api, eos, executed=bool(getattr(api, "real", False)), build=build, tp_size=options.tp_size)



def check(cfg: Any) -> None:
    check_exportable(cfg.quant.format.value, f"{cfg.source_file or cfg.name}: engine {cfg.engine.backend}")


build_tensorrt_llm.check = check  # type: ignore[attr-defined]

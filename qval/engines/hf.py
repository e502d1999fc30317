"""A transformers causal LM as an engine: the reference, and the base of simulated candidates."""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .base import Engine, Generation


class _StepWatch:
    """A logits processor that records, per sequence, the first decoding step whose logits
    were not all finite; it runs first, so it sees the model's own logits."""

    def __init__(self, batch: int) -> None:
        self.step = 0
        self.first_bad: list[int | None] = [None] * batch

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bad = (~torch.isfinite(scores).all(dim=-1)).tolist()
        for i, b in enumerate(bad):
            if b and self.first_bad[i] is None:
                self.first_bad[i] = self.step
        self.step += 1
        return scores


class HFEngine(Engine):
    backend = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, notes: list[str] | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.notes = list(notes or [])

    @property
    def device(self) -> str:
        return str(next(self.model.parameters()).device)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids.to(self.device), use_cache=False).logits

    @torch.no_grad()
    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[torch.Tensor]:
        from transformers import DynamicCache

        cache = DynamicCache()
        ids = input_ids.to(self.device)
        for start in range(0, ids.shape[1], piece):
            out = self.model(input_ids=ids[:, start : start + piece], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            yield out.logits

    def eos_ids(self) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [int(i) for i in ids if i is not None]

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int, progress: Any = None
    ) -> Generation:
        from transformers import LogitsProcessorList

        eos = self.eos_ids()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        tokens: list[list[int]] = []
        bad: list[int | None] = []
        eos_at: list[int | None] = []
        for b0 in range(0, len(prompts), batch_size):
            group = prompts[b0 : b0 + batch_size]
            width = max(len(p) for p in group)
            # left padding, so every sequence's next token sits in the last column
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=self.device)
            watch = _StepWatch(len(group))
            kwargs: dict[str, Any] = {}
            if suppress_eos:
                kwargs["suppress_tokens"] = eos
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens if suppress_eos else 0,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad,
                eos_token_id=eos,
                logits_processor=LogitsProcessorList([watch]),
                temperature=None,
                top_p=None,
                top_k=None,
                **kwargs,
            )
            for row in out[:, width:].tolist():
                stop = next((i for i, t in enumerate(row) if t in eos), None)
                eos_at.append(None if suppress_eos else stop)
                tokens.append(row if stop is None else row[: stop + 1])
            bad.extend(watch.first_bad)
            if progress is not None:
                progress(len(group))
        return Generation(tokens=tokens, first_nonfinite_step=bad, eos_step=eos_at)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["dtype"] = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        d["notes"] = self.notes
        return d

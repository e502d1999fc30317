"""One qval engine as an lm-evaluation-harness model, so lm-eval's prompts, few-shot selection,
filters and metrics run unchanged on the reference and on the candidate.

It tokenizes exactly as lm-eval's HFLM does (its `tok_encode`, TemplateLM's `_encode_pair`:
the whole of context + continuation encoded and split at the context's length, trailing spaces
moved into the continuation, an empty context replaced by the prefix token) and scores as HFLM
does at batch size 1, so the reference's figures are lm-eval's own for the same model:

- loglikelihood: (context + continuation)[-(max_length + 1):][:-1] read through the engine's KV
  cache `piece` tokens at a time (`Engine.logits_pieces`, as gate 4's own items: one piece for
  a short item, the forward HFLM makes), the continuation's log-probability summed (log-softmax
  in float32) and whether every continuation token is the argmax.
- loglikelihood_rolling: HFLM's disjoint rolling windows of max_length tokens
  (`lm_eval.utils.get_rolling_token_windows` / `make_disjoint_window`), summed.
- generate_until: greedy `Engine.generate` of max_gen_toks tokens from the context (left-truncated
  to max_length − max_gen_toks), kept up to where HFLM's stopping criterion would have stopped
  (a stop string within the last len(stop tokens) + 2 tokens, raw decoding), decoded, and cut
  at the stop strings (lm-eval's `postprocess_generated_text`). Sampling is refused: qval's
  engines decode greedily.

Importing this module needs lm-eval; `qval.suites.lmeval_task.require` says what to install.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import (
    _add_special_kwargs,
    handle_stop_sequences,
    has_bos_prefix,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..errors import ConfigError, DataError
from ..logits import cat

MAX_GEN_TOKS = 256  # HFLM's default when a task's generation_kwargs set no max_gen_toks


class NonFiniteLogits(Exception):
    """An engine gave NaN/Inf logits (or a NaN/Inf step in generation) on one document."""

    def __init__(self, who: str, doc_id: Any) -> None:
        super().__init__(f"the {who} produced non-finite logits on document {doc_id}")
        self.who, self.doc_id = who, doc_id


class EngineFailed(Exception):
    """The engine itself raised (not lm-eval, not the task): re-raised as qval's own failure."""


def stop_index(tokens: list[int], until: list[str], decode: Any, encode: Any) -> int:
    """How many of greedily generated `tokens` HFLM keeps: generation stops after the first token
    at which a stop string appears in the raw decoding of the last len(its tokens) + 2 tokens
    (lm-eval's MultiTokenEOSCriteria). `decode`/`encode`: the tokenizer's, raw (special tokens kept).

    >>> text = {1: "a", 2: "\\n", 3: "b"}
    >>> dec = lambda ids: "".join(text[i] for i in ids)
    >>> stop_index([1, 2, 3], ["\\n"], dec, lambda s: [2]), stop_index([1, 3], ["\\n"], dec, lambda s: [2])
    (2, 2)
    """
    looks = [(s, len(encode(s)) + 2) for s in until if s]
    for t in range(len(tokens)):
        for s, n in looks:
            if s in decode(tokens[max(0, t + 1 - n) : t + 1]):
                return t + 1
    return len(tokens)


class EngineLM(TemplateLM):
    """A qval `Engine` (+ the reference's tokenizer) as an lm-eval model; `who` names it in errors."""

    def __init__(self, engine: Any, tokenizer: Any, who: str, max_length: int, batch_size: int = 1, piece: int = 1024) -> None:
        super().__init__()
        self.engine, self.tokenizer, self.who = engine, tokenizer, who
        self._max_length, self._batch, self._piece = int(max_length), int(batch_size), int(piece)
        self._doc_ids: list[Any] | None = None

    # --- what lm-eval reads of a model
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:  # HFLM's: BOS, else EOS
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return MAX_GEN_TOKS

    @property
    def tokenizer_name(self) -> str:  # lm-eval fingerprints chat-templated requests with it (HFLM's)
        return str(getattr(self.tokenizer, "name_or_path", "") or "qval").replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """HFLM's: the tokenizer's own template; a prefilled answer continues the last message; a
        template that refuses a system turn gets the history without it."""
        import jinja2

        kw = {"tokenize": False, "add_generation_prompt": add_generation_prompt,
              "continue_final_message": not add_generation_prompt}
        try:
            return self.tokenizer.apply_chat_template(chat_history, **kw)
        except jinja2.exceptions.TemplateError:
            return self.tokenizer.apply_chat_template([m for m in chat_history if m["role"] != "system"], **kw)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs: Any) -> list[int]:
        special = _add_special_kwargs(add_special_tokens, None)  # HFLM with add_bos_token unset
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        enc = self.tokenizer.encode(string, **special)
        return enc[-left_truncate_len:] if left_truncate_len else enc

    def tok_decode(self, tokens: Any, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    # --- scoring
    def _input(self, context: list[int], continuation: list[int], doc_id: Any) -> list[int]:
        """What the model reads for one request: HFLM's (context + continuation)[-(max_length + 1):][:-1]."""
        if not continuation:
            raise DataError(f"lm-eval asked the {self.who} to score an empty continuation (document {doc_id}); "
                            "the task's doc_to_target / doc_to_choice gives an empty string")
        if len(continuation) > self.max_length:
            raise DataError(f"document {doc_id}: a continuation of {len(continuation)} tokens is longer than the "
                            f"context ({self.max_length} tokens); raise the suite's max_length or shorten the task's targets")
        return (context + continuation)[-(self.max_length + 1) :][:-1]

    def _logits(self, inp: list[int], rows: int, doc_id: Any) -> torch.Tensor:
        """The last `rows` rows of the engine's logits on `inp`, float32, checked finite."""
        try:
            pieces = [x[0].float() for x in self.engine.logits_pieces(torch.tensor([inp]), self._piece)]
        except Exception as err:  # noqa: BLE001 - the engine's own failure, not lm-eval's
            raise EngineFailed(f"the {self.who} failed scoring document {doc_id}") from err
        logits = torch.cat(pieces)[len(inp) - rows :]
        if not torch.isfinite(logits).all():
            raise NonFiniteLogits(self.who, doc_id)
        return logits

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False,
                              doc_ids: list[Any] | None = None, **kwargs: Any) -> list[tuple[float, bool]]:
        """(summed log-probability, greedy) per request. Requests whose model input is the same
        (one-token options after one context: HFLM's logits cache) share one forward."""
        ids = doc_ids or self._doc_ids or [None] * len(requests)
        if not getattr(self.engine, "full_logits", True):
            return [self._answer_compact(req, doc_id) for req, doc_id in zip(requests, ids)]
        inputs = [self._input(ctx, cont, doc_id) for (_, ctx, cont), doc_id in zip(requests, ids)]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, inp in enumerate(inputs):
            groups.setdefault(tuple(inp), []).append(i)
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for members in groups.values():
            rows = max(len(requests[i][2]) for i in members)
            logp = torch.log_softmax(self._logits(inputs[members[0]], rows, ids[members[0]]), dim=-1)
            greedy = logp.argmax(dim=-1)
            for i in members:
                key, _, cont = requests[i]
                target = torch.tensor(cont, device=logp.device)
                part = logp[rows - len(cont) :]
                answer = (float(part[torch.arange(len(cont), device=logp.device), target].sum()),
                          bool((greedy[rows - len(cont) :] == target).all()))
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
                out[i] = answer
        return out

    def _answer_compact(self, request: tuple[Any, list[int], list[int]], doc_id: Any) -> tuple[float, bool]:
        """An engine known by its top K (a served engine): the continuation goes into the input too, so each
        of its tokens is a next token whose log-probability the engine gives exactly; the rows before it
        are the same as HFLM's (a causal model's row never sees what follows it)."""
        key, ctx, cont = request
        inp = self._input(ctx, cont, doc_id) + cont[-1:]
        try:
            block = cat([x[0] for x in self.engine.logits_pieces(torch.tensor([inp]), self._piece)])
        except Exception as err:  # noqa: BLE001 - the engine's own failure, not lm-eval's
            raise EngineFailed(f"the {self.who} failed scoring document {doc_id}") from err
        rows = block[len(inp) - 1 - len(cont) : len(inp) - 1]
        if not rows.all_finite():
            raise NonFiniteLogits(self.who, doc_id)
        answer = (float(rows.next_logp.double().sum()), bool((rows.best == torch.tensor(cont)).all()))
        if key is not None:
            self.cache_hook.add_partial("loglikelihood", key, answer)
        return answer

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._doc_ids = [r.doc_id for r in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=True)
        finally:
            self._doc_ids = None

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in requests:
            string = req.args[0]
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            lls = self._loglikelihood_tokens([(None, a, b) for a, b in windows], doc_ids=[req.doc_id] * len(windows))
            total = sum(ll for ll, _ in lls)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    def _context_ids(self, context: str, max_ctx: int) -> list[int]:
        """HFLM's tok_batch_encode at batch size 1: special tokens unless the text starts with BOS."""
        special = {"add_special_tokens": False} if has_bos_prefix(context, getattr(self.tokenizer, "bos_token", None)) else {}
        return list(self.tokenizer(context, **special)["input_ids"])[-max_ctx:]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):  # one engine call per distinct generation_kwargs, as HFLM batches
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str | None] = [None] * len(requests)
        for members in groups.values():
            first = requests[members[0]]
            kwargs = normalize_gen_kwargs(first.args[1], self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise ConfigError(f"lm-eval task {first.task_name} asks for sampled generations (do_sample / temperature "
                                  "in its generation_kwargs); qval compares greedy answers: set do_sample: false in the "
                                  "task, or pick a task that decodes greedily")
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            new = int(kwargs.pop("max_gen_toks"))
            max_ctx = self.max_length - new
            if max_ctx <= 0:
                raise ConfigError(f"lm-eval task {first.task_name} generates {new} tokens, which leaves no room for a "
                                  f"prompt in the context ({self.max_length} tokens); raise the suite's max_length")
            prompts = [self._context_ids(requests[i].args[0], max_ctx) for i in members]
            try:
                gen = self.engine.generate(prompts, new, suppress_eos=False, batch_size=self._batch)
            except Exception as err:  # noqa: BLE001
                raise EngineFailed(f"the {self.who} failed generating for task {first.task_name}") from err
            raw_decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
            raw_encode = lambda s: self.tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
            for i, tokens, bad in zip(members, gen.tokens, gen.first_nonfinite_step):
                keep = stop_index(list(tokens), until, raw_decode, raw_encode)
                if bad is not None and bad < keep:
                    raise NonFiniteLogits(self.who, requests[i].doc_id)
                text = postprocess_generated_text(self.tok_decode(list(tokens)[:keep]), until, None)
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
                out[i] = text
        return [t if t is not None else "" for t in out]

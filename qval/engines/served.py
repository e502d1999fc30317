"""`served`: the candidate is a model an inference server serves, reached by URL or started by qval.

Scoring goes through the completions API's prompt log-probabilities (vLLM's `prompt_logprobs`): per
prompt position the top K tokens' log-probabilities and the actual next token's, keyed by token id;
the last position's top K from one generated token. The answer is a `Compact` block (qval/logits.py):
top-1, NLL, perplexity and Δp are exact, KLD an estimate with a strict lower bound beside it
(qval/metrics/topk.py). A sequence is sent whole: the server prefills it as it prefills any prompt
(chunked as it chunks), so `logits_pieces` slices one answer. Generation is greedy with token ids in
and out; every sampling setting a server may take from the model's generation config is pinned to
greedy, EOS is suppressed with `logit_bias` −100 plus `ignore_eos` (a server option; qval's own
engines set −inf), and prompts are batched by sending them concurrently (the server batches as it
does in deployment). What the server is — version, model, arguments — is part of the report and of
the gates' stage keys.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import torch

from ..logits import Compact, from_topk
from .api import Client, ServerError
from .base import Engine, Generation
from .hf import split_rows
from .server import LaunchedServer

#: sampling settings pinned to greedy (a server may default them from the model's generation config)
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0}
EOS_BIAS = -100.0  # the most negative logit_bias the OpenAI API allows


def _token_id(key: str) -> int:
    """A token id from a log-probability key: vLLM keys prompt log-probabilities by the id itself and,
    with `return_tokens_as_token_ids`, generated ones as "token_id:N"."""
    return int(key.rsplit(":", 1)[-1])


def _descending(pair: tuple[int, float]) -> tuple[bool, float]:
    """Sort key: the most likely first, NaN last."""
    return math.isnan(pair[1]), -pair[1] if not math.isnan(pair[1]) else 0.0


def _entry_logprob(entry: Any) -> float:
    lp = entry.get("logprob") if isinstance(entry, dict) else entry
    return float(lp) if lp is not None else math.nan


class ServedEngine(Engine):
    backend = "served"
    full_logits = False

    def __init__(self, client: Client, model: str, vocab: int, top_k: int, concurrency: int, eos: list[int],
                 describe: dict[str, Any], server: LaunchedServer | None = None, notes: list[str] | None = None,
                 fidelity: dict[str, Any] | None = None, config: Any = None) -> None:
        self.client = client
        self.model_name = model
        self.vocab = vocab
        self.top_k = top_k
        self.concurrency = concurrency
        self.eos = eos
        self.server = server
        self.notes = list(notes or [])
        self._facts = describe
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="qval-served")
        if fidelity is not None:
            self.fidelity = fidelity  # the export the server serves (launch.model: candidate): its own gate
        self._config = config  # the served model's configuration where qval has it (a served reference's config.json)

    @property
    def device(self) -> str:
        return f"server:{self.client.base}"

    @property
    def model_config(self) -> Any:
        return self._config

    # ---- scoring -----------------------------------------------------------------------------
    def _score(self, ids: list[int]) -> Compact:
        """One sequence's [T] block: position t predicts token t + 1 (the last, what would follow)."""
        body = {"model": self.model_name, "prompt": ids, "max_tokens": 1, **GREEDY, "prompt_logprobs": self.top_k,
                "logprobs": self.top_k, "return_tokens_as_token_ids": True}
        answer = self.client.call("POST", "/v1/completions", body, what=f"scoring a {len(ids)}-token prompt")
        try:
            choice = answer["choices"][0]
            prompt = choice.get("prompt_logprobs")
            last = (choice.get("logprobs") or {}).get("top_logprobs") or [None]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"the server at {self.client.base} answered a scoring request without choices: "
                              f"{str(answer)[:300]}") from None
        if not isinstance(prompt, list) or len(prompt) != len(ids):
            raise ServerError(f"the server at {self.client.base} returned no prompt_logprobs for a {len(ids)}-token prompt "
                              "(got " + (f"{len(prompt)} entries" if isinstance(prompt, list) else repr(prompt)[:80]) + "): "
                              "qval scores a served model through the completions API's prompt log-probabilities "
                              "(vLLM's prompt_logprobs); serve it with an engine that returns them.")
        t, k = len(ids), self.top_k
        top_idx = torch.zeros(t, k, dtype=torch.int64)
        top_logp = torch.full((t, k), -math.inf)
        next_token = torch.tensor(ids[1:] + [-1])
        next_logp = torch.full((t,), math.nan)
        finite = torch.ones(t, dtype=torch.bool)
        for pos in range(t):
            try:
                self._position(prompt, last, pos, t, k, next_token, next_logp, top_idx, top_logp, finite)
            except (ValueError, TypeError, AttributeError, IndexError, OverflowError) as err:  # a key not an id, a value not a number
                raise ServerError(f"the server at {self.client.base} answered a scoring request with malformed "
                                  f"log-probabilities at position {pos} of a {t}-token prompt ({type(err).__name__}: "
                                  f"{str(err)[:120]}); qval reads vLLM's prompt_logprobs format") from None
        return from_topk(self.vocab, top_idx, top_logp, next_token, next_logp, finite)

    def _position(self, prompt: list[Any], last: list[Any], pos: int, t: int, k: int, next_token: torch.Tensor,
                  next_logp: torch.Tensor, top_idx: torch.Tensor, top_logp: torch.Tensor, finite: torch.Tensor) -> None:
        """One position's answer read into row `pos` of the block's tensors."""
        entries = prompt[pos + 1] if pos + 1 < t else last[0]
        if not isinstance(entries, dict) or not entries:
            raise ServerError(f"the server at {self.client.base} gave no log-probabilities for position {pos} of a "
                              f"{t}-token prompt")
        pairs = sorted(((_token_id(key), _entry_logprob(v)) for key, v in entries.items()), key=_descending)
        nxt = int(next_token[pos])
        if nxt >= 0:
            got = entries.get(str(nxt))
            if got is None:
                raise ServerError(f"the server at {self.client.base} did not give the log-probability of the prompt's "
                                  f"token at position {pos + 1}; qval needs vLLM's prompt_logprobs semantics")
            next_logp[pos] = _entry_logprob(got)
        if any(lp > 1e-3 for _, lp in pairs if not math.isnan(lp)):  # a probability above 1
            raise ValueError(f"a log-probability above 0 ({max(lp for _, lp in pairs if not math.isnan(lp)):.4g})")
        top = pairs[:k]
        if len(top) < k:
            raise ServerError(f"the server at {self.client.base} gave {len(top)} log-probabilities where {k} were "
                              f"asked (top_k); is its limit (vLLM's --max-logprobs) lower?")
        if any(i < 0 or i >= self.vocab for i, _ in top):
            raise ServerError(f"the server at {self.client.base} returned token ids outside the reference's vocabulary "
                              f"of {self.vocab}: it serves a model with another vocabulary")
        top_idx[pos] = torch.tensor([i for i, _ in top])
        top_logp[pos] = torch.tensor([lp for _, lp in top])
        finite[pos] = all(math.isfinite(lp) for _, lp in pairs) and (nxt < 0 or math.isfinite(float(next_logp[pos])))

    def logits(self, input_ids: torch.Tensor) -> Compact:
        rows = list(self._pool.map(self._score, input_ids.tolist()))
        return Compact(vocab=self.vocab, **{f: torch.stack([getattr(r, f) for r in rows])
                                            for f in ("best", "next_token", "next_logp", "finite", "top_logp", "top_idx",
                                                      "log_tail")})

    def logits_pieces(self, input_ids: torch.Tensor, piece: int) -> Iterator[Compact]:
        """The whole sequence in one request (the server prefills it in its own chunks), yielded in pieces."""
        whole = self.logits(input_ids)
        for start in range(0, input_ids.shape[1], piece):
            yield whole[:, start : start + piece]

    def answer_logits(self, prompt: list[int], answer: list[int]) -> Compact:
        first = len(prompt) - 1
        return self.logits(torch.tensor([prompt + answer]))[0, first : first + len(answer)]

    # ---- generation ----------------------------------------------------------------------------
    def _generate_one(self, ids: list[int], new_tokens: int, suppress_eos: bool) -> tuple[list[int], int | None]:
        body: dict[str, Any] = {"model": self.model_name, "prompt": ids, "max_tokens": new_tokens, **GREEDY,
                                "logprobs": 1, "return_tokens_as_token_ids": True, "return_token_ids": True,
                                "skip_special_tokens": False}
        if suppress_eos:
            body["ignore_eos"] = True
            body["logit_bias"] = {str(e): EOS_BIAS for e in self.eos}
        else:
            body["stop_token_ids"] = self.eos
        answer = self.client.call("POST", "/v1/completions", body, what=f"generating {new_tokens} tokens")
        try:
            choice = answer["choices"][0]
            lp = choice.get("logprobs") or {}
            given = choice.get("token_ids")
            if given is None and lp.get("tokens") is not None:
                given = [_token_id(s) for s in lp["tokens"]]
            tokens = [int(t) for t in given] if given is not None else None
            steps = [float(x) if x is not None else math.nan for x in lp.get("token_logprobs") or []]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            tokens = None
        if tokens is None or any(t < 0 or t >= self.vocab for t in tokens):  # an empty list: stopped at once
            raise ServerError(f"the server at {self.client.base} answered a generation request without its token ids "
                              f"(or with ids outside the reference's vocabulary of {self.vocab}): {str(answer)[:300]}; "
                              "qval asks vLLM's completions API for return_token_ids") from None
        bad = next((i for i, x in enumerate(steps) if not math.isfinite(x)), None)
        return tokens, bad

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, suppress_eos: bool, batch_size: int,
                 progress: Any = None) -> Generation:
        def one(ids: list[int]) -> tuple[list[int], int | None]:
            out = self._generate_one(ids, max_new_tokens, suppress_eos)
            if progress is not None:
                progress(1)
            return out

        done = list(self._pool.map(one, prompts))
        tokens, eos_at = split_rows([t for t, _ in done], self.eos, suppress_eos)
        return Generation(tokens=tokens, first_nonfinite_step=[b for _, b in done], eos_step=eos_at)

    # ---- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the server qval started (a server reached by URL is left as it is)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()

    release = close  # a sequential run drops the candidate: the server goes with it

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(self._facts)
        d["requests"] = {"answered": self.client.requests, "retried": self.client.retried}
        if self.server is not None and self.server.startup_seconds is not None:
            d.setdefault("launch", {})["startup_seconds"] = round(self.server.startup_seconds, 1)
        d["notes"] = self.notes
        return d

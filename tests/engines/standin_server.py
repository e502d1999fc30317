"""A stand-in for a vLLM server, for the served engine's error paths and plumbing (never its main test:
tests/engines/test_served_vllm.py gates a real vLLM server).

Run as vLLM's API server is (`python standin_server.py --model DIR --port P --served-model-name N …`,
other arguments ignored). Its "model" is a fixed rule: the logits after token x are a random vector
seeded by x (numpy), the same every run, so a test knows every answer. The tokenizer is the model
folder's own (transformers), the vocabulary `STANDIN_VOCAB` (default 49152). `STANDIN_MODE` makes it
misbehave: `noise:S` (every logit moved by Gaussian noise of standard deviation S, seeded by the token too: a
damaged model that still answers), `exit_at_start`, `slow_start:S`, `die_after:N` (exit after N completions), `no_prompt_logprobs`,
`bad_tokenizer`, `sleep:S` (each completion takes S seconds). It writes its pid to `STANDIN_PIDFILE`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

VOCAB = int(os.environ.get("STANDIN_VOCAB", "49152"))
MODE = os.environ.get("STANDIN_MODE", "")


@functools.lru_cache(maxsize=512)  # a text repeats its tokens: each vector is drawn once (512 x 192 kB at most)
def logprobs_after(token: int) -> np.ndarray:
    """The stand-in model's next-token log-probabilities after `token` (float32; shared: read it, never write it)."""
    x = np.random.default_rng(token).standard_normal(VOCAB).astype(np.float32) * 3
    if MODE.startswith("noise:"):
        x += np.random.default_rng(token + 10**7).standard_normal(VOCAB).astype(np.float32) * float(MODE.split(":")[1])
    return x - (np.log(np.exp(x - x.max()).sum()) + x.max())


class Handler(BaseHTTPRequestHandler):
    server_version = "standin"
    completions = 0

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, blob: object) -> None:
        raw = json.dumps(blob).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": ARGS.served_model_name, "root": ARGS.model, "max_model_len": 8192}]})
        elif self.path in ("/version", "/health"):
            self._send(200, {"version": "standin-1"})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("model") != ARGS.served_model_name:
            self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            return
        if self.path == "/tokenize":
            ids = TOKENIZER(body["prompt"], add_special_tokens=False)["input_ids"]
            self._send(200, {"tokens": [i + 1 for i in ids] if MODE == "bad_tokenizer" else list(ids)})
            return
        if self.path != "/v1/completions":
            self._send(404, {"error": {"message": "not found"}})
            return
        Handler.completions += 1
        if MODE.startswith("die_after:") and Handler.completions > int(MODE.split(":")[1]):
            os._exit(3)
        if MODE.startswith("sleep:"):
            time.sleep(float(MODE.split(":")[1]))
        self._send(200, {"choices": [complete(body)]})


def top(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely (ties: the lower id first), as a stable sort of the whole vector gives them, without sorting
    the whole vector: every id at or above the k-th largest value, then those sorted."""
    if k < lp.size:
        kth = np.partition(-lp, k - 1)[k - 1]
        near = np.flatnonzero(-lp <= kth)  # ids in increasing order: the stable sort below keeps ties so
        idx = near[np.argsort(-lp[near], kind="stable")][:k]
    else:
        idx = np.argsort(-lp, kind="stable")
    return [(int(i), float(lp[i])) for i in idx]


def complete(body: dict) -> dict:
    ids = list(body["prompt"])
    choice: dict = {"index": 0, "finish_reason": "length"}
    k = body.get("prompt_logprobs")
    if k is not None and MODE != "no_prompt_logprobs":
        rows: list = [None]
        for t in range(1, len(ids)):
            lp = logprobs_after(ids[t - 1])
            entry = {str(i): {"logprob": v, "rank": r + 1} for r, (i, v) in enumerate(top(lp, k))}
            entry.setdefault(str(ids[t]), {"logprob": float(lp[ids[t]]), "rank": int((lp > lp[ids[t]]).sum()) + 1})
            rows.append(entry)
        choice["prompt_logprobs"] = rows
    bias = {int(t): float(b) for t, b in (body.get("logit_bias") or {}).items()}
    stops = set(body.get("stop_token_ids") or [])
    out, steps, tops, last = [], [], [], ids[-1]
    for _ in range(int(body.get("max_tokens", 16))):
        lp = logprobs_after(last)
        scored = lp.copy()
        for t, b in bias.items():
            scored[t] += b
        nxt = int(np.argmax(scored))
        out.append(nxt)
        steps.append(float(lp[nxt]))
        tops.append({f"token_id:{i}": v for i, v in top(lp, int(body.get("logprobs") or 1))})
        last = nxt
        if nxt in stops and not body.get("ignore_eos"):
            choice["finish_reason"] = "stop"
            break
    choice.update({"token_ids": out, "text": "",
                   "logprobs": {"tokens": [f"token_id:{t}" for t in out], "token_logprobs": steps, "top_logprobs": tops}})
    return choice


def main() -> None:
    global ARGS, TOKENIZER
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    ARGS, _ = p.parse_known_args()
    if pidfile := os.environ.get("STANDIN_PIDFILE"):
        with open(pidfile, "w") as f:
            f.write(str(os.getpid()))
    if MODE == "exit_at_start":
        print("standin: refusing to start (STANDIN_MODE=exit_at_start)", flush=True)
        sys.exit(1)
    if MODE.startswith("slow_start:"):
        time.sleep(float(MODE.split(":")[1]))
    from transformers import AutoTokenizer

    TOKENIZER = AutoTokenizer.from_pretrained(ARGS.model)
    print(f"standin: serving {ARGS.model} as {ARGS.served_model_name} on {ARGS.port}", flush=True)
    ThreadingHTTPServer((ARGS.host, ARGS.port), Handler).serve_forever()


ARGS: argparse.Namespace
TOKENIZER = None

if __name__ == "__main__":
    main()

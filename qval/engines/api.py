"""A client of an OpenAI-compatible completions server, with a stated retry rule.

Standard library only (`urllib`). A request that fails to connect, times out, or is answered 5xx/429
is retried `retries` times with backoff (1, 2, 4 … s, at most 30); a 4xx answer is the caller's
mistake and raised at once with the server's own message. What still fails is a `ServerError`
(a `QvalError`: exit 2), saying what was asked of which server and, where qval started it, the
server's last log lines (`diagnose`).
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any, Callable

from ..errors import QvalError


class ServerError(QvalError):
    """A served engine failed: not reachable, refused a request, or died."""


def _constant(name: str) -> float:
    # vLLM writes non-finite log-probabilities as bare NaN / -Infinity (not JSON): read them as floats
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


class Client:
    """`base`: the server's URL without `/v1`. `diagnose`: called when a request fails for good, it
    returns what to add to the message (a launched server's state and log)."""

    def __init__(self, base: str, *, timeout_s: float, retries: int, api_key_env: str | None = None,
                 diagnose: Callable[[], str] | None = None) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.diagnose = diagnose
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ServerError(f"engine.options.api_key_env names {api_key_env}, which is not set in the environment; "
                                  f"export {api_key_env}=<the server's API key> or remove api_key_env.")
            self.headers["Authorization"] = f"Bearer {key}"
        self.requests = 0  # requests answered
        self.retried = 0  # attempts repeated after a transient failure

    def _fail(self, what: str, why: str) -> ServerError:
        extra = self.diagnose() if self.diagnose is not None else ""
        return ServerError(f"the server at {self.base} failed {what}: {why}.{extra}")

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *, what: str = "",
             retries: int | None = None, timeout_s: float | None = None) -> Any:
        """The decoded JSON answer to one request; a `ServerError` once the retries are spent."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        tries = 1 + (self.retries if retries is None else retries)
        what = what or f"{method} {path}"
        last = ""
        for attempt in range(tries):
            if attempt:
                self.retried += 1
                time.sleep(min(30.0, 2.0 ** (attempt - 1)))
            req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers)
            try:
                with urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s) as resp:
                    raw = resp.read()
                self.requests += 1
                try:
                    return json.loads(raw, parse_constant=_constant)
                except ValueError:
                    raise self._fail(what, f"its answer is not JSON ({raw[:200]!r})") from None
            except urllib.error.HTTPError as err:
                text = _message(err)
                if err.code < 500 and err.code != 429:  # the request itself is wrong: retrying cannot help
                    raise ServerError(f"the server at {self.base} refused {what} (HTTP {err.code}): {text}") from None
                last = f"HTTP {err.code}: {text}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
                last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        raise self._fail(what, f"{last} (after {tries} attempt{'s' if tries > 1 else ''})")

    def ready(self, path: str = "/v1/models") -> bool:
        """Whether the server answers `path` now (one attempt, a short timeout)."""
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base + path, headers=self.headers), timeout=5) as resp:
                return 200 <= resp.status < 300
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return False


def _message(err: urllib.error.HTTPError) -> str:
    """The server's own error message (OpenAI's {"error": {"message"}} or FastAPI's {"detail"})."""
    try:
        raw = err.read().decode("utf-8", "replace")
    except OSError:
        return str(err.reason)
    try:
        blob = json.loads(raw)
        if isinstance(blob, dict):
            inner = blob.get("error", blob)
            msg = inner.get("message") if isinstance(inner, dict) else inner
            return str(msg or blob.get("detail") or raw)[:500]
    except ValueError:
        pass
    return raw[:500] or str(err.reason)

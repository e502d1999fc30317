"""A reference that a server serves (`model.source: served`): a large model elsewhere, or one qval starts vLLM on.

qval holds no weights of it. What the gates read besides its answers comes from a local folder (model.tokenizer,
else the folder qval serves): the tokenizer, config.json (its positions and vocabulary) and the generation config
(its EOS). Its answers are top-K distributions (`Compact` blocks without a full row): top-1, NLL, perplexity and
Δp are exact, KLD an estimate with a strict lower bound (qval/metrics/topk.py), whichever side is served. Its
identity in the stage keys and its store (its generations) is the folder's content, the serving options and what the
server says it is (`server_identity`: a launched server's package and folder, or a running one's version, listing
and its answers to a fixed probe prompt). Nothing here calibrates, so a served reference gates served candidates
only (the config refuses the rest), and the reference snapshot is not used: the server answers every run live,
while its greedy generations are stored as any reference's are (`LiveReference`, qval/snapshot/engine.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import ModelError
from ..io import hash_json
from .served import ServedEngine
from .served_setup import connect, server_identity

SERVED_NAME = "qval-reference"  # the model's name in the API of a server qval starts for the reference


def fingerprint(cfg: Any) -> str:
    """The served reference's identity: its local folder and serving options (`model_location.locate`) and the server's."""
    from .. import model_location

    local = model_location.locate(cfg.model)[3]
    return hash_json({"local": local, "server": server_identity(cfg.model.served, cfg.resolve, "model.served")})


def _vocab(config: Any, folder: Path) -> int:
    n = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config, "vocab_size", None)
    if not isinstance(n, int) or n <= 0:
        raise ModelError(f"{folder}/config.json gives no vocab_size; a served reference's folder needs its model's own config.json.")
    return n


def _eos(folder: Path, tokenizer: Any) -> list[int]:
    """EOS ids from generation_config.json (what a server stops on), else the tokenizer's."""
    eos: Any = None
    try:
        eos = json.loads((folder / "generation_config.json").read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        pass
    if eos is None:
        eos = tokenizer.eos_token_id
    return [int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)]


@dataclass
class ServedReference:
    """The served reference as the session holds it: its engine, tokenizer and the report's facts."""

    engine: ServedEngine
    tokenizer: Any
    name: str
    fingerprint: str
    notes: list[str] = field(default_factory=list)
    model: None = None  # no weights here: what would need them is refused by the config

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def vocab(self) -> int:
        return self.engine.vocab

    @property
    def eos(self) -> list[int]:
        return self.engine.eos

    def describe(self) -> dict[str, Any]:
        d = self.engine.describe()
        launch = d.get("launch") or {}
        return {"name": self.name, "fingerprint": self.fingerprint, "device": self.device, "served": True,
                "compute_dtype": f"the server's {launch.get('dtype') or 'dtype'}", "engine": d,
                "notes": [*self.notes, *d.get("notes", [])]}

    def close(self) -> None:
        self.engine.close()


def load_served_reference(cfg: Any, run_dir: Path, log: Callable[[str], Any], fingerprint: str) -> ServedReference:
    """Reach (or start) the reference's server and check it serves the model the local folder describes;
    `fingerprint`: its identity (`fingerprint(cfg)`, which the run computed for its stage keys)."""
    from transformers import AutoConfig

    from .. import model_location, models

    folder_s, _, name, _ = model_location.locate(cfg.model)
    folder = Path(folder_s)
    tokenizer = models.load_tokenizer(cfg.model)
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the served reference's configuration from {folder}: {err}.") from None
    options = cfg.model.served
    launch = options.launch
    served_folder = Path(launch.model).expanduser() if launch is not None else None  # model.tokenizer may name another
    facts = {"launch": {"model": "path", "folder": str(served_folder), "dtype": launch.dtype}} if launch is not None else {}
    notes = ["the reference is served: qval holds no weights of it; its answers are its server's top "
             f"{options.top_k} log-probabilities per position, so no reference snapshot is kept (its greedy "
             "generations are cached as any reference's)",
             "with the candidate served too, both sides are known by their top K: the plain KLD estimate runs below "
             "the exact KLD there, the more so the more damaged the candidate, so the gated figure adds the estimate's "
             "gains from the top K/4 to the top K/2 and to the top K (above the exact mean and p99 on every candidate "
             "measured, not a bound: benchmarks/RESULTS.md §13); the lower bound beside it is strict, and top-1, NLL, "
             "perplexity and Δp are exact"]
    engine = connect(options, served_folder, tokenizer=tokenizer, vocab=_vocab(config, folder),
                     eos=_eos(folder, tokenizer), resolve=cfg.resolve, log_path=run_dir / "served_reference" / "server.log",
                     log=log, name=SERVED_NAME, where="model.served", facts=facts, config=config)
    return ServedReference(engine, tokenizer, name, fingerprint, notes=notes)

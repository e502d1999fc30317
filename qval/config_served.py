"""The config's rules for a served reference (`model.source: served`), beside the sections they read.

A served reference's weights stay on its server: what would need them in this process (calibration, a candidate
built from them, the sequential snapshot, the fallback's recalibration) is a config error that says what to do.
"""

from __future__ import annotations

from typing import Any

from .backends import MODEL_SOURCES


def served_location(model: Any) -> None:
    """`model.source: served` (`model`: the model section): a served: section, nothing else that locates a model, a
    launch on a model folder, and a tokenizer folder where the server is reached by URL."""
    if model.source != "served":
        raise ValueError(f"served: is set but source is {model.source!r}; set source: served to gate against a served "
                         "reference, or remove served:")
    if model.served is None:
        raise ValueError("source is 'served' but no served: section is given; give served: {url: http://host:port} "
                         "(a running server) or served: {launch: {model: FOLDER}} (qval starts vLLM on it)")
    if given := sorted(k for k in ("path", "hub", "gguf") if getattr(model, k)):
        raise ValueError(f"source is 'served' but {', '.join(given)} is set; a served reference is the server's model: "
                         "remove it (the tokenizer's folder is model.tokenizer)")
    launch = model.served.launch
    if launch is not None and launch.model in MODEL_SOURCES:
        raise ValueError(f"served.launch.model: {launch.model!r} names a model qval holds; a served reference is served "
                         "from a model folder: give its path")
    if launch is None and not model.tokenizer:
        raise ValueError("a reference served by URL needs tokenizer: a local folder with the model's config.json and "
                         "tokenizer files (no weights): qval tokenizes the data and checks the server's tokenizer against it")


def served_reference_fits(cfg: Any) -> None:
    """A served reference has no weights in this process: what of the whole config `cfg` would need them is an error."""
    why = "the reference is served (model.source: served), so qval holds no weights of it"
    if cfg.engine.backend != "served":
        raise ValueError(f"{why}, and engine.backend {cfg.engine.backend} builds its candidate from the reference's "
                         "weights or compares it with the reference model; gate a served candidate (engine.backend: "
                         "served with url, or launch with a model folder)")
    launch = cfg.engine.options.get("launch")
    if isinstance(launch, dict) and launch.get("model", "reference") in MODEL_SOURCES:
        raise ValueError(f"{why}: engine.options.launch.model {launch.get('model', 'reference')!r} cannot be written "
                         "from it; give the candidate's model folder")
    if cfg.snapshot.sequential:
        raise ValueError(f"{why}: snapshot.sequential (one model in memory at a time) has nothing to do; remove it")
    if cfg.fallback.mode != "off":
        raise ValueError(f"{why}: fallback.mode auto recalibrates the candidate from those weights; set it to off")

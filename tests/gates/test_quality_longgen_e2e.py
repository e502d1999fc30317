"""Gates 2 and 3 end to end on the real default model (SmolLM2-135M-Instruct), through the CLI
as a user runs them: the identity candidate passes with exactly zero drift and reuses the
reference's cached generations; a candidate known only by its top K passes the same exact limits
through every gate; a planted KV-cache fault is caught by gate 3; sliding-window perplexity agrees
with transformers' own loss; one run takes the full 2048-token path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from qval.cli import app

from ..conftest import ROOT, small_config, write_config
from ..engines.topk_engine import TopKEngine

runner = CliRunner()
#: these tests are about gates 2 and 3; per-layer diagnostics have their own tests
NO_DIAGNOSTICS = {"enabled": False, "sensitivity": "never"}


def gate(tmp_path: Path, data: dict) -> tuple[int, dict, str]:
    """`qval gate` on `data`, its config and its runs in `tmp_path` (the runs in `tmp_path/reports`)."""
    path = write_config(tmp_path, data, f"{data['name']}.yaml")
    result = runner.invoke(app, ["gate", "--config", str(path), "--out", str(tmp_path / "reports"), "-q"])
    out = result.output + result.stderr
    report_file = tmp_path / "reports" / data["name"] / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return result.exit_code, report, out


def small_bleu_set(tmp_path: Path, per_lang: int = 3) -> str:
    """A few prompts of the shipped BLEU set, both languages, to keep CI short."""
    rows = [json.loads(x) for x in (ROOT / "calib_data/bleu_eval.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    keep = [r for r in rows if r["lang"] == "en"][:per_lang] + [r for r in rows if r["lang"] == "zh"][:per_lang]
    path = tmp_path / "bleu_small.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep), encoding="utf-8")
    return str(path)


def exact_gates(tmp_path: Path, name: str) -> dict:
    """The identity candidate under limits that only an exact copy meets."""
    return small_config(name, fmt="none", gates={
        "agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 2048, "ctx": 512, "min_top1": 1.0},
        "quality": {"bleu_dataset": small_bleu_set(tmp_path), "bleu_max_new_tokens": 24, "bootstrap": 200,
                    "max_ppl_ratio": 1.0, "max_bleu_drop": 0.0, "max_chrf_drop": {"sized": True}},
        "longgen": {"new_tokens": 96, "window": 32, "edge": 32, "max_prompts": 2, "batch_size": 2, "min_late_top1": 1.0,
                    "max_late_kld": 0.0, "max_late_drift": 0.0, "max_seq_rep4_excess": 0.0, "max_judge_nll_excess": 0.0},
        "depth": {"dataset": str(ROOT / "calib_data/longctx_docs.jsonl"), "ctx": 768, "tokens": 768, "piece": 256,
                  "min_top1": 1.0, "max_mean_kld": 0.0, "max_p99_kld": 0.0},
        "retrieval": {"haystack": str(ROOT / "calib_data/longctx_docs.jsonl"), "lengths": [160], "depths": [0.0, 1.0], "trials": 1,
                      "margin": 0.6, "margin_overall": 0.6, "max_answer_kld": 0.0},
    }, diagnostics=NO_DIAGNOSTICS)


@pytest.fixture(scope="module")
def exact(tmp_path_factory) -> Path:
    """The exact-limit candidates' folder (their BLEU set, their runs): the reference's work for those gates is
    done by the first of them and read back by the later ones."""
    return tmp_path_factory.mktemp("exact_gates")


def test_identity_passes_all_three_gates_exactly_and_reuses_the_reference(exact, patch_reference):
    tmp_path = exact
    code, report, out = gate(tmp_path, exact_gates(tmp_path, "identity-a"))
    assert code == 0, out
    assert {c["gate"] for c in report["verdict"]["checks"]} == {"agreement", "quality", "longgen", "depth", "retrieval"}
    assert all(c["outcome"] == "pass" for c in report["verdict"]["checks"]), out
    dp, rt = report["gates"]["depth"], report["gates"]["retrieval"]
    assert dp["details"]["divergence"]["first_difference"] is None and dp["measurements"]["mean_kld@512-767"]["value"] == 0.0
    assert rt["measurements"]["drop"]["value"] == 0.0 and not rt["details"]["flipped"] and rt["details"]["trials"] == 2
    q, lg = report["gates"]["quality"], report["gates"]["longgen"]
    assert q["measurements"]["ppl_ratio"]["value"] == 1.0 and q["measurements"]["ppl_ratio"]["stderr"] == 0.0
    assert q["details"]["ppl"]["positions"] == 4 * 255  # gate 1's positions: 4 chunks × (512/2 − 1)
    for lang in ("en", "zh"):
        g = q["details"]["bleu"]["groups"][lang]
        assert g["bleu_cand_vs_ref"] == pytest.approx(100.0) and g["bleu_drop"]["value"] == 0.0
        assert ("tok:zh" if lang == "zh" else "tok:13a") in g["signatures"]["bleu"]
    assert q["details"]["bleu"]["rendering"] == "chat_template"
    m = {k: v["value"] for k, v in lg["measurements"].items()}
    assert m["late_drift"] == m["late_kld"] == m["early_kld"] == 0.0 and m["late_top1"] == 1.0
    assert m["seq_rep4_excess"] == m["judge_nll_excess"] == m["loops_excess"] == 0.0
    assert [(w["start"], w["end"]) for w in lg["details"]["windows"]] == [(0, 32), (32, 64), (64, 96)]
    assert all(w["kld"] == 0.0 and w["top1"] == 1.0 for w in lg["details"]["windows"])
    assert all(p["ref_tokens"] == 96 and p["first_divergence"] is None for p in lg["details"]["per_prompt"])
    assert not q["details"]["bleu"]["reference_generation"]["cached"]
    assert not lg["details"]["reference_generation"]["cached"]
    md = (tmp_path / "reports/identity-a/report.md").read_text()
    assert "Gate 2 — perplexity and BLEU/chrF" in md and "Gate 3 — long-generation stability" in md
    assert "Gate 1 at depth — long context" in md and "The candidate reproduces the reference at every depth." in md
    assert "Retrieval matrix — context length × needle depth" in md
    html = (tmp_path / "reports/identity-a/report.html").read_text()
    assert 'alt="reference accuracy"' in html and 'alt="accuracy difference"' in html and 'alt="KLD by depth"' in html

    # a second candidate under the same report folder: the reference does not generate again
    code, report_b, out = gate(tmp_path, exact_gates(tmp_path, "identity-b"))
    assert code == 0, out
    assert report_b["gates"]["quality"]["details"]["bleu"]["reference_generation"]["cached"]
    assert report_b["gates"]["longgen"]["details"]["reference_generation"]["cached"]
    assert report_b["gates"]["longgen"]["details"]["reference_generation"]["path"] == lg["details"]["reference_generation"]["path"]
    # one store: the generations are entries of the reference's snapshot folder, nothing beside it
    ref_store = tmp_path / "reports/.reference"
    assert [p.name for p in ref_store.iterdir()] == ["snapshot"]
    paths = {Path(g["reference_generation"]["path"]) for g in (q["details"]["bleu"], lg["details"])}
    assert len(paths) == 2 and all(p.is_file() and ref_store / "snapshot" in p.parents for p in paths)


@pytest.mark.slow
def test_a_top_k_candidate_passes_the_identity_limits_through_every_gate(exact, patch_reference, monkeypatch):
    """Every gate with a candidate known only by its top K (what a served engine answers): the reference
    itself answered as a server answers passes the identity's exact limits — top-1 1, KLD 0, PPL ratio 1,
    no flip — through gate 1, depth, gates 2 and 3, retrieval and the task suites, with the snapshot's
    compact reference on the other side (the identity's, read back where the test above filled it)."""
    from qval.engines import BUILDERS

    tmp_path = exact
    real = BUILDERS.get("fakequant")
    monkeypatch.setitem(BUILDERS._items, "fakequant", lambda ctx: TopKEngine(real(ctx), 16))
    data = exact_gates(tmp_path, "topk-identity")
    data["gates"]["tasks"] = {"suites": [{"builtin": "choice", "size": 12, "margin": 0.2, "max_flip_rate": 0.3},
                                         {"builtin": "cloze", "size": 12, "margin": 0.2, "max_flip_rate": 0.3}]}
    code, report, out = gate(tmp_path, data)
    assert code == 0, out
    assert {c["gate"] for c in report["verdict"]["checks"]} == {"agreement", "quality", "longgen", "depth", "retrieval", "tasks"}
    assert report["candidate"]["engine"]["backend"] == "topk"
    a = report["gates"]["agreement"]
    assert a["measurements"]["top1"]["value"] == 1.0 and a["measurements"]["mean_kld"]["value"] == 0.0
    assert a["details"]["kld_topk"]["mean_kld_lower"] == 0.0 and 0 < a["details"]["kld_topk"]["mean_unseen_mass"] < 1
    assert a["details"]["kld_topk"]["mean_kld_estimate"] == 0.0  # the plain estimate beside the gated figure
    assert report["gates"]["quality"]["measurements"]["ppl_ratio"]["value"] == 1.0
    md = (tmp_path / "reports/topk-identity/report.md").read_text()
    assert "known by its top K log-probabilities" in md and "strict lower bound" in md and "the plain estimate" in md


def test_without_a_snapshot_the_generations_are_still_stored_once(tmp_path, patch_reference):
    """`snapshot.enabled: false`: the gates read the reference's own logits (no snapshot in the details), and
    its generations are entries of the reference's store as with a snapshot (qval/snapshot/engine.py's
    LiveReference): a second candidate reads them back; no logits entry is written."""
    def config(name: str) -> dict:
        data = small_config(name, fmt="none", gates={
            "agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 512, "ctx": 256, "min_top1": 1.0},
            "longgen": {"new_tokens": 48, "window": 16, "edge": 16, "max_prompts": 2, "batch_size": 2, "min_late_top1": 1.0,
                        "max_late_kld": 0.0, "max_late_drift": 0.0, "max_seq_rep4_excess": 0.0, "max_judge_nll_excess": 0.0}},
            diagnostics=NO_DIAGNOSTICS)
        return {**data, "snapshot": {"enabled": False}}

    code, a, out = gate(tmp_path, config("nosnap-a"))
    assert code == 0, out
    code, b, out = gate(tmp_path, config("nosnap-b"))
    assert code == 0, out
    first, again = (r["gates"]["longgen"]["details"]["reference_generation"] for r in (a, b))
    assert not first["cached"] and again["cached"] and again["path"] == first["path"] and Path(first["path"]).is_file()
    assert all("snapshot" not in r["gates"][g]["details"] for r in (a, b) for g in ("agreement", "longgen"))
    assert a["model"].get("snapshot") is None
    entries = [p for p in (tmp_path / "reports/.reference/snapshot").rglob("calls/*/*") if p.is_file()]
    assert [p.suffix for p in entries] == [".json"]  # the one generation, no logits


def damage_kv(factor: float):
    """A fakequant builder whose K/V quantizer scales are `factor` times too small: keys and
    values clip hard, the way a KV scale calibrated on the wrong data or mis-exported would."""
    from qval.engines import BUILDERS
    from qval.quantize.modelopt_adapter import iter_quantizers

    real = BUILDERS.get("fakequant")

    def build(ctx):
        engine = real(ctx)
        hit = 0
        for name, q in iter_quantizers(engine.model):
            if name.endswith(("k_bmm_quantizer", "v_bmm_quantizer")) and q.is_enabled:
                q.amax = q.amax / factor
                hit += 1
        assert hit == 2 * 30, hit  # k and v in each of the 30 decoder layers
        return engine

    return build


@pytest.mark.slow
def test_kv_cache_fault_is_caught_by_gate3(tmp_path, patch_reference, monkeypatch, capsys):
    from qval.engines import BUILDERS

    longgen = {"new_tokens": 128, "window": 32, "edge": 32, "max_prompts": 2, "batch_size": 2,
               "min_late_top1": 0.6, "max_late_kld": 0.5, "max_seq_rep4_excess": 0.5}
    figures = {}
    for name, builder in (("kv-fp8", None), ("kv-fp8-amax-div50", damage_kv(50.0))):
        if builder is not None:
            monkeypatch.setitem(BUILDERS._items, "fakequant", builder)
        data = small_config(name, fmt="fp8", kv="fp8", gates={"longgen": longgen}, diagnostics=NO_DIAGNOSTICS)
        data["gates"]["agreement"]["tokens"] = 2048
        code, report, out = gate(tmp_path, data)
        assert code in (0, 1), out
        figures[name] = report
    healthy, broken = figures["kv-fp8"], figures["kv-fp8-amax-div50"]
    with capsys.disabled():
        for name, r in figures.items():
            ag, lg = r["gates"]["agreement"]["measurements"], r["gates"]["longgen"]
            print(f"\n{name}: gate 1 top-1 {ag['top1']['value']:.4f}, mean KLD {ag['mean_kld']['value']:.4f}, "
                  f"p99 KLD {ag['p99_kld']['value']:.4f}")
            print(f"{name}: gate 3 early KLD {lg['measurements']['early_kld']['value']:.4f} → late "
                  f"{lg['measurements']['late_kld']['value']:.4f} (drift {lg['measurements']['late_drift']['value']:+.4f}), "
                  f"late top-1 {lg['measurements']['late_top1']['value']:.4f}")
            for w in lg["details"]["windows"]:
                print(f"  window {w['start']:>4}–{w['end']:<4} top-1 {w['top1']:.3f}  KLD {w['kld']:.4f}  "
                      f"seq-rep-4 ref/cand {w['ref_seq_rep4']:.3f}/{w['cand_seq_rep4']:.3f}")
    failed = {c["metric"] for c in broken["verdict"]["checks"] if c["gate"] == "longgen" and c["outcome"] == "fail"}
    assert {"late_top1", "late_kld"} <= failed, broken["verdict"]["checks"]
    assert all(c["outcome"] == "pass" for c in healthy["verdict"]["checks"] if c["gate"] == "longgen"), healthy["verdict"]["checks"]
    hb, bb = healthy["gates"]["longgen"]["measurements"], broken["gates"]["longgen"]["measurements"]
    assert bb["late_kld"]["value"] > 10 * hb["late_kld"]["value"]


def test_sliding_window_perplexity_agrees_with_transformers_loss(tmp_path, default_model):
    """The HF strided-perplexity loop, written as the transformers guide writes it (labels with
    -100, loss × scored tokens), against the gate's own sliding windows."""
    from qval.config import parse_config
    from qval.data import load_dataset, token_stream
    from qval.engines.hf import HFEngine
    from qval.gates.base import GateContext
    from qval.gates.quality.run import sliding_nll

    data = str(ROOT / "calib_data/heldout_eval.jsonl")
    cfg = parse_config({"name": "s", "quant": {"format": "none"},
                        "gates": {"agreement": {"dataset": data, "tokens": 700, "ctx": 256, "min_top1": 0.5},
                                  "quality": {"windowing": "sliding", "stride": 96, "max_ppl_ratio": 1.1}}}, "s.yaml")
    engine = HFEngine(default_model.model, default_model.tokenizer)
    ctx = GateContext(config=cfg, reference=engine, candidate=engine, tokenizer=default_model.tokenizer, folder=tmp_path)
    nll_ref, nll_cand, info = sliding_nll(ctx)
    tok = default_model.tokenizer
    ids = torch.tensor([token_stream(load_dataset(data).texts(), tok, tok.eos_token_id)[:700]])
    total, count, prev_end = 0.0, 0, 0
    with torch.no_grad():
        for begin in range(0, ids.shape[1], 96):
            end = min(begin + 256, ids.shape[1])
            trg_len = end - prev_end
            x = ids[:, begin:end]
            labels = x.clone()
            labels[:, :-trg_len] = -100
            loss = default_model.model(x, labels=labels).loss
            scored = int((labels[:, 1:] != -100).sum())
            total += float(loss) * scored
            count += scored
            prev_end = end
            if end == ids.shape[1]:
                break
    assert nll_ref.size == count == 699 and info["windows"] == 6
    assert float(nll_ref.mean()) == pytest.approx(total / count, rel=1e-5)
    assert (nll_ref == nll_cand).all()


@pytest.mark.slow
def test_full_2048_token_path_on_the_real_model(tmp_path, patch_reference):
    """The shipped defaults of gate 3 (2048 new tokens, windows of 256, early/late 512), one prompt."""
    data = small_config("identity-2048", fmt="none", gates={
        "agreement": {"enabled": False},
        "longgen": {"max_prompts": 1, "batch_size": 1, "max_late_drift": 0.0, "min_late_top1": 1.0},
    }, diagnostics=NO_DIAGNOSTICS)
    code, report, out = gate(tmp_path, data)
    assert code == 0, out
    lg = report["gates"]["longgen"]
    d, m = lg["details"], lg["measurements"]
    assert (d["new_tokens"], d["window"], d["edge"], d["loop_span"]) == (2048, 256, 512, 256)
    assert [(w["start"], w["end"]) for w in d["windows"]] == [(k * 256, (k + 1) * 256) for k in range(8)]
    assert d["per_prompt"][0]["ref_tokens"] == 2048 and d["per_prompt"][0]["cand_tokens"] == 2048
    assert d["late_positions"] == 512 and m["late_drift"]["value"] == 0.0 and m["late_top1"]["value"] == 1.0
    assert all(w["ref_seq_rep4"] is not None and w["ref_nll"] is not None for w in d["windows"])


def test_fail_fast_skips_the_later_gates_and_still_rejects(tmp_path, patch_reference):
    """`--fail-fast`: gate 1 rejects (an FP8 candidate cannot reach top-1 1.0), so gates 2 and 3
    are not run: they appear as skipped, their checks fail, and no stage folder is made for them."""
    data = small_config("ff", fmt="fp8", gates={
        "agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 1024, "ctx": 512, "min_top1": 1.0},
        "quality": {"bleu_dataset": small_bleu_set(tmp_path, 1), "bleu_max_new_tokens": 8, "max_ppl_ratio": 2.0},
        "longgen": {"new_tokens": 64, "window": 32, "edge": 32, "max_prompts": 1, "max_late_drift": 1.0},
    }, diagnostics=NO_DIAGNOSTICS)
    data["calibration"].update(samples=2, seq_len=64, batch_size=2)
    path = write_config(tmp_path, data, "ff.yaml")
    result = runner.invoke(app, ["gate", "--config", str(path), "--out", str(tmp_path / "reports"), "-q", "--fail-fast"])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "reports" / "ff" / "report.json").read_text())
    assert report["gates"]["agreement"]["status"] == "ok"
    for name in ("quality", "longgen"):
        assert report["gates"][name]["status"] == "skipped" and "--fail-fast" in report["gates"][name]["error"]
        assert not (tmp_path / "reports" / "ff" / f"gate_{name}").exists()
    failed = {c["gate"] for c in report["verdict"]["checks"] if c["outcome"] == "fail"}
    assert failed == {"agreement", "quality", "longgen"}
    assert "skipped" in (tmp_path / "reports" / "ff" / "report.md").read_text()

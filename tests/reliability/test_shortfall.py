"""No silent shortfall: a gate or stage that gets less data than configured says so beside the
verdict, and more than `max_shortfall` of a budget missing (default half) is an error, exit 2,
never an approval. Checked by hand on the rule, on gate 3's prompt count, and through the CLI
with the toy reference (tests/diagnostics/toy.py behind a byte tokenizer: one token per byte)."""

from __future__ import annotations

import json

import pytest

from qval import pipeline, preflight
from qval.config import parse_config
from qval.errors import DataError
from qval.gates.agreement.run import chunks_for
from qval.gates.longgen.run import records_for
from qval.shortfall import shortfall
from tests.conftest import write_config

from .helpers import ByteTokenizer, cli, clean_error, toy_reference


def test_the_rule_by_hand():
    assert shortfall("k", 100, 100, "tokens", 0.5) is None and shortfall("k", 100, 120, "tokens", 0.0) is None
    assert shortfall("k", 100, 50, "tokens", 0.5) == "k: asked for 100 tokens, the data holds 50 (50% short)"  # at the limit
    with pytest.raises(DataError, match=r"shortfall beyond max_shortfall = 0.5: k: asked for 100 tokens, the data holds 49 \(51% short\)"):
        shortfall("k", 100, 49, "tokens", 0.5)
    with pytest.raises(DataError, match="raise max_shortfall"):
        shortfall("k", 100, 99, "tokens", 0.0)  # max_shortfall 0: every budget in full


def test_max_shortfall_is_a_fraction():
    base = {"name": "x", "quant": {"format": "fp8"}, "gates": {"agreement": {"min_top1": 0.5}}}
    assert parse_config(base).max_shortfall == 0.5
    for bad in (-0.1, 1.5):
        with pytest.raises(Exception, match="max_shortfall"):
            parse_config({**base, "max_shortfall": bad})


def _longgen(tmp_path, prompts: int, max_prompts: int, **top) -> object:
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(prompts)), encoding="utf-8")
    return parse_config({"name": "x", "quant": {"format": "fp8"}, **top,
                         "gates": {"agreement": {"enabled": False}, "longgen": {"enabled": True, "prompts": str(f), "max_prompts": max_prompts, "new_tokens": 64,
                                               "window": 16, "edge": 16, "max_late_kld": 0.1}}})


def test_longgen_fewer_prompts_than_max_prompts(tmp_path):
    records, note = records_for(_longgen(tmp_path, 3, 4))
    assert len(records) == 3 and note == "gates.longgen.max_prompts: asked for 4 prompts, the data holds 3 (25% short)"
    assert records_for(_longgen(tmp_path, 8, 4))[1] is None  # more prompts than asked: the first 4, no note
    with pytest.raises(DataError, match="asked for 8 prompts, the data holds 3"):
        records_for(_longgen(tmp_path, 3, 8))
    assert records_for(_longgen(tmp_path, 3, 8, max_shortfall=0.9))[1].endswith("(62% short)")


def toy_config(tmp_path, text_bytes: int, **top) -> dict:
    """Gate 1 only, 1024 tokens in chunks of 128, on `text_bytes` bytes (+1 EOS) of held-out text."""
    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps({"text": "x" * text_bytes}) + "\n", encoding="utf-8")
    return {"name": "toy", "quant": {"format": "none"}, "diagnostics": {"enabled": False}, **top,
            "gates": {"agreement": {"dataset": str(data), "tokens": 1024, "ctx": 128, "min_top1": 0.5, "batch_size": 2}}}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr("qval.run_reference.load_model", lambda cfg: toy_reference())
    monkeypatch.setattr(preflight, "reference_tokenizer", lambda cfg: ByteTokenizer())


def test_the_console_names_a_shortfall_beside_the_verdict(tmp_path, toy):
    path = write_config(tmp_path, toy_config(tmp_path, 700))  # 701 tokens: 5 chunks = 640 of 1024 (38% short)
    note = "gates.agreement.tokens: asked for 1024 tokens in whole chunks of 128, the data holds 640 (38% short)"
    for _ in range(2):  # computed, then reused from the stage: the note is there both times
        code, out = cli("gate", "--config", path, "--out", tmp_path / "r", "-q")
        assert code == 0, out
        lines = out.splitlines()
        verdict = next(i for i, line in enumerate(lines) if line.startswith("toy: APPROVE"))
        assert lines[verdict + 1] == f"  shortfall: gate agreement: {note}", out
    assert f"qval: warning: shortfall: {note}" in out  # the preflight says so before the run, too
    assert f"Note: {note}." in (tmp_path / "r" / "toy" / "report.md").read_text(encoding="utf-8")


def test_a_shortfall_beyond_max_shortfall_is_an_error_not_an_approval(tmp_path, toy):
    path = write_config(tmp_path, toy_config(tmp_path, 700, max_shortfall=0.25))
    out = clean_error("gate", "--config", path, "--out", tmp_path / "r", "-q")
    assert "shortfall beyond max_shortfall = 0.25: gates.agreement.tokens: asked for 1024 tokens" in out
    assert "APPROVE" not in out and not (tmp_path / "r" / "toy" / "gate_agreement").exists()  # refused before running
    path = write_config(tmp_path, toy_config(tmp_path, 200))  # 201 tokens: 1 chunk = 128 of 1024 (88% short)
    out = clean_error("gate", "--config", path, "--out", tmp_path / "r", "-q")
    assert "shortfall beyond max_shortfall = 0.5" in out and "(88% short)" in out


def test_the_gate_itself_refuses_a_shortfall_the_preflight_did_not_see(tmp_path, toy, monkeypatch):
    """Defence in depth: with the preflight out of the way, gate 1 still raises instead of scoring
    an eighth of its budget and approving."""
    monkeypatch.setattr(preflight, "preflight", lambda cfg, **kw: [])
    path = write_config(tmp_path, toy_config(tmp_path, 200))
    out = clean_error("gate", "--config", path, "--out", tmp_path / "r", "-q")
    assert "shortfall beyond max_shortfall = 0.5: gates.agreement.tokens" in out and "APPROVE" not in out


def test_chunks_for_counts_whole_chunks(tmp_path):
    cfg = parse_config(toy_config(tmp_path, 1023))  # 1024 tokens with the EOS: 8 whole chunks, no shortfall
    chunks, info = chunks_for(cfg, ByteTokenizer())
    assert len(chunks) == 8 and "shortfall" not in info

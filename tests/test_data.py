"""The shipped data sets: well-formed, big enough for the shipped checks, and the held-out
sets never overlap calibration (a model calibrated on its test text would flatter itself)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from qval.data import chunk, load_dataset, token_stream
from qval.errors import DataError

from .conftest import ROOT

DATA = ROOT / "calib_data"
HELD_OUT = ["heldout_eval.jsonl", "bleu_eval.jsonl", "longgen_prompts.jsonl", "longctx_docs.jsonl"]
SPAN = 40  # characters: longer than any stock phrase, shorter than any copied sentence


def texts(name: str) -> list[str]:
    out = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        out.extend(str(r[k]) for k in ("text", "prompt", "reference") if k in r)
    return out


#: import/include lines are stock boilerplate that two honest code samples may share
BOILERPLATE = re.compile(r"^\s*(#include|import |from \S+ import |using |package ).*$", re.MULTILINE)


def spans(text: str) -> set[str]:
    flat = re.sub(r"\s+", " ", BOILERPLATE.sub("", text)).strip().lower()
    return {flat[i : i + SPAN] for i in range(0, max(1, len(flat) - SPAN + 1))}


def test_held_out_sets_never_overlap_calibration():
    calib: set[str] = set()
    for t in texts("general_mix.jsonl"):
        calib |= spans(t)
    for name in HELD_OUT:
        for i, t in enumerate(texts(name)):
            shared = spans(t) & calib
            assert not shared, f"{name} item {i} shares text with the calibration set: {sorted(shared)[:2]}"


def test_overlap_check_would_catch_a_copied_sentence():
    calib = spans("Alpha beta gamma. The quick harbour pilot counted forty-two buoys before dawn, then slept.")
    assert spans("Elsewhere: the quick harbour pilot counted forty-two buoys before dawn, it said.") & calib


@pytest.mark.parametrize("name", ["general_mix.jsonl", *HELD_OUT])
def test_each_set_has_a_readme_entry_and_both_languages(name):
    records = [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]
    assert len({r["id"] for r in records}) == len(records)
    assert {r["lang"] for r in records} == {"en", "zh"}
    assert name in (DATA / "README.md").read_text(encoding="utf-8")


def test_sets_are_big_enough_for_the_shipped_checks(default_tokenizer):
    tok = default_tokenizer
    calib = token_stream(load_dataset(str(DATA / "general_mix.jsonl")).texts(), tok, tok.eos_token_id)
    held = token_stream(load_dataset(str(DATA / "heldout_eval.jsonl")).texts(), tok, tok.eos_token_id)
    assert len(chunk(calib, 512)) >= 64  # checks/ calibrate on 64 × 512 tokens
    assert len(held) >= 32768  # checks/ score up to 32768 tokens in gate 1
    long = [token_stream([t], tok, tok.eos_token_id) for t in load_dataset(str(DATA / "longctx_docs.jsonl")).texts()]
    assert sum(map(len, long)) >= 32768  # checks/gpu/ score 4 chunks of 8192 at depth
    assert min(map(len, long)) >= 4096  # each document is several thousand tokens long


def test_long_documents_hold_no_needle():
    """The retrieval gate's needles must be the only pass codes in its haystacks."""
    for t in texts("longctx_docs.jsonl"):
        assert "pass code" not in t.lower() and not re.search(r"\d{6}", t)


def test_loader_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        load_dataset(str(bad))
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="no text.*body"):
        load_dataset(str(notext)).texts()


def test_text_and_parquet_loaders(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first doc\nline two\n\nsecond doc\n")
    assert load_dataset(str(tmp_path / "a.txt")).texts() == ["first doc\nline two", "second doc"]
    pq.write_table(pa.table({"text": ["x", "y"]}), tmp_path / "b.parquet")
    assert load_dataset(str(tmp_path / "b.parquet")).texts() == ["x", "y"]


def test_hub_dataset_offline_is_a_clear_error():
    """As a user runs it: the hub switched off before Python starts (the `datasets` library reads the switch once,
    on import; in this process it may have been imported already, and would then try the network)."""
    code = ("from qval.data import load_dataset\nfrom qval.errors import DataError\ntry:\n"
            "    load_dataset('hf:no-such/dataset@test')\nexcept DataError as err:\n    print('DataError:', err)\n")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0 and "DataError:" in out.stdout, out.stdout + out.stderr
    assert "cannot load dataset 'no-such/dataset'" in out.stdout and "Traceback" not in out.stdout + out.stderr

"""The GPU served runs kept in benchmarks/results (vLLM 0.26.0 on an H100 and an H200; RESULTS.md §13, "On a GPU"):
each stored report is re-decided from the config it carries, as `qval gate` decided it, and the tables RESULTS cites
are rebuilt from those files by `benchmarks/served_gpu.py markdown`.

A judge or limit rule that changes what a stored GPU run decided fails here: its figure in RESULTS would no longer say
what qval decides. No GPU is needed: the reports are data.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from qval.config import parse_config
from qval.judges import verdict
from qval.verdict import GateResult

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
REPORTS = sorted(RESULTS.glob("h*_served_gpu/*.report.json.gz"))


def test_the_gpu_runs_are_stored():
    assert {p.parent.name for p in REPORTS} == {"h100_served_gpu", "h200_served_gpu"}
    assert len(REPORTS) >= 16


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.report.json.gz')}")
def test_a_stored_gpu_run_is_re_decided_as_it_was(path: Path):
    report = json.loads(gzip.decompress(path.read_bytes()))
    assert "H100" in report["environment"]["device"]["cuda"] or "H200" in report["environment"]["device"]["cuda"]
    cfg = parse_config(report["config"], str(path))
    results = {k: GateResult.from_dict(d) for k, d in report["gates"].items()}
    assert verdict(cfg, results).to_dict() == report["verdict"]


def test_the_tables_are_rebuilt_from_the_stored_files():
    from benchmarks import served_gpu as script

    h100 = script.markdown(RESULTS / "h100_served_gpu")
    h200 = script.markdown(RESULTS / "h200_served_gpu")
    rows = script.stored(RESULTS / "h200_served_gpu")
    # every run of one export side by side, the batch-invariant pair among them
    line = next(x for x in h200.splitlines() if x.startswith("| agreement/mean_kld |"))
    for name in ("served_vllm_fp8_fresh2", "served_same_run1", "served_batchinv_run1", "served_kv_div1000"):
        assert f"{rows[name]['checks']['agreement/mean_kld']['value']:.4g}" in line
    assert "**A served reference**" in h200 and "**KV cache FP8**" in h100
    speed = script.speed_markdown(RESULTS / "h200_speed8b")
    stages = {p.name: json.loads(p.read_text())["seconds"]
              for p in (RESULTS / "h200_speed8b" / "stages").glob("*.json")}
    assert f"{sum(stages.values()):.1f}" in speed and "cand8b_one" in speed

"""The torch-free judging layer (qval/judges.py, each gate's judge.py): each gate's summaries, limits and the run's
verdict import and run with torch blocked, and re-decide stored runs exactly as `qval gate` decided them.

The stored runs are the served CPU checks' reports in benchmarks/results (real vLLM, this CPU; RESULTS.md
"Served engines"): one APPROVE, one REJECT with failures in five gates, sized and absolute limits,
uninformative checks. Their check files are the shipped ones: a limit changed in a check file without
re-running its report fails here, which is the point (the stored figure no longer says what the check
decides).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qval.config import load_config
from qval.gates import GATES
from qval.judges import JUDGES, verdict
from qval.verdict import GateResult

ROOT = Path(__file__).resolve().parent.parent
STORED = [("benchmarks/results/cpu_served_vllm_cpu_report.json", "checks/served_vllm_cpu.yaml", "APPROVE"),
          ("benchmarks/results/cpu_served_vllm_cpu_kvfp8_report.json", "checks/served_vllm_cpu_kvfp8.yaml", "REJECT")]

REJUDGE = """
import json, sys
sys.modules["torch"] = None  # any import of torch now raises
from qval.config import load_config
from qval.judges import verdict
from qval.verdict import GateResult
out = []
for report, check in json.loads(sys.argv[1]):
    r = json.load(open(report, encoding="utf-8"))
    v = verdict(load_config(check), {k: GateResult.from_dict(d) for k, d in r["gates"].items()}).to_dict()
    out.append({"report": report, "decision": v["decision"], "same": v == r["verdict"]})
print(json.dumps({"runs": out, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


def test_stored_runs_are_re_decided_without_torch():
    pairs = [[report, check] for report, check, _ in STORED]
    p = subprocess.run([sys.executable, "-c", REJUDGE, json.dumps(pairs)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["torch"] == ["torch"]  # only the blocking entry: nothing imported torch's modules
    assert [(r["decision"], r["same"]) for r in got["runs"]] == [(want, True) for _, _, want in STORED]


def test_each_gate_is_registered_with_its_judge_in_the_same_order():
    specs = GATES.ordered()
    assert [j.gate for j in JUDGES] == [s.name for s in specs]
    for j, s in zip(JUDGES, specs):
        assert s.thresholds is j.thresholds and s.enabled is j.enabled, s.name


@pytest.mark.parametrize(("report", "check", "decision"), STORED)
def test_a_stricter_limit_turns_the_stored_verdict(report: str, check: str, decision: str):
    """The comparison above can fail: a gate-1 limit under the stored figure rejects the same results."""
    r = json.loads((ROOT / report).read_text(encoding="utf-8"))
    results = {k: GateResult.from_dict(d) for k, d in r["gates"].items()}
    cfg = load_config(ROOT / check)
    assert verdict(cfg, results).to_dict()["decision"] == decision
    kld = results["agreement"].measurements["mean_kld"].value
    assert kld > 0
    stricter = cfg.model_copy(update={"gates": cfg.gates.model_copy(update={
        "agreement": cfg.gates.agreement.model_copy(update={"max_mean_kld": kld / 2})})})
    v = verdict(stricter, results)
    assert not v.approved and {(c.gate, c.metric) for c in v.failures} >= {("agreement", "mean_kld")}


@pytest.mark.parametrize("name", ["agreement", "depth", "quality", "longgen", "retrieval", "tasks", "export_fidelity"])
def test_the_judges_doctests(name: str):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"qval.gates.{name}.judge"))
    assert result.failed == 0


@pytest.mark.parametrize(("report", "check", "decision"), STORED)
def test_a_check_is_a_typed_key_that_its_stored_name_reads_back_to(report: str, check: str, decision: str):
    """Every threshold a judge makes carries its key (gate, metric, bucket); report.json's "metric" is the key's
    name, read back to the same key (`CheckKey.parse`, for stored reports and the measured data), and the
    table row found from the key is the one the name's longest prefix named before keys were typed."""
    from qval.gate_registry import TABLES
    from qval.judges import thresholds_for
    from qval.verdict import Check, CheckKey, row_of

    def by_prefix(gate: str, metric: str):  # verdict.row_of before issue 52
        table = next((t for t in TABLES if t.gate == gate), None)
        rows = [] if table is None else [m for m in table.metrics if metric == m.key or metric.startswith((m.key + "@", m.key + "_"))]
        return max(rows, key=lambda m: len(m.key)) if rows else None

    r = json.loads((ROOT / report).read_text(encoding="utf-8"))
    results = {k: GateResult.from_dict(d) for k, d in r["gates"].items()}
    ts = thresholds_for(load_config(ROOT / check), results)
    assert {t.key.bucket for t in ts} > {None} and {t.key.joiner for t in ts} == {"@", "_"}  # buckets of both kinds
    for t in ts:
        assert isinstance(t.key, CheckKey) and CheckKey.parse(t.gate, t.metric) == t.key, t.key
        assert row_of(t.key) is by_prefix(t.gate, t.metric), t.key
    stored = r["verdict"]["checks"]
    assert [Check.from_dict(c).to_dict() for c in stored] == stored
    with pytest.raises(TypeError, match="CheckKey"):
        type(ts[0])("agreement", "top1", "min", 0.9, "top-1")  # type: ignore[arg-type]

"""The served engine's main test: a real vLLM server on this CPU, started by qval, gated with every gate.

Needs vLLM's own environment: $QVAL_VLLM_PYTHON (`.ci/run` builds it and sets QVAL_REQUIRE_VLLM=1, which
turns a missing vLLM from a skip into a failure). One output folder for the module: the reference's work
goes into one snapshot, computed once and read by every served candidate. The runs are the shipped check
cut down (`variant`): gate 1 and depth as shipped, gates 2 and 3 at a few prompts each, retrieval at 9 of its
20 needles, gate 4 with two of its three suites (`CUT`: what the first test reads of them is that they ran against the server and
passed); a test that reads one gate runs that gate alone, on the positions it needs. One damaged folder serves both tests that serve a damaged layer.

- the built-in model served as it is: APPROVE, and the exact figures (top-1, NLL, Δp, KLD) equal the
  in-process reference's to what two float32 engines' numerics allow (`same_figures`);
- the same weights with one layer damaged: REJECTED by gate 1;
- the same weights blind beyond 600 positions (a sliding window in the served config): gate 1 (positions
  < 512) and depth's first bucket pass, depth's later buckets and retrieval reject;
- the reference served too (model.source: served, a second vLLM server qval starts on the folder the first
  served) against the damaged layer: REJECTED by gate 1, with the reference's exact figures equal to the
  in-process reference's on the same positions;
- qval killed with SIGKILL while it gates: no process of the server is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from qval.config import load_config, parse_config
from qval.environment import NUMERIC_CPU_FLAGS, cpu_model
from qval.pipeline import run_gate
from tests.conftest import ROOT
from tests.engines.served_faults import damaged_layer, window_after

pytestmark = [pytest.mark.slow, pytest.mark.model]  # the reference runs in this process
CHECK = ROOT / "checks/served_vllm_cpu.yaml"


@pytest.fixture(scope="module")
def vllm_python():
    python = os.environ.get("QVAL_VLLM_PYTHON")
    if not python or not Path(python).exists():
        if os.environ.get("QVAL_REQUIRE_VLLM") == "1":
            pytest.fail("QVAL_REQUIRE_VLLM=1 but $QVAL_VLLM_PYTHON is not vLLM's Python: .ci/run builds it")
        pytest.skip("no vLLM here: set QVAL_VLLM_PYTHON to the Python of a vLLM environment (.ci/run builds one)")
    return python


@pytest.fixture(scope="module")
def out(tmp_path_factory, vllm_python):
    return tmp_path_factory.mktemp("served_vllm")


#: the shipped check's budgets cut for gates 2 and 3 and retrieval (the limits as shipped): a few short generations.
#: Gate 4's suites keep their 40 items (at fewer, a suite's flip-rate bound exceeds its limit with no flip); of its
#: three, `recall` (generated answers) and `cloze` (a word read through prompt log-probabilities) stay: `choice`
#: scores its options through the same requests as `cloze`, at four requests an item (81 s of the run on CI's CPU).
CUT = {"quality": {"bleu_max_new_tokens": 16}, "longgen": {"max_prompts": 2, "new_tokens": 320, "edge": 64},
       # 9 needles of the shipped 20: a short, a middle and the longest context, each at its start, middle and end
       # (the 600-token window still loses the needles more than 600 positions back: 3 of the 9)
       "retrieval": {"lengths": [256, 1024, 2048], "depths": [0.0, 0.5, 1.0]}}
CUT_SUITES = ("recall", "cloze")


#: the budgets of a test that reads one verdict of a gate, not its figures: half of gate 1's positions (a damaged
#: layer's mean KLD is 0.028 against the limit of 0.001) and one 2048-token sequence at depth (every bucket)
FEWER = {"agreement": {"tokens": 4096}, "depth": {"tokens": 2048}}


def variant(name: str, model: str | None = None, gates: list[str] | None = None, budgets: dict | None = None):
    """The shipped CPU check, renamed, serving `model`, with only `gates` enabled (all when None), cut down (`CUT`),
    with `budgets` (e.g. `FEWER`) over the shipped ones."""
    data = yaml.safe_load(CHECK.read_text())
    data["name"] = name
    if model is not None:
        data["engine"]["options"]["launch"]["model"] = model
    for g, settings in CUT.items():
        data["gates"][g].update(settings)
    data["gates"]["tasks"]["suites"] = [x for x in data["gates"]["tasks"]["suites"] if x["builtin"] in CUT_SUITES]
    for g, settings in (budgets or {}).items():
        data["gates"][g].update(settings)
    if gates is not None:
        for g in data["gates"]:
            data["gates"][g]["enabled"] = g in gates
    return parse_config(data, str(CHECK))


def failed_gates(result) -> set[str]:
    return {c.gate for c in result.verdict.checks if c.outcome == "fail"}


def _cpu() -> str:
    got = cpu_model()
    return f"{got.get('cpu_model', 'an unnamed CPU')} ({got.get('cpu_flags') or 'none of ' + ' '.join(NUMERIC_CPU_FLAGS)})"


def same_figures(nll_a, nll_b, p_a, p_b) -> None:
    """Two float32 engines' per-position answers for the same model are the same figures: what their kernels'
    rounding allows, far below what a fault moves. vLLM's CPU kernels are chosen per machine (its builds for
    AVX2, AVX-512, AVX-512-BF16; oneDNN's own dispatch): on this repository's dev machine (AMD EPYC) the true
    token's NLL differed by at most 5.3e-5 nats, on the CI machine of 2026-12-06 by up to 4.8e-3 (the 6 positions
    its log printed: 4e-5 to 5e-4) in one server and under 1e-3 in the next server of the same folder (why the
    two differ there was not traced; a 128-token chunked prefill moves nothing on the dev machine).
    One layer's down_proj × 1.5 (the damaged folder below; the dev machine's run) moves the median by 0.10 nats,
    the largest by 2.5, Δp by up to 0.37 and the mean KLD to 0.028: these limits fail it
    (test_a_served_reference_gives_the_in_process_reference_s_figures asserts that)."""
    dn, dp = np.abs(np.asarray(nll_a) - np.asarray(nll_b)), np.abs(np.asarray(p_a) - np.asarray(p_b))
    seen = (f"|ΔNLL| median {np.median(dn):.3g}, max {dn.max():.3g}; |Δp| max {dp.max():.3g} over {dn.size} "
            f"positions on {_cpu()}")
    assert np.median(dn) < 2e-3 and dn.max() < 2e-2 and dp.max() < 1e-2, seen


@pytest.fixture(scope="module")
def clean(out):
    """The built-in model served as it is, every gate (gates 2-4 cut down), under the shipped check's name."""
    return run_gate(variant(load_config(CHECK).name), out_dir=str(out))


@pytest.fixture(scope="module")
def damaged(clean, out):
    """The served folder with one layer's down_proj × 1.5: built once, served by both tests that need it."""
    folder = Path(clean.report["candidate"]["engine"]["launch"]["folder"])
    return damaged_layer(folder, out / "damaged_layer", "model.layers.14.mlp.down_proj.weight", 1.5)


def test_the_built_in_model_served_by_vllm_is_approved_with_the_reference_s_figures(clean, out):
    assert clean.verdict.approved, [c for c in clean.verdict.checks if c.outcome not in ("pass", "uninformative")]
    engine = clean.report["candidate"]["engine"]
    assert engine["backend"] == "served" and engine["server_version"] and engine["launch"]["server_package"]
    assert engine["tokenizer"].startswith("checked")
    # the exact figures against the in-process reference on the same positions
    a = np.load(out / "served_vllm_cpu" / "gate_agreement" / "positions.npz")
    assert a["top1"].mean() >= 0.999
    same_figures(a["nll_cand"], a["nll_ref"], a["p_cand"], a["p_ref"])
    assert (a["kld_lower"] <= a["kld"] + 1e-12).all() and a["kld"].mean() < 1e-5, (a["kld"].mean(), _cpu())
    # every gate ran against the server
    assert {g for g, r in clean.report["gates"].items() if r.get("status") == "ok"} >= {
        "agreement", "quality", "longgen", "depth", "retrieval", "tasks"}
    assert not list(Path(out).glob("**/crash-*.txt"))


def test_one_damaged_layer_is_rejected_by_gate_1(damaged, out):
    result = run_gate(variant("served_damaged_layer", str(damaged), ["agreement"], FEWER), out_dir=str(out))
    assert not result.verdict.approved
    assert "agreement" in failed_gates(result)


def test_a_model_blind_beyond_600_positions_passes_gate_1_and_is_rejected_deeper(clean, out):
    folder = Path(clean.report["candidate"]["engine"]["launch"]["folder"])
    bad = window_after(folder, out / "window_600", 600)
    result = run_gate(variant("served_window_600", str(bad), ["agreement", "depth", "retrieval"], FEWER), out_dir=str(out))
    assert not result.verdict.approved
    failed = failed_gates(result)
    assert "agreement" not in failed, "gate 1's positions are all under 512: exact there"
    depth = {c.metric: c.outcome for c in result.verdict.checks if c.gate == "depth"}
    assert depth["top1@0-512"] == "pass" and depth["mean_kld@0-512"] == "pass", depth  # inside the window
    assert any(o == "fail" for n, o in depth.items() if not n.endswith("@0-512")), depth  # beyond it
    assert "retrieval" in failed, failed  # a needle more than 600 positions back is out of sight


def test_a_served_reference_gives_the_in_process_reference_s_figures(clean, damaged, out):
    folder = Path(clean.report["candidate"]["engine"]["launch"]["folder"])
    data = yaml.safe_load(CHECK.read_text())
    launch = {**data["engine"]["options"]["launch"], "model": str(folder), "env": {"VLLM_CPU_KVCACHE_SPACE": "2",
                                                                                  "VLLM_CPU_OMP_THREADS_BIND": "nobind"}}
    data.update({"name": "served_reference", "model": {"source": "served", "served": {"top_k": 64, "concurrency": 8,
                                                                                       "launch": launch}}})
    data["engine"]["options"]["launch"]["model"] = str(damaged)
    data["gates"] = {"agreement": data["gates"]["agreement"]}
    result = run_gate(parse_config(data, str(CHECK)), out_dir=str(out))
    assert not result.verdict.approved and failed_gates(result) == {"agreement"}
    assert result.report["model"]["served"] and result.report["model"]["engine"]["server_version"]
    served = np.load(out / "served_reference" / "gate_agreement" / "positions.npz")
    local = np.load(out / "served_vllm_cpu" / "gate_agreement" / "positions.npz")
    assert served["nll_ref"].shape == local["nll_ref"].shape
    same_figures(served["nll_ref"], local["nll_ref"], served["p_ref"], local["p_ref"])  # one reference, two engines
    with pytest.raises(AssertionError):  # the limits see the damaged layer
        same_figures(served["nll_cand"], served["nll_ref"], served["p_cand"], served["p_ref"])
    assert (served["kld_lower"] <= served["kld"] + 1e-12).all() and served["top1"].mean() < 0.99


def _procs() -> dict[int, tuple[int, int, bytes]]:
    """Every live process: pid -> (ppid, process group, command line). Read from /proc: a server may
    rename itself (vLLM sets process titles), its group and parent stay what they were."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[0] != b"Z":  # a zombie is gone
            out[int(entry.name)] = (int(fields[1]), int(fields[2]), cmdline)
    return out


def _server_group(qval_pid: int) -> tuple[int | None, list[int]]:
    """The process group of the supervisor qval started (its own session), and every process of that
    group or descended from the supervisor (one that left the group would still be found), but it."""
    procs = _procs()
    sup = next((pid for pid, (ppid, _, cmd) in procs.items() if ppid == qval_pid and b"qval.engines.supervisor" in cmd), None)
    if sup is None:
        return None, []
    group, found = procs[sup][1], {sup}
    while True:
        more = {pid for pid, (ppid, pg, _) in procs.items() if pid not in found and (ppid in found or pg == group)}
        if not more:
            break
        found |= more
    return group, sorted(found - {sup})


def test_qval_killed_mid_gate_leaves_no_vllm_process(clean, out, tmp_path):
    data = yaml.safe_load(CHECK.read_text())
    data["name"] = "served_killed"
    data["report"] = {"dir": str(tmp_path)}
    data["gates"] = {g: {**v, "enabled": g == "agreement"} for g, v in data["gates"].items()}
    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-m", "qval.cli", "gate", "--config", str(config), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    log = out / "served_killed" / "served" / "server.log"
    end = time.monotonic() + 900
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()
        if log.is_file() and "Application startup complete" in log.read_text(errors="replace"):
            break
        time.sleep(1)
    time.sleep(5)  # the gates have begun asking
    group, members = _server_group(proc.pid)
    assert group is not None, "qval's server supervisor not found while qval gated"
    assert members, "the supervisor has no server process while qval gated"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 60
    while time.monotonic() < end and any(pg == group for _, pg, _ in _procs().values()):
        time.sleep(1)
    left = {pid: cmd[:120] for pid, (_, pg, cmd) in _procs().items() if pg == group}
    assert not left, f"processes of the server's group outlived qval: {left}"
    alive = _procs()
    assert not {p: alive[p][2][:120] for p in members if p in alive}, "a process the server started outlived qval"

"""qval.parallel and `qval sweep --parallel`: worker slots from the visible GPUs, the scheduler
(each job once, never more than one per worker, results in the jobs' order), and a real sweep of
two candidates in two CPU workers sharing one snapshot filled once."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qval.cli import app
from qval.errors import ConfigError
from qval.parallel import Slot, schedule, slots

from .conftest import ROOT, small_config, write_config


def test_slots_from_the_visible_gpus() -> None:
    assert [s.gpus for s in slots("auto", 8, 64)] == [str(i) for i in range(8)]
    assert [s.gpus for s in slots("4", 8, 64)] == ["0,1", "2,3", "4,5", "6,7"]  # two GPUs per candidate
    assert [s.gpus for s in slots("3", 8, 64)] == ["0,1", "2,3", "4,5"]
    assert slots("auto", 0, 64) == [] and slots("1", 8, 64) == []  # one worker: the sweep runs in turn
    assert slots("cpu:4", 0, 16) == [Slot("", 4)] * 4 and slots("cpu:4", 0, 16)[0].env() == {"CUDA_VISIBLE_DEVICES": "",
                                                                                           "OMP_NUM_THREADS": "4"}
    for bad, why in (("3", "need at least 3 GPUs"), ("two", "give auto"), ("0", "at least 1"), ("cpu:x", "give auto")):
        with pytest.raises(ConfigError, match=why):
            slots(bad, 2, 8)


class Proc:
    """A fake worker process that ends after `ticks` polls."""

    def __init__(self, log: list, job: str, slot: Slot, ticks: int, code: int) -> None:
        self.log, self.job, self.slot, self.ticks, self.code = log, job, slot, ticks, code
        log.append(("start", job, slot.gpus))

    def poll(self) -> int | None:
        self.ticks -= 1
        if self.ticks > 0:
            return None
        self.log.append(("end", self.job, self.slot.gpus))
        return self.code


def test_schedule_runs_each_job_once_never_two_on_a_worker() -> None:
    log: list = []
    ticks = {"a": 5, "b": 1, "c": 1, "d": 3, "e": 1}
    workers = [Slot("0"), Slot("1")]
    out = schedule(list(ticks), workers, lambda j, s: Proc(log, j, s, ticks[j], 1 if j == "d" else 0), poll_s=0)
    assert [j for j, _, _ in out] == list(ticks) and [c for _, c, _ in out] == [0, 0, 0, 1, 0]
    assert sorted(j for e, j, _ in log if e == "start") == sorted(ticks)
    busy: dict[str, str] = {}
    for event, job, gpu in log:  # replay: a worker is never given a job while it runs one
        if event == "start":
            assert gpu not in busy, (job, busy)
            busy[gpu] = job
        else:
            assert busy.pop(gpu) == job
    assert log[0] == ("start", "a", "0") and log[1] == ("start", "b", "1")  # "b" ends first: "c" takes worker 1
    assert ("start", "c", "1") in log


@pytest.mark.slow
@pytest.mark.model  # its workers load the real model
def test_a_parallel_sweep_on_two_cpu_workers_shares_one_snapshot(tmp_path) -> None:
    gates = {"agreement": {"dataset": str(ROOT / "calib_data/heldout_eval.jsonl"), "tokens": 1024, "ctx": 256,
                           "min_top1": 0.5, "max_mean_kld": 1.0}}
    paths = []
    for name, kv in (("par-a", "fp16"), ("par-b", "fp8")):
        cfg = small_config(name, fmt="fp8", kv=kv, gates=gates, calibration={"samples": 4, "seq_len": 128})
        cfg["diagnostics"] = {"enabled": False}
        paths.append(str(write_config(tmp_path, cfg, f"{name}.yaml")))
    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", *paths, "--out", str(out), "--parallel", "cpu:2", "-q"])
    assert result.exit_code in (0, 1), result.output
    sweep = json.loads((out / "sweep.json").read_text())
    assert {e["name"] for e in sweep["ranking"]} == {"par-a", "par-b"}
    assert all(e["status"] in ("APPROVE", "REJECT") for e in sweep["ranking"]), sweep["ranking"]
    assert sweep["reference"]["parallel_workers"] == ["cpu", "cpu"]
    assert (out / "workers" / "reference.log").is_file()  # the snapshot was filled once, first
    for name in ("par-a", "par-b"):
        report = json.loads((out / name / "report.json").read_text())
        assert report["model"]["snapshot"]["reference_forward_calls"] == 0  # both read the shared snapshot
        assert report["gates"]["agreement"]["details"]["snapshot"]["reused_calls"] > 0

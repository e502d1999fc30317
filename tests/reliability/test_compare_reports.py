"""benchmarks/compare_reports.py under inputs that are not reports: one line naming the file and what to give, exit 2
(its exit 1 means that figures differ), never a traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from ..conftest import ROOT

SCRIPT = ROOT / "benchmarks/compare_reports.py"


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_equal_and_differing_reports_and_a_run_folder(tmp_path):
    a = {"verdict": {"approved": True}, "gates": {"agreement": {"top1": 0.9}}}
    (tmp_path / "run" / "x").mkdir(parents=True)
    (tmp_path / "run" / "x" / "report.json").write_text(json.dumps(a), encoding="utf-8")
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps({**a, "gates": {"agreement": {"top1": 0.8}}}).encode()))
    same = run(tmp_path / "run" / "x", tmp_path / "run" / "x" / "report.json")
    assert same.returncode == 0 and same.stdout.startswith("0 of "), same.stderr
    differ = run(tmp_path / "run" / "x", tmp_path / "b.json.gz")
    assert differ.returncode == 1 and differ.stdout.startswith("1 of "), differ.stderr


@pytest.mark.parametrize("content", [b"\xff\xfe", b'{"verdict": {"appro', b"[1, 2]", b"not gzip", None, "folder"])
def test_what_is_not_a_report_is_exit_2_with_one_line(tmp_path, content):
    good = tmp_path / "good.json"
    good.write_text("{}", encoding="utf-8")
    bad = tmp_path / ("bad.json.gz" if content == b"not gzip" else "bad.json")
    if content == "folder":
        bad.mkdir()
    elif content is not None:
        bad.write_bytes(content)
    for args in ((bad, good), (good, bad)):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(bad) in r.stderr, r.stderr


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`compare_reports.py a b | head -1`: the pipe closes after the first line; the script says nothing more and its
    exit code still says whether figures differ (was: a BrokenPipeError traceback)."""
    gates = {f"g{i}": {"x": float(i)} for i in range(200)}
    (tmp_path / "a.json").write_text(json.dumps({"gates": gates}), encoding="utf-8")
    (tmp_path / "b.json").write_text(json.dumps({"gates": {k: {"x": v["x"] + 1} for k, v in gates.items()}}), encoding="utf-8")
    for _ in range(5):  # the race between the reader closing and the writer writing: a few tries
        p = subprocess.Popen([sys.executable, str(SCRIPT), tmp_path / "a.json", tmp_path / "b.json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 1 and "Traceback" not in err and "BrokenPipe" not in err, err

"""Each gate's typed details (qval.results): a gate cannot write a key its type does not name,
a stored result reads back to the same report.json, and a report whose details lost or renamed a key
stops rendering with a DataError that names it, instead of printing "None" where a figure was."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from qval.errors import DataError
from qval.io import to_jsonable
from qval.gates.agreement.judge import summarize
from qval.report.html import render_html
from qval.report.markdown import render_markdown
from qval.results import TYPES
from qval.gates.agreement.result import AgreementDetails
from qval.verdict import GateResult

FIXTURES = Path(__file__).parent / "fixtures"


def _agreement() -> GateResult:
    rng = np.random.default_rng(0)
    n = 64
    kld = rng.exponential(0.02, n)
    kld[:3] = 0.0
    a = {"kld": kld, "top1": rng.random(n) > 0.1, "p_ref": rng.random(n), "p_cand": rng.random(n),
         "nll_ref": rng.random(n), "nll_cand": rng.random(n)}
    return summarize(a, {"dataset": "heldout", "dataset_tokens": 4096, "tokens_requested": 4096, "chunks": 4, "ctx": 32,
                         "scored_per_chunk": 15, "scored_positions": n}, 1.0)


def test_the_gate_returns_its_type_and_report_json_reads_back_to_the_same_dict():
    r = _agreement()
    assert isinstance(r.details, AgreementDetails)
    stored = json.loads(json.dumps(r.to_dict()))
    back = GateResult.from_dict(stored)
    assert isinstance(back.details, AgreementDetails)
    assert back.to_dict() == stored
    # ints stay ints (the count columns render as before), the alias key keeps its name
    assert isinstance(stored["details"]["kld_histogram"]["zeros"], int) and stored["details"]["kld_histogram"]["zeros"] == 3
    assert "p99.9" in stored["details"]["kld"]
    # a field the gate did not give is not written
    assert "shortfall" not in stored["details"] and "kld_bound" not in stored["details"]


def test_a_key_the_type_does_not_name_is_refused_where_it_is_written():
    with pytest.raises(ValidationError, match="kld_mean"):
        AgreementDetails.model_validate({**_agreement().to_dict()["details"], "kld_mean": 0.1})


def test_snapshot_use_is_recorded_in_typed_and_plain_details():
    r = _agreement()
    r.record_snapshot_use({"key": "ab", "computed": 1.0})
    assert r.to_dict()["details"]["snapshot"] == {"key": "ab", "computed": 1.0}
    plain = GateResult("quality", "ok", details={"ppl": {}})
    plain.record_snapshot_use({"key": "cd"})
    assert plain.to_dict()["details"]["snapshot"] == {"key": "cd"}


RENAMED = [("toy_gates", "agreement", ("kld",), ("p99", "p99_")),
           ("toy_gates", "agreement", (), ("scored_positions", "positions_scored")),
           ("toy_gates", "depth", ("divergence",), ("first_difference", "first")),
           ("real_nvfp4", "quality", ("bleu", "groups", "en"), ("chrf_ref", "chrf_reference")),
           ("real_nvfp4", "quality", ("ppl",), ("positions", "n")),
           ("real_nvfp4", "longgen", ("sizing",), ("ref_loop_rate", "loop_rate")),
           ("real_nvfp4", "longgen", ("windows", 0), ("cand_judge_nll", "cand_nll")),
           ("toy_gates", "retrieval", ("overall", "drop"), ("mcnemar_p", "p")),
           ("toy_gates", "retrieval", ("cells", 0), ("ref_right", "reference_right")),
           ("toy_gates", "tasks", ("suites", 0, "drop"), ("mcnemar_p", "p")),
           ("toy_gates", "tasks", ("suites", 0, "flipped", 1), ("cand_answer", "candidate_answer")),
           ("toy_gates", "tasks", ("suites", 2, "lmeval"), ("qval_reference", "qval_ref")),
           ("toy_gates", "tasks", ("suites", 3, "drop"), ("unit", "units")),
           ("real_nvfp4", "tasks", ("suites", 0), ("counts", "table"))]


# report.html shows gate 2's measurements only and of gate 3 its windows: the rest of their details is read by report.md
@pytest.mark.parametrize("fixture,gate,path,renamed,render", [(*case, render) for case in RENAMED
                                                              for render in (render_markdown, render_html)
                                                              if not (render is render_html and case[1] == "quality")
                                                              and not (render is render_html and case[2] == ("sizing",))])
def test_a_renamed_key_in_a_stored_report_is_an_error_naming_it(fixture, gate, path, renamed, render):
    report = json.loads((FIXTURES / f"{fixture}.json").read_text(encoding="utf-8"))
    render(copy.deepcopy(report))  # the fixture as stored renders
    d = report["gates"][gate]["details"]
    for key in path:
        d = d[key]
    old, new = renamed
    d[new] = d.pop(old)
    with pytest.raises(DataError, match=rf"gate {gate}.*details do not match.*{'|'.join([old, new])}"):
        render(report)


def test_a_stored_result_of_another_shape_is_a_data_error_with_what_to_do():
    stored = _agreement().to_dict()
    del stored["details"]["kld"]
    with pytest.raises(DataError, match=r"gate agreement's result: .*'kld'.*delete its stage folder"):
        GateResult.from_dict(stored)
    # an unfinished gate's details (what it knew before it stopped) are not held to the type
    err = GateResult.from_dict({**stored, "status": "error", "details": {"chunks": 2}})
    assert err.details == {"chunks": 2}


@pytest.mark.parametrize("fixture,gate", [("toy_gates", "agreement"), ("toy_gates", "depth"), ("toy_gates", "retrieval"),
                                          ("toy_gates", "tasks"), ("real_nvfp4", "agreement"), ("real_nvfp4", "quality"),
                                          ("real_nvfp4", "longgen"), ("real_nvfp4", "tasks")])
def test_every_stored_fixture_reads_back_through_its_type_unchanged(fixture, gate):
    stored = json.loads((FIXTURES / f"{fixture}.json").read_text(encoding="utf-8"))["gates"][gate]
    back = GateResult.from_dict(stored)
    assert type(back.details).__name__ == TYPES[gate].__name__
    assert to_jsonable(back.to_dict()["details"]) == stored["details"]  # as report.json writes it ("nan" for NaN)


def test_an_unfinished_result_shows_its_measurements_not_a_section_of_nones():
    """A non-finite gate 3 with a measurement and no details: the measurement in a plain table, not the
    gate's section with "None prompts (None)" where its details would be (the golden before the types)."""
    report = json.loads((FIXTURES / "toy_gates.json").read_text(encoding="utf-8"))
    assert report["gates"]["longgen"]["status"] == "nonfinite" and report["gates"]["longgen"]["measurements"]
    page = render_markdown(report)
    section = page.split("## Gate 3")[1].split("\n## ")[0]
    assert "| late_kld | nan | – |" in section and "None" not in section


def test_a_suite_whose_figures_are_not_its_kinds_is_refused():
    """Gate 4's suites carry one of two shapes of drop: right/wrong marks (Newcombe's figures and the paired
    table) or a per-document score (the score drop in its unit); a suite that claims one kind and carries the
    other's figures does not read back."""
    stored = json.loads((FIXTURES / "toy_gates.json").read_text(encoding="utf-8"))["gates"]["tasks"]
    binary, scored = stored["details"]["suites"][0], stored["details"]["suites"][2]
    assert "kind" not in binary and scored["kind"] == "mean"
    for suite, kind in ((binary, "mean"), (scored, "binary")):
        bad = copy.deepcopy(stored)
        bad["details"]["suites"] = [{**suite, "kind": kind}]
        with pytest.raises(DataError, match=r"gate tasks's result: .*suites\.0"):
            GateResult.from_dict(bad)


def test_a_suite_gives_the_figures_of_its_own_kind_only():
    details = GateResult.from_dict(json.loads((FIXTURES / "toy_gates.json").read_text(encoding="utf-8"))["gates"]["tasks"]).details
    binary, scored = details.split()
    drop, counts = binary[0].marks
    assert drop.mcnemar_p is not None and counts.ref_only + counts.cand_only == drop.net_loss + counts.cand_only
    assert scored[0].score.unit
    with pytest.raises(TypeError, match="scored per document"):
        scored[0].marks
    with pytest.raises(TypeError, match="marked right or wrong"):
        binary[0].score

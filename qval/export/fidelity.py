"""The fidelity check: do the exported files hold the model that was calibrated?

Read back from the safetensors (never from the exporter's memory), it proves:

1. the declaration: `hf_quant_config.json` and config.json's `quantization_config` name the
   configured format, and the KV-cache setting is the configured one — with `kv_cache: fp16`
   no KV quantization may be declared and no `k_scale`/`v_scale` stored (ModelOpt's examples
   export an FP8 KV cache by default; a checkpoint that silently carries one is rejected);
2. every quantized layer is stored in its low-precision dtype with finite, positive scales,
   and no layer is quantized that the calibrated model keeps in high precision;
3. the decoded weights equal the calibrated quantizers' output on the same weights, code for
   code. Two float32 formulas meet here: ModelOpt's fake quant rounds w·(bound/amax) while the
   exporter rounds w/(amax/bound); they differ by one ulp, which changes the code only when
   the value sits exactly on a rounding midpoint (common here: the reference's weights come from
   a GGUF grid). Such a flip is a tie, both codes are correct roundings, and it is counted; any
   other difference fails. Equal codes may differ in value by 2 ulp (the scale is stored as
   amax/bound, the fake quant multiplies by 1/(bound/amax));
4. the stored activation scales, pre_quant_scales and KV scales equal the calibrated ones, and
   every high-precision tensor equals the model's own.

The comparison model is the calibrated model after ModelOpt's export-time step
(`requantize_resmooth_fused_llm_layers`), which re-smooths layers that share an input
(q/k/v, gate/up) to one pre_quant_scale for SmoothQuant and AWQ. Layers it changed are listed:
for those formats the export is *not* the calibrated fake-quant model, and only an engine that
reads the export (`engine: {backend: export}`) gates what will be deployed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import QuantConfig
from ..quantize.modelopt_adapter import as_exported, quantizer_state  # noqa: F401  (as_exported: build.py's step, ModelOpt's)
from .formats import EXPORTABLE, KV_ALGO, export_spec
from .reader import HF_QUANT_CONFIG, layer_tensors, load_tensors, quantized_layer_names

CLOSE = 2.0**-21  # relative: 2–4 float32 ulps
TIE = 2.0**-20  # relative distance of the weight from the midpoint of the two codes


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    severity: str = "error"  # "error" fails the check; "warn" is reported and does not

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "severity": self.severity, "detail": self.detail}


@dataclass
class FidelityReport:
    checks: list[Check] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    changed_at_export: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks if c.severity == "error")

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.severity == "error"]

    def add(self, name: str, ok: bool, detail: str, severity: str = "error") -> None:
        self.checks.append(Check(name, bool(ok), detail, severity))

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks], "totals": self.totals,
                "changed_at_export": self.changed_at_export, "layers": self.layers}


def compare_codes(decoded: torch.Tensor, expected: torch.Tensor, weight: torch.Tensor) -> dict[str, Any]:
    """Element-wise: equal (within 2 ulp), a tie flip (the weight sits on the midpoint of the two
    values), or a mismatch.

    >>> w = torch.tensor([1.0, 3.0, 5.2])  # quantized with step 2: 3.0 is a tie, 5.2 is not
    >>> compare_codes(torch.tensor([0.9999999, 2.0, 4.0]), torch.tensor([1.0, 4.0, 6.0]), w)["counts"]
    {'n': 3, 'equal': 1, 'ties': 1, 'mismatches': 1}
    """
    d, e, w = decoded.float(), expected.float(), weight.float()
    scale = torch.maximum(d.abs(), e.abs())
    equal = (d - e).abs() <= CLOSE * scale
    tie = ~equal & ((w - (d + e) / 2).abs() <= TIE * w.abs().clamp_min(torch.finfo(torch.float32).tiny))
    bad = ~equal & ~tie
    out: dict[str, Any] = {"counts": {"n": d.numel(), "equal": int(equal.sum()), "ties": int(tie.sum()), "mismatches": int(bad.sum())}}
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0, 0])
        out["first_mismatch"] = {"index": i, "decoded": float(d.flatten()[i]), "expected": float(e.flatten()[i]),
                                 "weight": float(w.flatten()[i])}
        out["max_abs_error"] = float((d - e).abs()[bad].max())
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().reshape(-1), b.float().reshape(-1).to(a.device)
    return a.shape == b.shape and bool(((a - b).abs() <= CLOSE * torch.maximum(a.abs(), b.abs())).all())


def _amax(q: Any) -> torch.Tensor | None:
    a = quantizer_state(q).amax
    return None if a is None else a.detach().float().cpu()


def check_declaration(folder: Path, quant: QuantConfig, report: FidelityReport) -> None:
    hq_path = folder / HF_QUANT_CONFIG
    if not hq_path.is_file():
        report.add("declaration", False, f"{HF_QUANT_CONFIG} is missing: the checkpoint does not say it is quantized")
        return
    hq = json.loads(hq_path.read_text(encoding="utf-8")).get("quantization", {})
    qc = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("quantization_config") or {}
    want = export_spec(quant.format.value).quant_algo
    ok = hq.get("quant_algo") == want and qc.get("quant_algo") == want
    report.add("declared_format", ok, f"{HF_QUANT_CONFIG} says {hq.get('quant_algo')!r}, config.json says "
               f"{qc.get('quant_algo')!r}; the config asks for {want!r} ({quant.format.value})")
    want_kv = KV_ALGO[quant.kv_cache.value]
    declared = {"hf_quant_config.json kv_cache_quant_algo": hq.get("kv_cache_quant_algo"),
                "config.json kv_cache_scheme": (qc.get("kv_cache_scheme") or None) and "present"}
    if want_kv is None:
        ok = all(v is None for v in declared.values())
        detail = "KV cache fp16: no KV-cache quantization may be declared; found " + \
                 (", ".join(f"{k} = {v!r}" for k, v in declared.items() if v is not None) or "none (correct)")
    else:
        ok = hq.get("kv_cache_quant_algo") == want_kv and declared["config.json kv_cache_scheme"] == "present"
        detail = f"KV cache {quant.kv_cache.value}: expected kv_cache_quant_algo {want_kv!r} and a kv_cache_scheme; found " + \
                 ", ".join(f"{k} = {v!r}" for k, v in declared.items())
    report.add("declared_kv_cache", ok, detail)


def check_kv_scales(model: torch.nn.Module, tensors: dict[str, torch.Tensor], quant: QuantConfig, report: FidelityReport) -> None:
    stored = sorted(k for k in tensors if k.endswith((".k_scale", ".v_scale")))
    if KV_ALGO[quant.kv_cache.value] is None:
        report.add("kv_scales", not stored, f"KV cache fp16: {len(stored)} k_scale/v_scale tensors stored"
                   + (f" (first: {stored[0]})" if stored else " (correct: none)"))
        return
    problems, expected = [], 0
    for name, module in model.named_modules():
        for which in ("k", "v"):
            q = getattr(module, f"{which}_bmm_quantizer", None)
            if q is None or not q.is_enabled:
                continue
            expected += 1
            key = f"{name}.{which}_proj.{which}_scale"
            t = tensors.get(key)
            if t is None:
                problems.append(f"{key} missing")
            elif not (torch.isfinite(t).all() and (t > 0).all()):
                problems.append(f"{key} = {t.tolist()} is not a positive number")
            elif not _close(t, _amax(q) / (bound := quantizer_state(q).maxbound)):
                problems.append(f"{key} = {float(t):.6g}, calibrated amax/{bound:g} = {float(_amax(q)) / bound:.6g}")
    report.add("kv_scales", expected > 0 and not problems and len(stored) == expected,
               f"KV cache fp8: {expected} calibrated KV quantizers, {len(stored)} scales stored"
               + (f"; {len(problems)} problems, first: {problems[0]}" if problems else ""))


def check_layers(model: torch.nn.Module, tensors: dict[str, torch.Tensor], quant: QuantConfig, report: FidelityReport) -> None:
    fmt = export_spec(quant.format.value)
    calibrated = {n: m for n, m in model.named_modules()
                  if getattr(m, "weight_quantizer", None) is not None and m.weight_quantizer.is_enabled}
    stored = set(quantized_layer_names(tensors))
    missing, extra = sorted(set(calibrated) - stored), sorted(stored - set(calibrated))
    report.add("layer_coverage", not missing and not extra,
               f"{len(calibrated)} layers quantized in the calibrated model, {len(stored)} carry scales in the export"
               + (f"; without scales: {', '.join(missing[:3])}" if missing else "")
               + (f"; quantized only in the export: {', '.join(extra[:3])}" if extra else ""))
    totals = {"layers": 0, "n": 0, "equal": 0, "ties": 0, "mismatches": 0, "bad_layers": 0}
    structural: list[str] = []
    values: list[str] = []
    act: list[str] = []
    for name in sorted(set(calibrated) & stored):
        module, t = calibrated[name], layer_tensors(tensors, name)
        row: dict[str, Any] = {"layer": name, "dtype": str(t["weight"].dtype).removeprefix("torch.")}
        absent = [k for k in fmt.required if k not in t and not (k == "input_scale" and not module.input_quantizer.is_enabled)]
        bad_scale = [k for k, v in t.items() if k != "weight" and not (torch.isfinite(v.float()).all() and (v.float() > 0).all())]
        if t["weight"].dtype != fmt.weight_dtype or absent or bad_scale:
            structural.append(f"{name}: weight dtype {row['dtype']} (expected {str(fmt.weight_dtype).removeprefix('torch.')})"
                              + (f", missing {', '.join(absent)}" if absent else "")
                              + (f", {', '.join(bad_scale)} not finite and positive" if bad_scale else ""))
            totals["bad_layers"] += 1
            report.layers.append(row)
            continue
        with torch.no_grad():
            weight = module.weight.detach().float().cpu()
            expected = module.weight_quantizer(module.weight).detach().float().cpu()
        cmp = compare_codes(fmt.decode(t, quant.awq_block_size), expected, weight)
        row.update(cmp)
        for k in ("n", "equal", "ties", "mismatches"):
            totals[k] += cmp["counts"][k]
        totals["layers"] += 1
        totals["bad_layers"] += cmp["counts"]["mismatches"] > 0
        if cmp["counts"]["mismatches"]:
            values.append(f"{name}: {cmp['counts']['mismatches']} weights decode to another value (first: {cmp['first_mismatch']})")
        act += _activation_scales(name, module, t)
        report.layers.append(row)
    report.totals = totals
    report.add("scales_present", not structural, "every quantized layer stores its weight in the format's dtype with "
               "finite, positive scales" if not structural else f"{len(structural)} layers: " + "; ".join(structural[:3]))
    report.add("weights_equal", totals["layers"] > 0 and totals["mismatches"] == 0 and totals["bad_layers"] == 0,
               f"{totals['n']} weights in {totals['layers']} layers: {totals['equal']} equal, {totals['ties']} rounding-midpoint "
               f"ties, {totals['mismatches']} mismatches" + (f"; {values[0]}" if values else ""))
    report.add("activation_scales", not act, "stored input scales and pre_quant_scales equal the calibrated ones"
               if not act else "; ".join(act[:3]))


def _activation_scales(name: str, module: torch.nn.Module, t: dict[str, torch.Tensor]) -> list[str]:
    out = []
    iq = module.input_quantizer
    s = quantizer_state(iq)
    if s.enabled and "input_scale" in t and not _close(t["input_scale"], _amax(iq) / s.maxbound):
        out.append(f"{name}: input_scale {float(t['input_scale']):.6g} != calibrated amax/{s.maxbound:g}")
    pqs = s.stored_pre_quant_scale
    if pqs is not None and ("pre_quant_scale" not in t or not _close(t["pre_quant_scale"], pqs.detach().cpu())):
        out.append(f"{name}: pre_quant_scale " + ("missing" if "pre_quant_scale" not in t else "differs from the calibrated one"))
    return out


def check_high_precision(model: torch.nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype, report: FidelityReport) -> None:
    """Embeddings, norms, excluded layers: stored exactly as the model holds them (in `dtype`)."""
    quantized = set(quantized_layer_names(tensors))
    state = {k: v for k, v in model.state_dict().items() if "quantizer" not in k}
    diffs, compared = [], 0
    for key, t in tensors.items():
        if key.rsplit(".", 1)[0] in quantized or key.endswith(("_scale", "_scale_2")) or key not in state:
            continue
        compared += 1
        if not _identical(t, state[key].detach().cpu().to(t.dtype)):
            diffs.append(key)
    report.add("high_precision_tensors", compared > 0 and not diffs,
               f"{compared} high-precision tensors compared with the model's own ({str(dtype).removeprefix('torch.')}): "
               + (f"{len(diffs)} differ, first {diffs[0]}" if diffs else "all equal"))


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if a.element_size() == 1:  # float8 has no equality kernel on every device; compare the bytes
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def changes_at_export(calibrated: torch.nn.Module, exported: torch.nn.Module) -> list[dict[str, Any]]:
    """Quantized layers whose weights or activation scales ModelOpt's export step changed."""
    out = []
    mods = dict(exported.named_modules())
    for name, m in calibrated.named_modules():
        wq = getattr(m, "weight_quantizer", None)
        if wq is None or not wq.is_enabled or name not in mods:
            continue
        e = mods[name]
        what = []
        if not torch.equal(m.weight, e.weight):
            what.append("weight re-smoothed and re-quantized")
        pa, pb = (quantizer_state(x.input_quantizer).stored_pre_quant_scale for x in (m, e))
        if pa is not None and (pb is None or not torch.equal(pa, pb)):
            what.append("pre_quant_scale " + ("folded into the preceding norm" if pb is None else "averaged over the layers sharing its input"))
        ia, ib = _amax(m.input_quantizer), _amax(e.input_quantizer)
        if m.input_quantizer.is_enabled and ia is not None and ib is not None and not torch.equal(ia, ib):
            what.append("input amax unified over the layers sharing its input")
        if what:
            out.append({"layer": name, "changes": what})
    return out


def check_fidelity(folder: Path, calibrated: torch.nn.Module, as_exported_model: torch.nn.Module, quant: QuantConfig,
                   dtype: torch.dtype) -> FidelityReport:
    """Run every check on the export in `folder`. `calibrated` is the restored calibrated
    model; `as_exported_model` a second copy passed through `as_exported`."""
    report = FidelityReport()
    if quant.spec.export is None:
        report.add("format_supported", False, f"qval reads back {', '.join(EXPORTABLE)} exports; "
                   f"{quant.format.value} weights cannot be verified, so this export is not verified")
        return report
    folder = Path(folder)
    check_declaration(folder, quant, report)
    tensors = load_tensors(folder)
    check_kv_scales(as_exported_model, tensors, quant, report)
    check_layers(as_exported_model, tensors, quant, report)
    check_high_precision(as_exported_model, tensors, dtype, report)
    report.changed_at_export = changes_at_export(calibrated, as_exported_model)
    n = len(report.changed_at_export)
    report.add("export_is_calibrated_model", n == 0,
               "ModelOpt exported the calibrated quantizers unchanged" if n == 0 else
               f"ModelOpt's export re-smoothed {n} layers that share an input (e.g. {report.changed_at_export[0]['layer']}: "
               f"{'; '.join(report.changed_at_export[0]['changes'])}); the export is not the calibrated fake-quant model, "
               "so gate it with engine: {backend: export}", severity="warn")
    return report

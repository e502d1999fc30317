"""Why do realquant's FP8 outputs differ from fakequant's? Run on the GPU (H200) by the lead.

    python benchmarks/nojit.py benchmarks/realquant_gap.py --out gap.json

RESULTS.md §7 measured KLD(fakequant ‖ realquant) = 0.030 on the built-in model, about as far
as either is from the reference. This script takes the two apart, layer by layer and end to end.

Per quantized linear, on the inputs it sees in one realquant forward (batch of held-out text):
the exact FP8 product is computed in float64 from the very operands the kernel gets
(x8 = fp8(x / scale_a), w8 = the stored FP8 weight): y_exact = (x8·scale_a) (w8·scale_b)^T + b.
Against it, the relative RMS error of
  - fakequant's module (ModelOpt fake quant: quantize-dequantize, then a float16 GEMM),
  - realquant's module (ModelOpt's Fp8PerTensorLinear: torch._scaled_mm, use_fast_accum=True),
  - the same _scaled_mm call with use_fast_accum=False,
  - the unquantized linear (the size of the FP8 error itself, for scale),
plus the fraction of activation and weight elements whose FP8 code in fakequant differs from the
kernel's operand (fakequant's float16 values mapped back onto the kernel's grid).

End to end (gate 1's convention, second half of 512-token chunks scored): KLD and top-1 of
fakequant against realquant as shipped, and against realquant with ModelOpt's GEMM patched to
use_fast_accum=False; each also against the reference. Two floors for scale: realquant against a
second identical forward (determinism), and the float16 reference against the same reference in
float32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


def kld(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    lp, lq = p_logits.float().log_softmax(-1), q_logits.float().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def rel(y: torch.Tensor, exact: torch.Tensor) -> float:
    return float((y.double() - exact).norm() / exact.norm())


def est(x: np.ndarray) -> dict[str, float]:
    return {"mean": float(x.mean()), "stderr": float(x.std(ddof=1) / np.sqrt(x.size)), "n": int(x.size),
            "p50": float(np.quantile(x, 0.5)), "p99": float(np.quantile(x, 0.99)), "max": float(x.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=32, help="512-token held-out chunks scored end to end")
    ap.add_argument("--layer-batch", type=int, default=2, help="chunks whose activations feed the per-layer study")
    ap.add_argument("--work", default="reports/bench-realquant-gap")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this study is about the GPU FP8 kernel: run it on the H200"

    import modelopt.torch.quantization.backends.fp8_per_tensor_gemm as fp8gemm
    from modelopt.torch.quantization.nn.modules.quant_linear import RealQuantLinear
    from modelopt.torch.quantization.qtensor import QTensorWrapper

    from qval.data import chunk, load_dataset, token_stream
    from realquant_vs_fakequant import build_pair  # benchmarks/ is on sys.path when a script there runs

    root = Path(__file__).resolve().parent.parent
    cfg_data = {"name": "bench-gap-fp8", "model": {"source": "default", "dtype": "float16", "device": "cuda"},
                "quant": {"format": "fp8", "kv_cache": "fp16"},
                "calibration": {"dataset": str(root / "calib_data/general_mix.jsonl"), "samples": 64, "seq_len": 512},
                "gates": {"agreement": {"enabled": False}}, "diagnostics": {"enabled": False}}
    _, ref, built = build_pair(cfg_data, args.work)
    fq, rq = built["fakequant"].model, built["realquant"].model
    ref_mods, fq_mods = dict(ref.model.named_modules()), dict(fq.named_modules())

    ds = load_dataset(str(root / "calib_data/heldout_eval.jsonl"))
    ids = token_stream(ds.texts(), ref.tokenizer, ref.tokenizer.eos_token_id)
    chunks = chunk(ids, 512, limit=args.chunks)

    # ---- per layer -------------------------------------------------------------------------
    linears = {n: m for n, m in rq.named_modules() if isinstance(m, RealQuantLinear) and isinstance(m.weight, QTensorWrapper)}
    caps: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: caps.__setitem__(n, a[0].detach())) for n, m in linears.items()]
    x_ids = torch.tensor(chunks[: args.layer_batch], device="cuda")
    with torch.no_grad():
        rq(input_ids=x_ids, use_cache=False)
    for h in hooks:
        h.remove()
    layers = []
    with torch.no_grad():
        for n, m in linears.items():
            x = caps[n]
            y_rq = m(x)  # also sets m._scale_a / m._scale_b
            sa, sb = m._scale_a.float(), m._scale_b.float()
            w8 = m.weight.get_qtensor()._quantized_data
            k = x.shape[-1]
            x8 = fp8gemm._to_fp8(x, sa).reshape(-1, k)
            bias = m.bias
            exact = (x8.double() * sa.double()) @ (w8.double() * sb.double()).t()
            if bias is not None:
                exact = exact + bias.double()
            exact = exact.reshape(*x.shape[:-1], -1)
            mm = {}
            for fast in (True, False):
                y = torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=x.dtype, use_fast_accum=fast)
                if bias is not None:
                    y = y + bias
                mm[fast] = y.reshape(*x.shape[:-1], -1)
            fm = fq_mods[n]
            y_fq = fm(x)
            # FP8 codes: fakequant's dequantized values (float16) mapped back onto the kernel's grid
            xq_fq = fm.input_quantizer(x) if getattr(fm, "input_quantizer", None) is not None else x
            x_codes = fp8gemm._to_fp8(xq_fq.float(), sa).reshape(-1, k)
            differ = float((x_codes.view(torch.uint8) != x8.view(torch.uint8)).float().mean())
            w_codes = fp8gemm._to_fp8(fm.weight.float(), sb)
            w_differ = float((w_codes.view(torch.uint8) != w8.view(torch.uint8)).float().mean())
            # the unquantized weight quantized in float32 with the GEMM's own scale, against the stored codes
            w32 = fp8gemm._to_fp8(ref_mods[n].weight.float(), sb)
            w32_differ = float((w32.view(torch.uint8) != w8.view(torch.uint8)).float().mean())
            y_ref = ref_mods[n](x)
            layers.append({
                "name": n, "k": k,
                "rel_err": {"fakequant": rel(y_fq, exact), "realquant": rel(y_rq, exact),
                            "scaled_mm_fast_accum": rel(mm[True], exact), "scaled_mm_exact_accum": rel(mm[False], exact),
                            "unquantized": rel(y_ref, exact)},
                "realquant_equals_fast_scaled_mm": bool(torch.equal(y_rq, mm[True])),
                "activation_codes_differ_fraction": differ,
                "weight_codes_differ_fraction": w_differ,
                "float32_weight_codes_differ_fraction": w32_differ,
            })
    def med(key: str) -> float:
        return float(np.median([r["rel_err"][key] for r in layers]))

    per_layer = {"linears": len(layers), "median_rel_err": {k: med(k) for k in layers[0]["rel_err"]},
                 "max_rel_err": {k: float(max(r["rel_err"][k] for r in layers)) for k in layers[0]["rel_err"]},
                 "realquant_equals_fast_scaled_mm": sum(r["realquant_equals_fast_scaled_mm"] for r in layers),
                 **{f"mean_{key}": float(np.mean([r[key] for r in layers])) for key in
                    ("activation_codes_differ_fraction", "weight_codes_differ_fraction", "float32_weight_codes_differ_fraction")},
                 "worst_fast_accum": sorted(((r["name"], r["rel_err"]["scaled_mm_fast_accum"]) for r in layers),
                                            key=lambda t: -t[1])[:5]}
    print(json.dumps(per_layer, indent=2))

    # ---- end to end ------------------------------------------------------------------------
    orig_impl = fp8gemm._fp8_gemm_impl

    def exact_accum_impl(input, weight_fp8, scale_a, scale_b, bias=None):  # noqa: A002 - ModelOpt's signature
        shape = input.shape
        x8 = fp8gemm._to_fp8(input, scale_a).reshape(-1, shape[-1])
        out = torch._scaled_mm(x8, weight_fp8.reshape(-1, weight_fp8.shape[-1]).t(), scale_a=scale_a, scale_b=scale_b,
                               bias=bias, out_dtype=input.dtype, use_fast_accum=False)
        return out.reshape(*shape[:-1], out.shape[-1])

    import copy

    ref32 = copy.deepcopy(ref.model)  # the reference's own float16-vs-float32 difference: a floor
    for t in [*ref32.parameters(), *ref32.buffers()]:  # (.float() is refused for a GGUF-loaded model)
        if t.is_floating_point():
            t.data = t.data.float()
    rows: dict[str, list[np.ndarray]] = {}

    def add(key: str, v: torch.Tensor) -> None:
        rows.setdefault(key, []).append(v.float().flatten().cpu().numpy())

    with torch.no_grad():
        for b0 in range(0, len(chunks), 8):
            x = torch.tensor(chunks[b0 : b0 + 8], device="cuda")
            r = ref.model(input_ids=x, use_cache=False).logits[:, 256:-1]
            f = fq(input_ids=x, use_cache=False).logits[:, 256:-1]
            fp8gemm._fp8_gemm_impl = orig_impl
            q_fast = rq(input_ids=x, use_cache=False).logits[:, 256:-1]
            q_again = rq(input_ids=x, use_cache=False).logits[:, 256:-1]
            r32 = ref32(input_ids=x, use_cache=False).logits[:, 256:-1]
            add("kld_realquant_run_vs_rerun", kld(q_fast, q_again))
            add("kld_reference_float32_reference_float16", kld(r32, r))
            add("top1_reference_float32_reference_float16", r32.argmax(-1) == r.argmax(-1))
            fp8gemm._fp8_gemm_impl = exact_accum_impl
            q_exact = rq(input_ids=x, use_cache=False).logits[:, 256:-1]
            fp8gemm._fp8_gemm_impl = orig_impl
            for name, q in (("realquant_fast_accum", q_fast), ("realquant_exact_accum", q_exact)):
                add(f"kld_fakequant_{name}", kld(f, q))
                add(f"top1_fakequant_{name}", f.argmax(-1) == q.argmax(-1))
                add(f"kld_reference_{name}", kld(r, q))
            add("kld_reference_fakequant", kld(r, f))
            add("kld_realquant_fast_vs_exact_accum", kld(q_exact, q_fast))
    end_to_end = {k: est(np.concatenate(v)) for k, v in rows.items()}
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "model": ref.describe(),
              "per_layer_summary": per_layer, "end_to_end": end_to_end, "per_layer": layers}
    print(json.dumps(end_to_end, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""What an FP8 KV cache costs in vLLM's FlashAttention-3 path, computed independently of vLLM and of ModelOpt.

With `--kv-cache-dtype fp8`, vLLM 0.26 on Hopper stores K and V in FP8 (E4M3, per-tensor scale: the checkpoint's
`k_scale`/`v_scale`, else 1.0) and, because FA3's FP8 kernel takes FP8 operands on both sides, also quantizes the
queries (static scale `q_scale`, 1.0 unless the checkpoint has one: vllm/model_executor/layers/attention/attention.py,
`query_quant`), and FA3 multiplies P·V in FP8: the softmax numerators of each key block, exp(S − running max) in
[0, 1], are cast to E4M3, whose smallest subnormal is 2^-9 — smaller weights become 0. qval's simulation
(ModelOpt's fake-quantized K/V, attention otherwise in the model's dtype) models the first of these only.

This script takes the built-in model's bfloat16 weights (no weight quantization: the attention path alone), runs the
gate-1 tokens of checks/gpu/served_vllm_fp8.yaml through attention functions of its own (registered under their own
names through transformers' AttentionInterface and chosen for this script's model instance), and reports the KLD
against the plain model (sdpa in bfloat16) for each step of the path:

    plain     the same function with nothing quantized (attention in float32): the floor of the comparison
    kv        K and V in FP8 with the export's scales (qval's simulation of the KV cache)
    kv_q      + the queries in FP8 with vLLM's q_scale (1.0)
    kv_q_p    + P in FP8 per key block of BLOCK keys with FA3's online softmax (running max, fp32 row sums)

    python3 benchmarks/fa3_fp8_emulation.py --export EXPORT_DIR --out results.json [--block 128] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

E4M3 = torch.float8_e4m3fn


def q8(x: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """x through E4M3 with a per-tensor scale (saturating at ±448, as vLLM's static quantization does)."""
    return ((x.float() / scale).clamp(-448.0, 448.0).to(E4M3).float()) * scale


def export_scales(export: Path) -> dict[int, tuple[float, float]]:
    """layer index -> (k_scale, v_scale) of a ModelOpt FP8 export (`…layers.N.self_attn.k_proj.k_scale`)."""
    from safetensors import safe_open

    out: dict[int, list[float]] = {}
    for shard in sorted(export.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for k in f.keys():
                if k.endswith((".k_proj.k_scale", ".v_proj.v_scale")):
                    layer = int(k.split(".layers.")[1].split(".")[0])
                    out.setdefault(layer, [1.0, 1.0])[0 if k.endswith("k_scale") else 1] = float(f.get_tensor(k).float())
    if not out:
        raise SystemExit(f"{export}: no k_scale/v_scale tensors; give the FP8-KV export (qval build of served_vllm_fp8)")
    return {k: (v[0], v[1]) for k, v in out.items()}


def make_attention(mode: str, scales: dict[int, tuple[float, float]], block: int):
    """An attention function (transformers' AttentionInterface signature) for one step of the FP8 path."""

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):  # noqa: ANN001, ANN003
        ks, vs = scales[module.layer_idx]
        b, h, t, d = query.shape
        rep = h // key.shape[1]
        k = (key.float() if mode == "plain" else q8(key, ks)).repeat_interleave(rep, dim=1)
        v = (value.float() if mode == "plain" else q8(value, vs)).repeat_interleave(rep, dim=1)
        q = q8(query, 1.0) if mode in ("kv_q", "kv_q_p") else query.float()
        scale = scaling if scaling is not None else d ** -0.5
        s = (q @ k.transpose(-1, -2)) * scale
        causal = torch.ones(t, k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - t)
        s = s.masked_fill(~causal, float("-inf"))
        if mode != "kv_q_p":
            out = torch.softmax(s, dim=-1) @ v
        else:  # FA3's online softmax over key blocks, P cast to E4M3 before P·V, row sums kept in fp32
            m = torch.full((b, h, t, 1), float("-inf"), device=q.device)
            l = torch.zeros((b, h, t, 1), device=q.device)
            acc = torch.zeros((b, h, t, v.shape[-1]), device=q.device)
            for j in range(0, k.shape[2], block):
                sb = s[..., j:j + block]
                m_new = torch.maximum(m, sb.amax(dim=-1, keepdim=True))
                alive = torch.isfinite(m_new)
                corr = torch.where(alive, torch.exp(m - m_new), torch.zeros_like(m))
                p = torch.where(alive, torch.exp(sb - m_new), torch.zeros_like(sb))
                l = l * corr + p.sum(dim=-1, keepdim=True)
                acc = acc * corr + p.to(E4M3).float() @ v[..., j:j + block, :]
                m = m_new
            out = acc / l
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attend


def chunks(tokenizer, path: Path, tokens: int, ctx: int) -> list[torch.Tensor]:
    ids: list[int] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            ids += tokenizer(json.loads(line)["text"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(ids) >= tokens:
            break
    ids = ids[:tokens - tokens % ctx]
    return [torch.tensor(ids[i:i + ctx]) for i in range(0, len(ids), ctx)]


def main(argv: list[str] | None = None) -> int:
    from transformers import AttentionInterface

    from qval.config import ModelConfig
    from qval.models import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--block", type=int, default=128, help="keys per block of FA3's online softmax (assumed)")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    t0 = time.time()
    scales = export_scales(args.export)
    loaded = load_model(ModelConfig(dtype="bfloat16", device=args.device))
    model, tok = loaded.model, loaded.tokenizer
    data = chunks(tok, ROOT / "calib_data/heldout_eval.jsonl", args.tokens, args.ctx)
    modes = ["plain", "kv", "kv_q", "kv_q_p"]
    for mode in modes:
        AttentionInterface.register(f"qval_bench_fa3emul_{mode}", make_attention(mode, scales, args.block))
    sums = {m: {"kld": [], "top1": []} for m in modes}
    with torch.no_grad():
        for x in data:
            x = x[None].to(args.device)
            model.set_attn_implementation("sdpa")
            ref = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
            for mode in modes:
                model.set_attn_implementation(f"qval_bench_fa3emul_{mode}")
                cand = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
                sums[mode]["kld"].append((ref.exp() * (ref - cand)).sum(-1).cpu())
                sums[mode]["top1"].append((ref.argmax(-1) == cand.argmax(-1)).float().cpu())
    model.set_attn_implementation("sdpa")
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
              "tokens_scored": int(sum(len(x) - 1 for x in data)), "ctx": args.ctx, "block": args.block,
              "k_scale_range": [min(s[0] for s in scales.values()), max(s[0] for s in scales.values())],
              "v_scale_range": [min(s[1] for s in scales.values()), max(s[1] for s in scales.values())], "modes": {}}
    for mode in modes:
        kld = torch.cat(sums[mode]["kld"])
        result["modes"][mode] = {"mean_kld": float(kld.mean()), "p99_kld": float(kld.quantile(0.99)),
                                 "top1": float(torch.cat(sums[mode]["top1"]).mean())}
    result["seconds"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["modes"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

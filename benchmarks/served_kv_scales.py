"""vLLM's FP8 KV cache with the K/V scales qval's calibration exports, against vLLM's default scales of 1.0.

vLLM reads calibrated K/V scales from a checkpoint whose quantization config carries a KV-cache scheme.
ModelOpt's FP8 export (`qval build` of checks/fp8_kvfp8.yaml) holds them (`…k_proj.k_scale`,
`…v_proj.v_scale`: amax / 448) beside FP8 weights; to measure the KV cache alone, this writes the
reference's own float weights with those scales and a compressed-tensors config that quantizes the KV
cache only (no weight scheme: every linear stays unquantized), then gates it as
checks/served_vllm_cpu_kvfp8.yaml gates vLLM's default scales.

`--simulate N` also computes, in this process, what an FP8 (E4M3, per-tensor) K/V cache costs in plain
arithmetic on the first N tokens of the long documents: keys after RoPE and values quantized with scale 1.0
and with the calibrated scales, attention in float32 (a named attention function registered through
transformers' AttentionInterface and chosen for this script's own model instance) — the yardstick for
what the served engine's FP8 KV path adds.

    qval build --config checks/fp8_kvfp8.yaml --out reports --dtype float32
    python benchmarks/served_kv_scales.py --export reports/fp8_kvfp8/export --reference reports/.reference/served/<key> \
        --folder reports/kv_scales_model --out reports [--gate] [--simulate 1024]
    python benchmarks/served_kv_scales.py --in-process --out reports   # the same gates on qval's own FP8 KV cache

`--in-process` gates a KV-cache-only candidate in qval's process (`quant: {format: none, kv_cache: fp8}` on
fakequant: ModelOpt's fake-quantized K/V, calibrated on checks/fp8_kvfp8.yaml's data) with the same check, so
the served engine's FP8 KV cache and ModelOpt's stand beside each other gate by gate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

KV_ONLY = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": [],
           "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}}


def kv_scales(export: Path) -> dict:
    """The export's K/V scales, keyed as vLLM names an attention layer's (`…self_attn.k_scale`)."""
    from safetensors import safe_open

    out = {}
    for shard in sorted(export.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for k in f.keys():
                if k.endswith((".k_proj.k_scale", ".v_proj.v_scale")):
                    name = k.replace(".k_proj.k_scale", ".k_scale").replace(".v_proj.v_scale", ".v_scale")
                    out[name] = f.get_tensor(k).float().reshape(())
    if not out:
        raise SystemExit(f"{export}: no k_scale/v_scale tensors; export a config with kv_cache: fp8")
    return out


def write_folder(export: Path, reference: Path, folder: Path) -> Path:
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    for f in reference.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "qval-folder.json":
            shutil.copy2(f, folder / f.name)
    weights = {}
    for shard in sorted(reference.glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    scales = kv_scales(export)
    weights.update(scales)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((reference / "config.json").read_text())
    config["quantization_config"] = KV_ONLY
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    print(f"{folder}: the reference's weights, {len(scales)} K/V scales from {export} "
          f"(k_scale of layer 0: {float(scales['model.layers.0.self_attn.k_scale']):.5f})")
    return folder


def simulate(folder: Path, reference: Path, tokens: int) -> None:
    """FP8 K/V in plain arithmetic against the float reference (see the module docstring)."""
    import torch
    from safetensors import safe_open
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    scales = {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in f.keys():
            if k.endswith((".k_scale", ".v_scale")):
                scales[k] = float(f.get_tensor(k))
    which = {"calibrated": False}

    def q8(x: torch.Tensor, s: float) -> torch.Tensor:
        return (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s

    def fp8_kv(module, query, key, value, attention_mask, **kw):  # noqa: ANN001, ANN003
        i = module.layer_idx
        ks = scales[f"model.layers.{i}.self_attn.k_scale"] if which["calibrated"] else 1.0
        vs = scales[f"model.layers.{i}.self_attn.v_scale"] if which["calibrated"] else 1.0
        return sdpa_attention_forward(module, query, q8(key, ks), q8(value, vs), attention_mask, **kw)

    AttentionInterface.register("qval_bench_fp8_kv", fp8_kv)
    tok = AutoTokenizer.from_pretrained(reference)
    text = " ".join(json.loads(line)["text"] for line in (ROOT / "calib_data/longctx_docs.jsonl").read_text().splitlines() if line.strip())
    x = torch.tensor([tok(text)["input_ids"][:tokens]])
    ref = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32)
    cand = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32, attn_implementation="qval_bench_fp8_kv")
    with torch.no_grad():
        lr = torch.log_softmax(ref(x).logits[0].float(), -1)
        t = x[0, 1:, None]
        for calibrated in (False, True):
            which["calibrated"] = calibrated
            lc = torch.log_softmax(cand(x).logits[0].float(), -1)
            kld = (lr.exp() * (lr - lc)).sum(-1)
            dnll = (lr[:-1].gather(1, t) - lc[:-1].gather(1, t)).mean().item()
            print(f"in-process FP8 K/V, {'calibrated' if calibrated else 'unit'} scales, {tokens} tokens: mean KLD "
                  f"{kld.mean():.4f}, p99 {kld.quantile(0.99):.3f}, top-1 {(lr.argmax(-1) == lc.argmax(-1)).float().mean():.4f}, "
                  f"mean ΔNLL {dnll:+.4f}")


def kv_only_check() -> dict:
    """checks/served_vllm_cpu_kvfp8.yaml's gates and limits with the candidate in qval's process: format none
    with an FP8 KV cache on fakequant (ModelOpt's fake-quantized K/V alone, calibrated on fp8_kvfp8's data)."""
    import yaml

    data = yaml.safe_load((ROOT / "checks/served_vllm_cpu_kvfp8.yaml").read_text())
    data["name"] = "sim_kvfp8_only"
    data["engine"] = {"backend": "fakequant"}
    data["calibration"] = yaml.safe_load((ROOT / "checks/fp8_kvfp8.yaml").read_text())["calibration"]
    return data


def gate(data: dict, out: str) -> None:
    from qval.config import parse_config
    from qval.pipeline import run_gate

    result = run_gate(parse_config(data, str(ROOT / "checks/served_vllm_cpu_kvfp8.yaml")), out_dir=out)
    print(f"{data['name']}: {'APPROVE' if result.verdict.approved else 'REJECT'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", type=Path)
    ap.add_argument("--reference", type=Path, help="the reference's served folder (qval writes it)")
    ap.add_argument("--folder", type=Path)
    ap.add_argument("--out", default="reports")
    ap.add_argument("--gate", action="store_true", help="then gate it as checks/served_vllm_cpu_kvfp8.yaml")
    ap.add_argument("--simulate", type=int, default=0, help="tokens of the in-process FP8 K/V yardstick (0: none)")
    ap.add_argument("--in-process", action="store_true",
                    help="instead: gate a KV-cache-only FP8 candidate in qval's process on the same check (no server)")
    args = ap.parse_args(argv)
    if args.in_process:
        gate(kv_only_check(), args.out)
        return 0
    if not (args.export and args.reference and args.folder):
        ap.error("--export, --reference and --folder are needed (or --in-process)")
    folder = write_folder(args.export, args.reference, args.folder)
    if args.simulate:
        simulate(folder, args.reference, args.simulate)
    if args.gate:
        import yaml

        data = yaml.safe_load((ROOT / "checks/served_vllm_cpu_kvfp8.yaml").read_text())
        data["name"] = "served_vllm_cpu_kvfp8_calibrated"
        data["engine"]["options"]["launch"]["model"] = str(folder.resolve())
        gate(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

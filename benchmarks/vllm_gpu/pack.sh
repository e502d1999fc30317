#!/usr/bin/env bash
# Pack vLLM 0.26.0 for the lent GPU machine (no network there): the pinned wheels of requirements.txt (the CUDA 13.0
# build of vLLM, which pins torch==2.11.0, the machine's torch), vLLM's wheel trimmed of what a text model on an
# H100/H200 never loads, split into parts that each fit one device call's carry beside the working tree.
#   usage: bash benchmarks/vllm_gpu/pack.sh [PART_MB]      (default 46: the tree itself travels too, 64 MiB a call)
#   writes .vp0/ … .vpN/ in the repository root (git-ignored), one part each, and prints their sizes.
# On the GPU machine, benchmarks/served_gpu_device.sh keeps each part (`keep`, one call per part, back to back)
# and installs the lot (`install`, 6 s) into $HOME/vsite, which only the vLLM server's Python sees.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); here="$root/benchmarks/vllm_gpu"; mb=${1:-46}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" && cd "$work/wheels"
P=(--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
   --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_31_x86_64
   --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 --platform any)
while read -r r; do [ -n "$r" ] || continue
  python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp "${P[@]}" "$r" \
    || { echo "pack.sh: cannot download $r (is the package index reachable?)" >&2; exit 2; }
done < "$here/requirements.txt"
# vLLM's wheel: FlashAttention-2's library (FA3 serves SM90 and is the one with an FP8 KV cache), the optional Rust
# front end, DeepGEMM builds for other Pythons: 290 -> 149 MiB
zip -q -d vllm-0.26.0-*.whl 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm-rs' \
  'vllm/third_party/deep_gemm/_C.cpython-310*' 'vllm/third_party/deep_gemm/_C.cpython-311*' \
  'vllm/third_party/deep_gemm/_C.cpython-313*' 'vllm/third_party/deep_gemm/_C.cpython-314*' || true
n=$(ls *.whl | wc -l); [ "$n" -eq "$(grep -c . "$here/requirements.txt")" ] || { echo "pack.sh: $n wheels for $(grep -c . "$here/requirements.txt") requirements" >&2; exit 2; }
cd "$work" && tar cf all.tar -C wheels . && split -b "${mb}M" -d all.tar part_
sha256sum all.tar | cut -d' ' -f1 > sha256
rm -rf "$root"/.vp[0-9]*
for p in part_*; do d="$root/.vp$((10#${p#part_}))"; mkdir -p "$d" && mv "$p" "$d/" && cp sha256 "$d/"; done
du -sh "$root"/.vp[0-9]*

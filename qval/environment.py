"""The machine a run computed on, for every report: library versions, Python, CPU (model, the features that
choose its kernels, torch's dispatch level), threads and CUDA device. Recorded, never keyed: of these, only the
versions of stages.KEY_PACKAGES enter the stage keys."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from .stages import versions as installed_versions


#: CPU features that choose torch's, oneDNN's and vLLM's CPU kernels, hence a CPU run's last digits
NUMERIC_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


def cpu_model(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and the features among NUMERIC_CPU_FLAGS it has, read from /proc/cpuinfo
    (empty where there is none): two CPUs of one architecture give different last digits when their kernels
    differ (AMX against AVX-512), so a report says which one computed its figures."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    out: dict[str, Any] = {}
    if fields.get("model name"):
        out["cpu_model"] = fields["model name"]
    if "flags" in fields:
        have = set(fields["flags"].split())
        out["cpu_flags"] = " ".join(f for f in NUMERIC_CPU_FLAGS if f in have)
    return out


def environment() -> dict[str, Any]:
    """Library versions and the device, for every report; of these, only the versions of stages.KEY_PACKAGES
    enter the stage keys (pipeline.Session.versions): a snapshot is reused across machines of one stack."""
    versions = installed_versions(("qval", "torch", "transformers", "nvidia-modelopt", "sacrebleu", "numpy", "gguf"))
    device = {"cpu": platform.processor() or platform.machine(), **cpu_model(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the ISA torch's own CPU kernels dispatch to
              "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        device["cuda"] = torch.cuda.get_device_name(0)
        device["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return {"versions": versions, "python": platform.python_version(), "device": device}

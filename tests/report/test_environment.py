"""The report's environment names the CPU that computed it (model and the kernel-choosing features), which
a CPU run's last digits depend on."""

from __future__ import annotations

from pathlib import Path

import pytest

from qval import environment as env

AMX_XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: another name, never read
flags\t\t: fpu
"""
EPYC = "processor : 0\nmodel name : AMD EPYC 9B14\nflags : fpu avx2 avx512f avx512_bf16\n"


@pytest.mark.parametrize("text, want", [
    (AMX_XEON, {"cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                "cpu_flags": "avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_int8"}),
    (EPYC, {"cpu_model": "AMD EPYC 9B14", "cpu_flags": "avx2 avx512f avx512_bf16"}),
    ("processor : 0\nBogoMIPS : 50.00\nFeatures : fp asimd\n", {}),  # an Arm board: neither field
    ("", {}),
    ("\x00\xff garbage without a colon\n", {}),
])
def test_the_first_processor_s_model_and_features(text, want):
    assert env.cpu_model(text) == want


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo on this system")
def test_the_environment_carries_this_machine_s():
    device, here = env.environment()["device"], env.cpu_model()
    assert device["cpu"] and {k: device[k] for k in here} == here  # an Arm board has neither field: both absent
    assert "cpu_model" not in here or here["cpu_model"] != ""
    assert set(device.get("cpu_flags", "").split()) <= set(env.NUMERIC_CPU_FLAGS)
    # torch's dispatch level, one of the values torch.backends.cpu.get_cpu_capability's docstring lists
    assert device["cpu_capability"] in ("DEFAULT", "VSX", "Z VECTOR", "ZVECTOR", "NO AVX", "AVX2", "AVX512", "SVE256")

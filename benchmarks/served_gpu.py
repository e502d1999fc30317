"""vLLM on a GPU, gated: the shipped served checks, qval's in-process simulation of the same candidates, and what
decides whether the one predicts the other (issue 50). Runs on the lent GPU machine through
`benchmarks/served_gpu_device.sh`, in phases, each a set of jobs run side by side under a deadline:

    sim      the candidates of checks/gpu/served_vllm_fp8{,_kvfp16}.yaml gated in qval's process (fakequant and
             realquant: the same file, the engine swapped), and the reference written as a bfloat16 folder
    served   the two shipped served checks as a user runs them (qval calibrates, exports, starts vLLM, gates, stops it)
    extras   the export's K/V scales /1000 served (does vLLM apply them? x1000 was run before: a weak probe for E4M3);
             gates 1 and depth on a second fresh server; one server scored twice, plain and in vLLM's batch-invariant
             mode; a served bfloat16 reference against the served export (both sides served)
    speed8b  an 8B-shaped FP8 candidate with random weights (--load-format dummy) against an 8B-shaped bfloat16 reference
             served the same way: the server's own prefill / decode / scoring rates with one API front end and with
             several (`vllm serve --api-server-count`), a bf16 matmul's rate as the hardware limit, and the whole served
             check's seconds per stage

    python3 benchmarks/served_gpu.py run PHASE --work /tmp/sg [--deadline S]   # jobs of PHASE; status in WORK/status.json
    python3 benchmarks/served_gpu.py table --work /tmp/sg --out FILE.json       # the side-by-side table of every report
    python3 benchmarks/served_gpu.py markdown benchmarks/results/h100_served_gpu  # RESULTS' tables from a stored run

Each job writes its log and, for a gate, its run folder under WORK; `table` reads the report.json files only.
Every figure it prints comes from those files; nothing is typed in.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

KV8 = ROOT / "checks/gpu/served_vllm_fp8.yaml"
KV16 = ROOT / "checks/gpu/served_vllm_fp8_kvfp16.yaml"
#: a server beside qval's reference on one GPU: a sized KV cache, not a fraction of the card (vLLM checks the
#: fraction against the free memory at start, so several servers start side by side)
MEMORY = ["--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", "4000000000"]
QVAL = [sys.executable, str(ROOT / "benchmarks/lib/nojit.py"), "-m", "qval"]


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def with_memory(cfg: dict[str, Any]) -> dict[str, Any]:
    launch = cfg["engine"]["options"].get("launch")
    if launch is not None and "--kv-cache-memory-bytes" not in launch.get("args", []):
        launch["args"] = [*launch.get("args", []), *MEMORY]
    return cfg


def variant(base: Path, name: str, **change: Any) -> dict[str, Any]:
    cfg = with_memory(copy.deepcopy(load(base)))
    cfg["name"] = name
    for key, value in change.items():
        if key == "gates_only":
            cfg["gates"] = {g: cfg["gates"][g] for g in value}
        else:
            cfg[key] = value
    return cfg


def in_process(base: Path, name: str, backend: str) -> dict[str, Any]:
    return variant(base, name, engine={"backend": backend})


def find_export(work: Path, *runs: str, wait: float = 0.0) -> Path:
    """The candidate export the first of `runs` to have one wrote; `wait`: seconds to wait for one (a run beside)."""
    from qval.export.hf import EXPORT_MARKER

    end = time.time() + wait
    while True:
        for run in runs:
            # a finished export: renamed into place with its marker (qval/export/hf.py), never a `.partial` folder
            hits = sorted(p.parent for p in (work / "runs" / run).rglob(EXPORT_MARKER) if ".partial" not in str(p))
            if hits and (hits[-1] / "hf_quant_config.json").is_file():
                return hits[-1]
        if time.time() > end:
            raise SystemExit(f"no export under {work / 'runs'} of {', '.join(runs)}: run the served phase first")
        time.sleep(5)


def scaled_export(export: Path, dest: Path, factor: float) -> Path:
    """The export with every K/V scale multiplied by `factor` (vLLM reads them as `…k_proj.k_scale`)."""
    import torch
    from safetensors.torch import load_file, save_file

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(export, dest)
    n = 0
    for shard in sorted(dest.glob("*.safetensors")):
        tensors = load_file(str(shard))
        for k in tensors:
            if k.endswith((".k_scale", ".v_scale")):
                tensors[k] = (tensors[k].float() * factor).to(tensors[k].dtype)
                n += 1
        save_file(tensors, str(shard), metadata={"format": "pt"})
    if n == 0:
        raise SystemExit(f"{export}: no k_scale/v_scale tensors")
    (dest / "qval-scaled.json").write_text(json.dumps({"factor": factor, "tensors": n}))
    return dest


def reference_folder(work: Path) -> Path:
    from qval.config import ModelConfig
    from qval.engines.served_setup import reference_folder as write
    from qval.models import load_model

    loaded = load_model(ModelConfig(dtype="bfloat16", device="cuda"))
    return write(loaded, work / "ref_bf16")


class Server:
    """A vLLM server the driver owns (qval's own launcher: supervisor, log, always stopped)."""

    def __init__(self, folder: Path, work: Path, tag: str, args: list[str], env: dict[str, str] | None = None,
                 kv: str = "fp8", quantization: str | None = "modelopt", top_k: int = 128, dtype: str = "bfloat16",
                 command: list[str] | None = None, api_servers: int = 1) -> None:
        from qval.backends import LaunchOptions
        from qval.engines.server import LaunchedServer, free_port, vllm_command

        launch = LaunchOptions(model=str(folder), dtype=dtype, kv_cache_dtype=kv, quantization=quantization, command=command,
                               api_servers=api_servers,
                               args=[*args, *MEMORY] if "--kv-cache-memory-bytes" not in args else args, env=env or {})
        port = free_port()
        self.command = vllm_command(launch, None if command else os.environ["QVAL_VLLM_PYTHON"], folder, tag, port, top_k)
        self.server = LaunchedServer(self.command, {**os.environ, **(env or {})}, port, work / "logs" / f"server_{tag}.log", 900)
        self.tag = tag

    def __enter__(self) -> "Server":
        self.server.start(print)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.stop()


def url_config(base: Path, name: str, url: str, tag: str, gates: list[str] | None = None, **change: Any) -> dict[str, Any]:
    cfg = variant(base, name, **({"gates_only": gates} if gates else {}), **change)
    cfg["engine"] = {"backend": "served", "options": {"url": url, "model": tag, "top_k": cfg["engine"]["options"]["top_k"]}}
    return cfg


class Phase:
    def __init__(self, work: Path, deadline: float) -> None:
        self.work = work
        self.end = time.time() + deadline
        self.status_path = work / "status.json"
        try:
            self.status = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            self.status = {}
        (work / "configs").mkdir(parents=True, exist_ok=True)
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def note(self, name: str, **facts: Any) -> None:
        """Record `facts` of one job in WORK/status.json, merged under a lock with what other phases (other
        processes, running at the same time) wrote there: each phase rewrites only its own jobs' entries."""
        import fcntl

        self.status.setdefault(name, {}).update(facts)
        with open(self.work / "status.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = json.loads(self.status_path.read_text())
            except (OSError, ValueError):
                current = {}
            current[name] = self.status[name]
            tmp = self.status_path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(current, indent=1))
            tmp.replace(self.status_path)

    def gate(self, cfg: dict[str, Any], extra_env: dict[str, str] | None = None) -> subprocess.Popen | None:
        """Start `qval gate` on `cfg` in the background; None if the deadline leaves no time."""
        name = cfg["name"]
        if time.time() > self.end - 30:
            self.note(name, state="skipped: deadline")
            return None
        path = self.work / "configs" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        log = open(self.work / "logs" / f"{name}.log", "wb")
        cmd = [*QVAL, "gate", "--config", str(path), "--out", str(self.work / "runs")]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(extra_env or {})},
                                start_new_session=True)
        proc.qval_name, proc.qval_t0 = name, time.time()  # type: ignore[attr-defined]
        self.note(name, state="running", started=time.strftime("%H:%M:%S"), command=cmd)
        return proc

    def wait(self, procs: list[subprocess.Popen | None]) -> None:
        for proc in [p for p in procs if p is not None]:
            left = max(1.0, self.end - time.time())
            try:
                code = proc.wait(timeout=left)
                state = {0: "approve", 1: "reject"}.get(code, f"error (exit {code})")
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                state = "killed: deadline"
            self.note(proc.qval_name, state=state, seconds=round(time.time() - proc.qval_t0, 1))  # type: ignore[attr-defined]


def phase_sim(ph: Phase) -> None:
    jobs = [in_process(KV8, "sim_fakequant_kvfp8", "fakequant"), in_process(KV16, "sim_fakequant_kvfp16", "fakequant"),
            in_process(KV16, "sim_realquant_kvfp16", "realquant"), in_process(KV8, "sim_realquant_kvfp8", "realquant")]
    procs = [ph.gate(cfg) for cfg in jobs]
    t0 = time.time()
    try:
        folder = reference_folder(ph.work)
        ph.note("ref_bf16", state="written", folder=str(folder), seconds=round(time.time() - t0, 1))
    except Exception as err:  # noqa: BLE001 - recorded, the gates go on
        ph.note("ref_bf16", state=f"error: {err}")
    ph.wait(procs)


def phase_served(ph: Phase) -> None:
    first = ph.gate(variant(KV8, "served_vllm_fp8"))
    time.sleep(45)  # the second server's start a little behind the first: their compile caches are written once
    ph.wait([first, ph.gate(variant(KV16, "served_vllm_fp8_kvfp16"))])


def phase_extras(ph: Phase) -> None:
    work = ph.work
    # gates 1 and depth on a fresh server (a calibration and export of its own): run to run against the served phase's
    # check, and its export is what the rest serves when the served phase does not run beside this one
    fresh2 = ph.gate(variant(KV8, "served_vllm_fp8_fresh2", gates_only=["agreement", "depth"]))
    export = find_export(work, "served_vllm_fp8", "served_vllm_fp8_fresh2", wait=420)
    # E4M3 is a floating-point format: x 1000 only pushes small values into its subnormals (a weak probe, seen on the
    # H100); / 1000 saturates every K and V at ±448 x scale, which no server applying the scales can hide
    div1000 = scaled_export(export, work / "export_kv_div1000", 0.001)
    # the independent computation of the FP8 attention path (its own process, beside the servers)
    emul_log = open(work / "logs" / "fa3_fp8_emulation.log", "wb")
    emul = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/fa3_fp8_emulation.py"), "--export", str(export),
                             "--out", str(work / "fa3_fp8_emulation.json")], stdout=emul_log, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True)
    emul.qval_name, emul.qval_t0 = "fa3_fp8_emulation", time.time()  # type: ignore[attr-defined]
    ph.note("fa3_fp8_emulation", state="running")

    def gate1_of(name: str, folder: Path) -> dict[str, Any]:
        launch = {"model": str(folder), "dtype": "bfloat16", "kv_cache_dtype": "fp8", "quantization": "modelopt", "args": MEMORY}
        return variant(KV8, name, gates_only=["agreement"], engine={"backend": "served", "options": {"top_k": 128, "launch": launch}})

    # (1) vLLM applies the export's K/V scales: scales / 1000, gate 1 only
    procs = [fresh2, ph.gate(gate1_of("served_kv_div1000", div1000))]
    # (3) a served bfloat16 reference against the served FP8 export (both sides served)
    ref = work / "ref_bf16"
    try:
        if not any(ref.glob("*/config.json")):
            reference_folder(work)
        ref = next(p.parent for p in ref.glob("*/config.json"))
        cfg = variant(KV8, "served_ref_bf16_vs_fp8", gates_only=["agreement", "quality", "longgen", "depth", "retrieval", "tasks"])
        cfg["model"] = {"source": "served", "tokenizer": str(ref), "served": {"top_k": 128, "launch": {
            "model": str(ref), "dtype": "bfloat16", "args": MEMORY}}}
        cfg["quant"] = {"format": "none", "kv_cache": "fp8"}
        cfg["engine"] = {"backend": "served", "options": {"top_k": 128, "launch": {
            "model": str(export), "dtype": "bfloat16", "kv_cache_dtype": "fp8", "quantization": "modelopt", "args": MEMORY}}}
        cfg.pop("calibration", None)
        procs.append(ph.gate(cfg))
    except Exception as err:  # noqa: BLE001 - recorded, the rest goes on
        ph.note("served_ref_bf16_vs_fp8", state=f"error: {err}"[:2000])
    # (4) one server scored twice (gates 1 and depth), plain and in vLLM's batch-invariant mode, the two side by side
    import contextlib

    with contextlib.ExitStack() as stack:
        servers = {}
        for tag, env in (("same", {}), ("batchinv", {"VLLM_BATCH_INVARIANT": "1"})):
            try:
                s = stack.enter_context(Server(export, work, tag, [], env=env))
                servers[tag] = s
                ph.note(f"{tag}_server", state="up", startup_s=round(s.server.startup_seconds or 0, 1), command=s.command, env=env)
            except Exception as err:  # noqa: BLE001
                ph.note(f"{tag}_server", state=f"error: {err}"[:2000])
        for r in (1, 2):
            ph.wait([ph.gate(url_config(KV8, f"served_{tag}_run{r}", s.server.url, tag, ["agreement", "depth"]))
                     for tag, s in servers.items()])
    ph.wait([*procs, emul])


#: the vLLM front end with several API server processes (`vllm serve --api-server-count N`; the module qval starts by
#: default, vllm.entrypoints.openai.api_server, runs one): what turns prompt log-probabilities into JSON is spread over N
API_SERVERS = 8


def phase_speed8b(ph: Phase) -> None:
    from benchmarks.lib.shapes import SHAPES
    from transformers import LlamaConfig

    from qval.config import ModelConfig
    from qval.models import load_tokenizer

    work = ph.work
    folder = work / "l8b"
    tok = load_tokenizer(ModelConfig())
    shape = {**SHAPES["8b"], "vocab_size": len(tok)}  # the built-in tokenizer's vocabulary: every id it emits is valid
    # `architectures` named: without it vLLM 0.26 resolves "LlamaModel" (it served the causal LM all the same on 2026-12-06)
    LlamaConfig(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, dtype="bfloat16",
                architectures=["LlamaForCausalLM"]).save_pretrained(folder)
    tok.save_pretrained(folder)
    facts: dict[str, Any] = {"shape": shape, "peak": bf16_matmul_rate(), "api_servers": API_SERVERS}
    ph.note("speed8b", **facts)
    dummy = ["--load-format", "dummy", "--max-model-len", "4096", "--gpu-memory-utilization", "0.3",
             "--kv-cache-memory-bytes", "6000000000"]
    # three servers at once: the reference (bf16) and the FP8 candidate with API_SERVERS front ends, and the same
    # candidate as qval starts it by default (one front end); each server's rates are measured while the others idle
    import concurrent.futures as cf
    import contextlib

    servers = [Server(folder, work, "ref8b", dummy, kv="auto", quantization=None, api_servers=API_SERVERS),
               Server(folder, work, "cand8b", dummy, kv="fp8", quantization="fp8", api_servers=API_SERVERS),
               Server(folder, work, "cand8b_one", dummy, kv="fp8", quantization="fp8")]
    with contextlib.ExitStack() as stack:
        for s in servers:
            stack.callback(s.server.stop)
        with cf.ThreadPoolExecutor(len(servers)) as ex:  # the three start side by side
            list(ex.map(lambda s: s.server.start(print), servers))
        ref, cand, one = servers
        ph.note("speed8b", **{f"{t}_startup_s": round(s.server.startup_seconds or 0, 1) for t, s in
                              (("ref", ref), ("cand", cand), ("cand_one", one))},
                ref_command=ref.command, cand_command=cand.command, cand_one_command=one.command)
        rates = {}
        for tag, s in (("cand8b", cand), ("cand8b_one", one), ("ref8b", ref)):
            rates[tag] = server_rates(s.server.url, tag, len(tok), n=16)
            ph.note("speed8b", rates=rates)
        # the whole check, both sides served, with the front ends spread and 32 requests in flight
        for name, server, tag, conc in (("speed8b_served", cand, "cand8b", 32),):
            cfg = url_config(KV8, name, server.server.url, tag)
            ref_opts: dict[str, Any] = {"url": ref.server.url, "model": "ref8b", "top_k": 128}
            if conc:
                cfg["engine"]["options"]["concurrency"] = conc
                ref_opts["concurrency"] = conc
            cfg["model"] = {"source": "served", "tokenizer": str(folder), "served": ref_opts}
            cfg["quant"] = {"format": "none", "kv_cache": "fp8"}
            cfg.pop("calibration", None)
            t0 = time.time()
            ph.wait([ph.gate(cfg)])
            ph.note("speed8b", **{f"{name}_wall_s": round(time.time() - t0, 1)})


def bf16_matmul_rate() -> dict[str, float]:
    """The hardware limit a prefill is compared with: a bf16 8192^3 matmul's FLOP/s on this GPU, median of 10."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); a @ b; e.record(); torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    t = sorted(times)[5]
    del a, b
    torch.cuda.empty_cache()
    return {"bf16_tflops": 2 * 8192 ** 3 / t / 1e12, "device": torch.cuda.get_device_name()}


def server_rates(url: str, model: str, vocab: int, n: int = 64, length: int = 1024, workers: int = 16) -> dict[str, Any]:
    """The server's own rates: prefill without log-probabilities (max_tokens 1), scoring with top-K prompt
    log-probabilities (K 20 and 128), and greedy decode (min(n, 32) requests x 256 new tokens, all in flight)."""
    import concurrent.futures as cf
    import urllib.request

    def post(body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def prompts(seed: int) -> list[list[int]]:
        import random
        rng = random.Random(seed)
        return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]

    def timed(bodies: list[dict[str, Any]], workers: int = workers) -> float:
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(workers) as ex:
            list(ex.map(post, bodies))
        return time.perf_counter() - t0

    base = {"model": model, "temperature": 0.0}
    timed([{**base, "prompt": p, "max_tokens": 1} for p in prompts(0)[:8]])  # warm-up
    out: dict[str, Any] = {"requests": n, "prompt_tokens": length, "in_flight": workers}
    dt = timed([{**base, "prompt": p, "max_tokens": 1} for p in prompts(1)])
    out["prefill_tok_s"] = n * length / dt
    for k in (20, 128):
        dt = timed([{**base, "prompt": p, "max_tokens": 1, "prompt_logprobs": k} for p in prompts(2 + k)])
        out[f"scoring_top{k}_tok_s"] = n * length / dt
    decode = [{**base, "prompt": p[:128], "max_tokens": 256, "ignore_eos": True} for p in prompts(9)[:32]]
    dt = timed(decode, workers=len(decode))
    out["decode_tok_s"] = len(decode) * 256 / dt
    out["decode_requests"] = len(decode)
    return out


PHASES = {"sim": phase_sim, "served": phase_served, "extras": phase_extras, "speed8b": phase_speed8b}


# ---------------------------------------------------------------------------------------------- the table
def figures(report: dict[str, Any]) -> dict[str, Any]:
    """One report.json's verdict and every check's figure (`gate/metric`: value, its interval, outcome), its stage
    seconds and the engine it describes."""
    verdict = report.get("verdict") or {}
    checks = {f"{c['gate']}/{c['metric']}": {k: c.get(k) for k in ("value", "lo", "hi", "limit", "outcome")}
              for c in verdict.get("checks", [])}
    return {"decision": verdict.get("decision"), "checks": checks,
            "stages": {k: v.get("seconds") for k, v in (report.get("stages") or {}).items() if isinstance(v, dict)},
            "seconds": report.get("seconds"), "engine": (report.get("candidate") or {}).get("engine"),
            "reference": report.get("model"), "device": (report.get("environment") or {}).get("device"),
            "versions": (report.get("environment") or {}).get("versions")}


#: the served runs of one FP8-KV export, set side by side in the run-to-run table, in this order
REPEAT = ("served_vllm_fp8", "served_vllm_fp8_fresh2", "served_same_run1", "served_same_run2", "served_batchinv_run1",
          "served_batchinv_run2", "served_kv_x1000", "served_kv_div1000")

#: engine run -> the in-process runs of the same candidate it is set beside
PAIRS = {"served_vllm_fp8": ("sim_fakequant_kvfp8", "sim_realquant_kvfp8"),
         "served_vllm_fp8_kvfp16": ("sim_fakequant_kvfp16", "sim_realquant_kvfp16")}


def table(work: Path, out: Path) -> None:
    rows = {}
    for rep in sorted((work / "runs").glob("*/report.json")):
        rows[rep.parent.name] = figures(json.loads(rep.read_text()))
    ratios: dict[str, Any] = {}
    for engine, sims in PAIRS.items():
        for sim in sims:
            if engine in rows and sim in rows:
                a, b = rows[engine]["checks"], rows[sim]["checks"]
                ratios[f"{engine} / {sim}"] = {k: a[k]["value"] / b[k]["value"] for k in a
                                               if "kld" in k and k in b and a[k]["value"] is not None and b[k]["value"]}
    status = json.loads((work / "status.json").read_text()) if (work / "status.json").is_file() else {}
    out.write_text(json.dumps({"runs": rows, "kld_ratios": ratios, "status": status}, indent=1, default=str))
    print(f"{len(rows)} reports -> {out}")
    for name, row in rows.items():
        print(f"{name}: {row['decision']}, " + ", ".join(f"{k} {v['value']:.4g}" for k, v in row["checks"].items()
                                                        if k.startswith("agreement/") and isinstance(v["value"], (int, float))))
    for pair, r in ratios.items():
        print(pair, {k: round(v, 3) for k, v in r.items()})


def stored(folder: Path) -> dict[str, dict[str, Any]]:
    """`figures` of every report a run left in `folder` (`NAME.report.json.gz`, as benchmarks/results keeps them)."""
    import gzip

    return {p.name.removesuffix(".report.json.gz"): figures(json.loads(gzip.decompress(p.read_bytes())))
            for p in sorted(folder.glob("*.report.json.gz"))}


def markdown(folder: Path) -> str:
    """RESULTS' tables from a stored run: simulation against engine check by check (with engine ÷ simulation for
    each KLD figure), the same served candidate run to run, and the FP8 attention path computed apart."""
    rows = stored(folder)
    fmt = lambda c: "–" if c is None else f"{c['value']:.4g}" + {"fail": " ✗", "uninformative": " (u)"}.get(c["outcome"], "")
    out = []
    for kv, (engine, sims) in zip(("FP8", "BF16"), PAIRS.items()):
        cols = [s for s in sims if s in rows] + ([engine] if engine in rows else [])
        if engine not in rows:
            continue
        out += [f"**KV cache {kv}** — " + ", ".join(f"`{c}`" for c in cols), "",
                "| check | " + " | ".join(c.removeprefix("sim_").removeprefix("served_") for c in cols) + " | engine ÷ " + sims[0].removeprefix("sim_") + " |",
                "|---" * (len(cols) + 2) + "|"]
        for key in rows[engine]["checks"]:
            vals = [rows[c]["checks"].get(key) for c in cols]
            ratio = ""
            a, b = rows[engine]["checks"].get(key), rows.get(sims[0], {}).get("checks", {}).get(key)
            if "kld" in key and a and b and b["value"]:
                ratio = f"{a['value'] / b['value']:.2f}"
            out.append(f"| {key} | " + " | ".join(fmt(v) for v in vals) + f" | {ratio} |")
        out.append("| verdict | " + " | ".join(rows[c]["decision"] for c in cols) + " | |")
        out.append("")
    repeat = [n for n in REPEAT if n in rows]
    if repeat:
        keys = [k for k in rows[repeat[0]]["checks"] if k.startswith(("agreement/", "depth/"))]
        out += ["**Run to run** (the FP8-KV export; `served_vllm_fp8(_fresh2)`: a fresh server each; `served_same_run1/2`: "
                "one server twice; `served_batchinv_run1/2`: one server twice in vLLM's batch-invariant mode, beside "
                "`served_same`; `served_kv_x1000` / `_div1000`: the export's K/V scales × 1000 / ÷ 1000)", "",
                "| check | " + " | ".join(repeat) + " |", "|---" * (len(repeat) + 1) + "|"]
        out += [f"| {k} | " + " | ".join(fmt(rows[n]["checks"].get(k)) for n in repeat) + " |" for k in keys]
        out += ["| gate 1 / depth seconds | " + " | ".join(
            " / ".join(f"{rows[n]['stages'][g]:.1f}" if g in rows[n]["stages"] else "–" for g in ("gate_agreement", "gate_depth"))
            for n in repeat) + " |"]
        out.append("")
    inproc = next((n for n in ("served_vllm_fp8_fresh2", "served_vllm_fp8") if n in rows), None)
    if "served_ref_bf16_vs_fp8" in rows and inproc:
        both, one = rows["served_ref_bf16_vs_fp8"]["checks"], rows[inproc]["checks"]
        keys = [k for k in both if k in one]
        out += [f"**A served reference** (the same FP8-KV export served; its reference in qval's process, `{inproc}`, "
                "against vLLM serving the bf16 reference, `served_ref_bf16_vs_fp8`: both sides served)", "",
                f"| check | reference in process | served reference | ÷ |", "|---|---|---|---|"]
        out += [f"| {k} | {fmt(one[k])} | {fmt(both[k])} | "
                + (f"{both[k]['value'] / one[k]['value']:.3f}" if one[k]["value"] else "") + " |" for k in keys]
        out.append("")
    emul = folder / "fa3_fp8_emulation.json"
    if emul.is_file():
        e = json.loads(emul.read_text())
        out += [f"**The FP8 attention path computed apart** ({e['device']}, {e['tokens_scored']} positions, ctx {e['ctx']}, "
                f"key blocks of {e['block']}; bf16 weights, nothing else quantized)", "",
                "| path | mean KLD | p99 KLD | top-1 |", "|---|---|---|---|"]
        out += [f"| {m} | {v['mean_kld']:.4f} | {v['p99_kld']:.4f} | {v['top1']:.4f} |" for m, v in e["modes"].items()]
    return "\n".join(out)


def matmul_flops_per_token(shape: dict[str, Any]) -> float:
    """A Llama-shaped model's linear-layer FLOPs per token (2 x weights: attention projections, MLP, LM head); the
    attention scores' own FLOPs (about 2 % at 1,024 tokens of context for the 8B shape) are left out."""
    h, hd, layers = shape["hidden_size"], shape["head_dim"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * shape["intermediate_size"]
    return 2.0 * (layers * per_layer + h * shape["vocab_size"])


def speed_markdown(folder: Path) -> str:
    """The 8B-shaped servers' own rates (`speed8b`), each against the same run's bf16 matmul rate, and the whole
    served check's seconds per stage (the stages that finished)."""
    status = json.loads((folder / "status.json").read_text())
    s = status.get("speed8b") or {}
    if not s.get("rates"):
        return ""
    flops, peak = matmul_flops_per_token(s["shape"]), s["peak"]["bf16_tflops"] * 1e12
    out = [f"**8B-shaped servers** ({s['peak']['device']}; bf16 8192³ matmul {peak / 1e12:.0f} TFLOP/s in the same run; "
           f"{flops / 1e9:.1f} GFLOP of linear layers a token; {next(iter(s['rates'].values()))['requests']} requests × "
           f"{next(iter(s['rates'].values()))['prompt_tokens']} tokens, 16 in flight)", "",
           "| server | prefill tok/s (× bf16 matmul rate) | scoring top-20 (÷ prefill) | top-128 (÷ prefill) | decode tok/s |",
           "|---|---|---|---|---|"]
    for tag, r in s["rates"].items():
        pre = r["prefill_tok_s"]
        out.append(f"| {tag} | {pre:,.0f} ({pre * flops / peak:.2f}) | {r['scoring_top20_tok_s']:,.0f} (1/{pre / r['scoring_top20_tok_s']:.1f}) "
                   f"| {r['scoring_top128_tok_s']:,.0f} (1/{pre / r['scoring_top128_tok_s']:.0f}) | {r['decode_tok_s']:,.0f} |")
    # stored as stages/gate_X.done.json, or as a collected run leaves them: runs/speed8b_served/gate_X/done.json
    done = {p.name.removesuffix(".done.json").removeprefix("gate_"): json.loads(p.read_text())["seconds"]
            for p in (folder / "stages").glob("gate_*.done.json")}
    done |= {p.parent.name.removeprefix("gate_"): json.loads(p.read_text())["seconds"]
             for p in folder.glob("runs/speed8b_served/gate_*/done.json")}
    if done:
        whole = status.get("speed8b_served") or {}
        order = [g for g in ("agreement", "depth", "quality", "longgen", "retrieval", "tasks") if g in done]
        out += ["", f"**The whole served check** (`speed8b_served`, both sides served: {whole.get('state', '?')} after "
                f"{whole.get('seconds', '?')} s; the stages that finished)", "",
                "| " + " | ".join(order) + " | sum |", "|---" * (len(order) + 1) + "|",
                "| " + " | ".join(f"{done[g]:.1f}" for g in order) + f" | {sum(done.values()):.1f} |"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("phase", choices=sorted(PHASES))
    r.add_argument("--work", type=Path, default=Path("/tmp/sg"))
    r.add_argument("--deadline", type=float, default=540.0, help="seconds from now by which every job has ended")
    t = sub.add_parser("table")
    t.add_argument("--work", type=Path, default=Path("/tmp/sg"))
    t.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("markdown", help="RESULTS' tables from a stored run (benchmarks/results/h100_served_gpu)")
    m.add_argument("folder", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "markdown":
        print(markdown(args.folder) if list(args.folder.glob("*.report.json.gz")) else
              speed_markdown(args.folder))
        return 0
    if args.cmd == "table":
        table(args.work, args.out)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    ph = Phase(args.work, args.deadline)
    t0 = time.time()
    ph.note(f"phase_{args.phase}", state="running", started=time.strftime("%H:%M:%S"))
    try:
        PHASES[args.phase](ph)
        ph.note(f"phase_{args.phase}", state="done", seconds=round(time.time() - t0, 1))
    except BaseException as err:
        ph.note(f"phase_{args.phase}", state=f"error: {type(err).__name__}: {err}"[:2000], seconds=round(time.time() - t0, 1))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())

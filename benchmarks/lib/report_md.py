"""Render a run's results.json (models × scoring, decode, calibration, end to end; the layout of
results/h200_[1-4]-*.json) as the Markdown tables of benchmarks/RESULTS.md: `python benchmarks/lib/report_md.py FILE`."""

from __future__ import annotations

from typing import Any


def _f(x: Any, digits: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_f(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return out + [""]


def _err(section: Any) -> str | None:
    return section.get("error") if isinstance(section, dict) else None


def targets(name: str, m: dict[str, Any]) -> list[list[Any]]:
    """One row per issue-6 target this model was measured against."""
    rows: list[list[Any]] = []
    sc = m.get("scoring", {})
    if isinstance(sc, dict) and sc.get("budgets"):
        b = sc["budgets"][-1]
        rows.append([name, "scoring throughput, gate ÷ plain forwards", f"{b['ratio']:.3f}", "≥ 0.9", b["ratio"] >= 0.9])
        peaks = [x["peak_bytes_above_models"] for x in sc["budgets"] if x["peak_bytes_above_models"] is not None]
        if len(peaks) == len(sc["budgets"]) and peaks:
            grow = peaks[-1] / peaks[0]
            rows.append([name, f"peak memory, {sc['budgets'][-1]['tokens']} vs {sc['budgets'][0]['tokens']} tokens",
                         f"×{grow:.3f}", "does not grow", grow <= 1.05])
    dr = m.get("decode_reference", {})
    if isinstance(dr, dict) and dr.get("rows"):
        for path in ("plain", "static"):
            r = next((r for r in dr["rows"] if r["path"] == path and r["batch"] == 1), None)
            if r:
                rows.append([name, f"decode ms/step at batch 1 ({path}) ÷ roofline {dr['roofline_ms_per_step']:.2f} ms",
                             f"{r['ms_per_step']:.2f} ms = ×{r['x_roofline']:.2f}", "≤ ×2", r["x_roofline"] <= 2.0])
    cal = m.get("calibration")
    if isinstance(cal, dict) and cal.get("calibration"):
        c = cal["calibration"]
        rows.append([name, f"calibration {c['samples_used']}×{c['seq_len']} FP8 (stage)", f"{cal['seconds']:.1f} s", "< 60 s",
                     cal["seconds"] < 60])
    e2e = m.get("e2e")
    if isinstance(e2e, dict) and "wall_s" in e2e:
        rows.append([name, "end to end: run_gate, FP8, 3 gates, defaults, incl. reference", f"{e2e['wall_s']:.1f} s", "< 300 s",
                     e2e["wall_s"] < 300])
    return rows


def model_section(name: str, m: dict[str, Any]) -> list[str]:
    if "name" not in m:
        return [f"### {name}", "", f"failed: `{_err(m)}`", ""]
    lines = [f"### {name}: {m['name']}", "",
             f"{m['parameters'] / 1e9:.3f} B parameters, {m['dtype']}; weights read per decode step "
             f"{m['weight_bytes'] / 1e9:.3f} GB.", ""]
    if _err(m):
        lines += [f"stopped early: `{_err(m)}`", ""]
    sc = m.get("scoring")
    if _err(sc):
        lines += [f"scoring failed: `{_err(sc)}`", ""]
    elif sc:
        lines += ["Gate-1 teacher-forced scoring (reference + FP8 candidate), tokens through both models:", ""]
        lines += _table(["tokens", "chunks × ctx", "batch", "gate s", "plain forwards s", "gate tok/s", "plain tok/s",
                         "ratio", "peak GiB above models"],
                        [[b["tokens"], f"{b['chunks']}×{b['ctx']}", b["batch"], b["gate_s"], b["plain_s"], b["gate_tokens_per_s"],
                          b["plain_tokens_per_s"], f"{b['ratio']:.3f}",
                          None if b["peak_bytes_above_models"] is None else b["peak_bytes_above_models"] / 2**30]
                         for b in sc["budgets"]])
    for key, label in (("decode_reference", "reference"), ("decode_candidate", "FP8 fake-quant candidate")):
        d = m.get(key)
        if _err(d):
            lines += [f"decode ({label}) failed: `{_err(d)}`", ""]
        elif d:
            lines += [f"Greedy decode, {label} (roofline {d['roofline_ms_per_step']:.3f} ms/step):", ""]
            lines += _table(["path", "batch", "new tokens", "ms/step", "tokens/s", "× roofline"],
                            [[r["path"], r["batch"], r["new_tokens"], r["ms_per_step"], r["tokens_per_s"], f"{r['x_roofline']:.2f}"]
                             for r in d["rows"]])
            if d.get("decode_notes"):
                lines += [f"notes: {'; '.join(d['decode_notes'])}", ""]
    prof = m.get("profile")
    if _err(prof):
        lines += [f"profile failed: `{_err(prof)}`", ""]
    elif prof and "skipped" not in prof:
        lines += [f"Where a static decode step goes (reference, batch {prof['batch']}, profiler on; wall {prof['wall_ms_per_step']:.2f} ms/step, "
                  f"device busy {prof['device_busy_ms_per_step']:.2f} ms/step, roofline {prof['roofline_ms_per_step']:.2f} ms; "
                  f"matmuls stream the weights at {_f(prof['matmul_tb_per_s'])} TB/s):", ""]
        lines += _table(["kernel kind", "kernels per step", "device ms per step"],
                        [[k, v["kernels_per_step"], v["ms_per_step"]] for k, v in sorted(prof["by_kind"].items())])
    ident = m.get("identity")
    if _err(ident):
        lines += [f"identity check failed: `{_err(ident)}`", ""]
    elif ident:
        lines += ["Greedy tokens, static path vs plain path (reference):", ""]
        lines += _table(["batch", "new tokens", "rows identical", "first divergence per row"],
                        [[i["batch"], i["new_tokens"], f"{i['rows_identical']}/{i['rows']}", str(i["first_divergence"])] for i in ident])
    cal = m.get("calibration")
    if isinstance(cal, dict) and cal.get("calibration"):
        c = cal["calibration"]
        lines += [f"Calibration: {c['samples_used']} samples × {c['seq_len']} tokens, batch {c['batch_size']}: "
                  f"stage {cal['seconds']:.1f} s, of which `mtq.quantize` {cal.get('calibration_seconds', float('nan')):.1f} s.", ""]
    e2e = m.get("e2e")
    if isinstance(e2e, dict) and "wall_s" in e2e:
        st = e2e.get("stages") or {}
        lines += [f"End to end (`run_gate`, approved={e2e['approved']}): {e2e['wall_s']:.1f} s wall.", ""]
        lines += _table(["stage", "seconds", "cached"], [[k, v.get("seconds"), v.get("cached")] for k, v in st.items()])
        gd = e2e.get("gate_details", {})
        for g, d in gd.items():
            facts = {k: v for k, v in d.items() if v is not None}
            if facts:
                lines += [f"- {g}: {facts}"]
        lines += [""]
    return lines


def render(results: dict[str, Any]) -> str:
    env = results["env"]
    lines = ["<!-- bench:begin (generated by benchmarks/lib/report_md.py) -->",
             f"Machine: {env.get('gpu', env.get('host_cpu'))}"
             + (f" ({env.get('gpu_memory_gib')} GiB, sm {env.get('sm')}, {env.get('multiprocessors')} SMs, CUDA {env.get('cuda')})" if env.get("gpu") else "")
             + f"; python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
               f"nvidia-modelopt {env['nvidia-modelopt']}; {env['date']}" + ("; SMOKE run (toy shapes)" if results.get("smoke") else ""), ""]
    bw = results.get("bandwidth", {})
    mm = results.get("matmul", {})
    fp8 = results.get("fp8_kernel_build_s")
    lines += [f"Ceilings measured in this run: copy bandwidth {bw.get('tb_per_s', float('nan')):.2f} TB/s (read + write, "
              f"{bw.get('buffer_gib')} GiB buffer, median of {bw.get('reps')})"
              + (f"; bf16 {mm['n']}³ matmul {mm['tflops']:.0f} TFLOP/s" if isinstance(mm, dict) and "tflops" in mm else "")
              + (f"; ModelOpt FP8 kernel JIT build {fp8['seconds']:.1f} s (built={fp8['built']}), once per machine" if isinstance(fp8, dict) and "seconds" in fp8 else ""), ""]
    rows = []
    for name, m in results.get("models", {}).items():
        if isinstance(m, dict) and "name" in m:
            rows += targets(name, m)
    if rows:
        lines += ["Targets:", ""] + _table(["model", "target", "measured", "limit", "met"], rows)
    for name, m in results.get("models", {}).items():
        lines += model_section(name, m)
    lines.append("<!-- bench:end -->")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the tables of a results.json written by the suite's earlier runner (results/h200_[1-4]-*.json)
    import json
    import sys

    print(render(json.loads(open(sys.argv[1], encoding="utf-8").read())))

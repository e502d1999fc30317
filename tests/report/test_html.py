"""report.html: content and escaping, well-formed embedded SVG, and a real browser (Debian's headless
chromium) that renders the page and loads every image."""

from __future__ import annotations

import base64
import json
import re
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from html import escape
from pathlib import Path

import numpy as np
import pytest

from qval.diagnostics.scales import COLUMNS, rules_doc
from qval.gates.agreement.judge import summarize
from qval.report.html import render_html
from qval.verdict import CheckKey, GateResult, Threshold, decide

IMG = re.compile(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')


def sample_report() -> dict:
    """A report shaped like schema.build_report's, every section filled, built from real parts."""
    rng = np.random.default_rng(0)
    n = 2000
    kld = rng.lognormal(-5, 1.5, n)
    kld[:5] = 0.0
    arrays = {"kld": kld, "top1": rng.random(n) < 0.9, "p_ref": rng.random(n), "p_cand": rng.random(n),
              "nll_ref": rng.random(n), "nll_cand": rng.random(n)}
    agreement = summarize(arrays, {"chunks": 8, "ctx": 512, "scored_positions": n, "dataset": "heldout"}, 1.0)
    quality = GateResult("quality", "error", error="bleu_eval.jsonl: no such file")
    windows = [{"start": s, "end": s + 256, "top1": 0.9 - s / 1e4, "kld": 0.01 + s / 1e5, "ref_nll": 1.0, "cand_judge_nll": 1.1,
                "ref_seq_rep4": 0.05, "cand_seq_rep4": 0.05 + s / 2e4, "ref_distinct2": 0.9, "cand_distinct2": None,
                "ref_loops": 0, "cand_loops": 1 if s > 1000 else 0} for s in range(0, 2048, 256)]
    longgen = GateResult("longgen", "ok", details={"windows": windows})
    results = {"agreement": agreement, "quality": quality, "longgen": longgen}
    verdict = decide(results, [Threshold(CheckKey("agreement", "mean_kld"), "max", 0.001, "mean KLD(ref‖cand) per scored token, nats"),
                               Threshold(CheckKey("agreement", "top1"), "min", 0.5, "top-1 agreement")])
    rows = []
    for layer in range(4):
        for part in ("self_attn.q_proj", "mlp.down_proj"):
            for kind in ("weight", "input"):
                r = {c: None for c in COLUMNS}
                r.update(quantizer=f"model.layers.{layer}.{part}.{kind}_quantizer", unit=f"model.layers.{layer}", part=part,
                         kind=kind, format="INT8", granularity="per-tensor", groups=1, maxbound=127.0,
                         amax_max=2.0 + layer, scale_max=(2.0 + layer) / 127, sqnr_db=40.0 - layer * (kind == "weight"),
                         clipped=0.001 * layer if kind == "input" else 0.0, flushed=0.01, range_use=1.0,
                         outlier_ratio="inf" if layer == 3 else 3.0 + layer, flags="outlier" if layer == 3 else "")
                rows.append(r)
    sens = {"positions": 510, "chunks": 2, "ctx": 512, "base_nonfinite": 0,
            "base_kld": {"value": 0.05, "stderr": 0.002, "lo": 0.046, "hi": 0.054, "n": 510},
            "layers": [{"kind": "layer", "name": f"model.layers.{i}", "exclude": f"*model.layers.{i}.*", "quantizers": 4,
                        "kld_restored": 0.05 - d, "recovered": d / 0.05, "nonfinite_removed": 0,
                        "delta_kld": {"value": d, "stderr": 0.001, "lo": d - 0.002, "hi": d + 0.002, "n": 510}}
                       for i, d in ((2, 0.03), (0, 0.004), (1, 0.001), (3, -0.0005))],
            "parts": []}
    return {
        "name": "int8-sq", "description": "a <b>test</b> & <script>alert(1)</script>", "created": "2026-01-01T00:00:00+00:00",
        "verdict": verdict.to_dict(), "seconds": 12.5,
        "model": {"name": "SmolLM2", "fingerprint": "abc123", "compute_dtype": "float32", "device": "cpu", "notes": ["a note"]},
        "candidate": {"format": "int8_sq", "kv_cache": "fp16", "exclude": ["*lm_head*"], "engine": {"backend": "fakequant"}},
        "calibration": {"calibration": {"samples_used": 8, "seq_len": 256, "dataset": "general_mix"}, "quantizers_enabled": 16},
        "gates": {k: v.to_dict() for k, v in results.items()},
        "diagnostics": {"layers": rows, "rules": rules_doc(), "flagged": [r["quantizer"] for r in rows if r["flags"]],
                        "activation_batches": 2, "activation_tokens": 2048, "layers_csv": "layers.csv",
                        "weights": {"effective_bits": 10.1}, "sensitivity": sens},
        "fallback": {"approved": True, "explanation": "APPROVE after keeping 1 layer(s) in high precision (model.layers.2)",
                     "budget": {"max_excluded": 4, "max_effective_bits": None}, "config_file": "reports/int8-sq/fallback.yaml",
                     "alphas": [], "steps": [{"step": 1, "added": "model.layers.2", "delta_kld": {"value": 0.03},
                                              "cost": {"effective_bits": 10.5}, "approved": True, "failed": []}]},
        "stages": {"calibrate": {"cached": False, "seconds": 3.0}},
        "environment": {"versions": {"torch": "2.x"}, "device": {"cpu": "x86_64"}},
    }


def svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(base64.b64decode(b)) for b in IMG.findall(html)]


def test_verdict_first_checks_and_sections():
    r = sample_report()
    html = render_html(r)
    body = html[html.index("<body>"):]
    assert body.index("REJECT") < body.index("<h2>Checks</h2>") < body.index("Gate 1")
    assert html.count('<span class="fail">FAIL</span>') == r["verdict"]["failed_checks"] + 0  # one per failed check
    assert r["verdict"]["failed_checks"] == 2  # mean KLD over 0.001, and the quality gate's error
    for c in r["verdict"]["checks"]:
        assert escape(c["reason"]) in html
    for text in ("Gate 3", "Per-layer scale diagnostics", "Outlier rules", "Sensitivity ranking", "Fallback search",
                 "model.layers.2", "bleu_eval.jsonl: no such file", "layers.csv"):
        assert text in html, text
    for rule in rules_doc():
        assert rule["id"] in html
    assert "<script>" not in html and "&lt;script&gt;" in html  # the description is escaped, the page runs no code


def test_every_plot_is_an_embedded_well_formed_svg():
    html = render_html(sample_report())
    images = svgs(html)
    titles = [t.text for svg in images for t in svg.iter("{http://www.w3.org/2000/svg}text") if t.get("font-weight") == "bold"]
    assert "Per-position KLD(ref‖cand)" in titles
    assert "Weight SQNR by layer" in titles and "Activations clipped (|x| > amax) by layer" in titles
    assert any(t.startswith("Per-window kld") for t in titles) and any(t.startswith("Per-window seq_rep4") for t in titles)
    assert any(t.startswith("KLD removed, per decoder layer") for t in titles)
    assert "http://" not in re.sub(r'xmlns="http://www.w3.org/2000/svg"', "", html)  # nothing to fetch
    # the histogram draws one bar per non-empty bin
    hist = next(s for s in images if any(t.text == "Per-position KLD(ref‖cand)" for t in s.iter("{http://www.w3.org/2000/svg}text")))
    bars = [r for r in hist.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") != "#ffffff"]
    counts = sample_report()["gates"]["agreement"]["details"]["kld_histogram"]["counts"]
    assert len(bars) == len(counts)
    heights = [float(b.get("height")) for b in bars]
    assert heights.index(max(heights)) == counts.index(max(counts))


def test_partial_reports_render():
    r = sample_report()
    for key in ("diagnostics", "fallback", "calibration"):
        r.pop(key)
    r["gates"]["longgen"]["details"] = {}
    html = render_html(r)
    assert "No per-window series" in html and "Per-layer" not in html
    only = {"name": "d", "diagnostics": sample_report()["diagnostics"], "model": {}, "candidate": {}}
    assert "DIAGNOSTICS ONLY" in render_html(only)


# --- a real browser ---------------------------------------------------------------------------

CHECK = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images];
  const p = document.createElement('pre'); p.id = 'qval-check';
  p.textContent = JSON.stringify({images: imgs.length, loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    banner: getComputedStyle(document.querySelector('.verdict')).backgroundColor, width: document.body.scrollWidth});
  document.body.appendChild(p);
});</script>"""
BROKEN = '<img src="data:image/svg+xml;base64,bm90IGFuIHN2Zw==" alt="control">'  # "not an svg"


def run_chromium(chromium: str, tmp: Path, page: Path, *args: str) -> str:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={tmp / 'chromium-profile'}", *args, page.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def browser_check(chromium: str, tmp: Path, html: str, extra: str = "") -> dict:
    page = tmp / "checked.html"
    page.write_text(html.replace("</body>", extra + CHECK + "</body>"), encoding="utf-8")
    dom = run_chromium(chromium, tmp, page, "--virtual-time-budget=10000", "--dump-dom")
    m = re.search(r'<pre id="qval-check">(.*?)</pre>', dom, re.S)
    assert m, "the page did not finish loading in the browser"
    return json.loads(m.group(1).replace("&quot;", '"'))


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what chromium writes) into rows of pixels."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n = struct.unpack(">I", data[pos : pos + 4])[0]
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2,
                    4: a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else (b if abs(p - b) <= abs(p - c) else c)}[f]
            line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


def test_browser_renders_the_page_and_loads_every_image(chromium, tmp_path):
    html = render_html(sample_report())
    n_images = len(IMG.findall(html))
    assert n_images >= 10
    result = browser_check(chromium, tmp_path, html)
    assert result == {"images": n_images, "loaded": n_images, "banner": "rgb(198, 40, 40)", "width": result["width"]}
    assert result["width"] <= 1200  # the layout holds together, no runaway table
    # the check itself can fail: a broken image is reported as not loaded
    control = browser_check(chromium, tmp_path, html, BROKEN)
    assert control["images"] == n_images + 1 and control["loaded"] == n_images


def test_browser_screenshot_is_not_blank(chromium, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(sample_report()), encoding="utf-8")
    shot = tmp_path / "shot.png"
    run_chromium(chromium, tmp_path, page, "--window-size=1000,700", f"--screenshot={shot}")
    width, bpp, rows = png_pixels(shot)
    pixels = [row[i : i + 3] for row in rows for i in range(0, len(row), bpp)]
    red_banner = sum(1 for p in pixels if p == bytes((198, 40, 40)))  # the REJECT banner, #c62828
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert red_banner > 900 * 30  # a full-width banner, tens of pixels tall
    assert non_white / len(pixels) > 0.05 and len(set(pixels)) > 50  # text and plots, not one flat colour
    assert width == 1000

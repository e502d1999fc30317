"""The package's layers (issue 52): imports point down, from a layer to the ones below it, never back up.

`LAYERS` lists qval's layers bottom to top and names the modules of each (a name covers a module and,
for a package, every module under it; the longest name that matches wins). Every module of qval/ is in
exactly one layer, so a new module is placed deliberately.

An import *climbs back up* when a module imports one of a higher layer. They are counted from the source
(AST, the graph of tests/test_imports.py: every `import` / `from … import` at any scope, relative ones
resolved, a parent package's implicit `__init__` not counted), one per pair (importer, imported module)
however many statements write it. Each pair is classed by where its statements are: at module level
(`module`), only inside functions (`function`: runs when called), or only under `if TYPE_CHECKING:`
(`typing`: never runs). `UPWARD` lists the pairs allowed today, each with its kind and why it stays; the
test fails on a pair not listed (fix the import, or move the module) and on a listed one that is gone
(strike it). Counted this way on the tree before issue 52's layering (0b5ccbb): 9 pairs (7 module, 2 function):
the four config modules -> the engines' registry, report.schema -> the gates, snapshot/fill.py -> the gates,
report -> diagnostics.stage (layers.csv), metrics.tokens -> snapshot.compact, and quantize.formats ->
export.codecs (the decoders now live in quantize/codecs.py).

A gate is one package, `qval/gates/<name>/`, whose modules sit in the layers of what they do: its declaration
(`__init__`), `config` and `metrics` in config, `result` in measures, `judge` in judges, `section` in report and `run`
in gates (`GATE_PARTS`).

The second half runs Python: importing `qval.config`, `qval.judges` or `qval.report.schema` loads
no torch, no gate run module and no engine module (the last test says exactly which modules).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qval.gate_registry import PACKAGES
from tests.test_imports import module_names

ROOT = Path(__file__).resolve().parent.parent

#: each part's layer in every gate package (qval/gates/<name>/, registered in qval/gate_registry.py's PACKAGES); the
#: package's `__init__` (its declaration) is config's
GATE_PARTS = {"config": ("", ".config", ".metrics"), "measures": (".result",), "judges": (".judge",),
              "report": (".section",), "gates": (".run",)}


def _parts(layer: str) -> tuple[str, ...]:
    return tuple(f"qval.gates.{g}{p}" for g in PACKAGES for p in GATE_PARTS.get(layer, ()))


#: bottom to top: (layer, the modules in it)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("qval", "qval.errors", "qval.io", "qval.checksum", "qval.registry", "qval.progress",
                    "qval.shortfall", "qval.stages", "qval.data")),
    ("config", ("qval.config", "qval.config_base", "qval.config_gates", "qval.config_served", "qval.config_types",
                "qval.config_doc", "qval.backends", "qval.gate_metrics", "qval.gate_decl", "qval.gate_registry",
                "qval.quantize", "qval.quantize.formats", "qval.cost", *_parts("config"))),
    ("measures", ("qval.logits", "qval.metrics", "qval.results", *_parts("measures"))),
    ("judges", ("qval.verdict", "qval.judges", *_parts("judges"))),
    ("report", ("qval.report", *_parts("report"))),
    ("engines", ("qval.engines", "qval.models", "qval.model_location", "qval.model_files", "qval.devices",
                 "qval.placement", "qval.memory", "qval.determinism", "qval.environment", "qval.calibration",
                 "qval.quantize.modelopt_adapter", "qval.export")),
    ("store", ("qval.snapshot",)),
    ("gates", ("qval.gates", "qval.suites", "qval.reference", "qval.export.gate", "qval.diagnostics",
               *_parts("gates"))),
    ("pipeline", ("qval.pipeline", "qval.session", "qval.run_reference", "qval.preflight", "qval.diagnostics.stage", "qval.failures")),
    ("commands", ("qval.__main__", "qval.cli", "qval.sweep", "qval.ranking", "qval.parallel",
                  "qval.diagnostics.command", "qval.diagnostics.fallback", "qval.export.command")),
]

#: the imports allowed to climb, (importer, imported): (kind, why it stays); none today
UPWARD: dict[tuple[str, str], tuple[str, str]] = {}

#: the most pairs `UPWARD` may hold (issue 52: at most 12)
MAX_UPWARD = 12


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The index of the layer whose longest name covers the module, None when none does."""
    best, index = "", None
    for i, (_, names) in enumerate(layers):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > len(best):
                best, index = n, i
    return index


def _imports(root: Path, package: str):
    """(importer, imported, kind, file:line) for every import of one of the package's modules."""
    mods = module_names(root, package)
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            kind, p = "module", parent.get(node)
            while p is not None:
                if isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test) and kind == "module":
                    kind = "typing"
                if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    kind = "function"
                p = parent.get(p)
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                targets = [a.name for a in node.names]
            for t in targets:
                if t in mods and t != name:
                    yield name, t, kind, f"{path.relative_to(root)}:{node.lineno}"


def upward_imports(root: Path, package: str, layers=LAYERS) -> dict[tuple[str, str], tuple[str, list[str]]]:
    """Every pair whose importer sits in a lower layer than what it imports: (kind, where). A pair
    written at module level anywhere is `module`; else `function` if any statement is in a function."""
    rank = {"module": 0, "function": 1, "typing": 2}
    out: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for a, b, kind, where in _imports(root, package):
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if la is None or lb is None or la >= lb:
            continue
        k, ws = out.get((a, b), ("typing", []))
        out[(a, b)] = (min(k, kind, key=rank.__getitem__), ws + [where])
    return out


def unplaced(root: Path, package: str, layers=LAYERS) -> list[str]:
    return sorted(m for m in module_names(root, package) if layer_of(m, layers) is None)


def test_every_module_has_a_layer():
    assert unplaced(ROOT, "qval") == [], "place these modules in LAYERS (tests/test_layers.py)"


def test_no_import_climbs_back_up_but_the_listed_ones():
    found = upward_imports(ROOT, "qval")
    new = [f"{a} -> {b} ({k}: {', '.join(w)})" for (a, b), (k, w) in sorted(found.items()) if (a, b) not in UPWARD]
    assert not new, "imports climbing back up the layers (LAYERS):\n" + "\n".join(new)
    gone = sorted(set(UPWARD) - set(found))
    assert not gone, f"listed in UPWARD but no longer imported: strike them: {gone}"
    wrong = {p: (UPWARD[p][0], found[p][0]) for p in UPWARD if UPWARD[p][0] != found[p][0]}
    assert not wrong, f"listed with another kind (listed, found): {wrong}"


def test_the_allowed_climbs_stay_few():
    assert len(UPWARD) <= MAX_UPWARD, f"{len(UPWARD)} imports climb back up; at most {MAX_UPWARD}"


def test_the_count_sees_a_planted_climb(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import y\n",
        "pkg/mid.py": "from .low import x\n\ndef f():\n    from . import high\n",
        "pkg/high.py": "from . import low, mid\n",
        "pkg/sub/__init__.py": "from ..high import z\nimport pkg.high\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    layers = [("bottom", ("pkg", "pkg.low", "pkg.sub")), ("middle", ("pkg.mid",)), ("top", ("pkg.high",))]
    found = upward_imports(tmp_path, "pkg", layers)
    assert {p: k for p, (k, _) in found.items()} == {
        ("pkg.low", "pkg.high"): "typing", ("pkg.mid", "pkg.high"): "function", ("pkg.sub", "pkg.high"): "module"}
    assert found[("pkg.sub", "pkg.high")][1] == ["pkg/sub/__init__.py:1", "pkg/sub/__init__.py:2"]
    assert unplaced(tmp_path, "pkg", layers[1:]) == ["pkg", "pkg.low", "pkg.sub"]


def test_every_gate_package_is_registered():
    packages = sorted(p.parent.name for p in (ROOT / "qval" / "gates").glob("*/__init__.py"))
    assert sorted(PACKAGES) == packages, "register each gate package in qval/gate_registry.py's PACKAGES, in run order"


#: the layers the lower layers must not load: the engines and everything above them
ABOVE_THE_REPORT = [name for name, _ in LAYERS[[n for n, _ in LAYERS].index("engines"):]]


def loaded_too_high(modules: list[str], layers=LAYERS) -> list[str]:
    """torch's modules, and qval's modules of the engines' layer or above, except the package `qval.gates` itself."""
    high = {i for i, (name, _) in enumerate(layers) if name in ABOVE_THE_REPORT}
    return sorted(m for m in modules if m == "torch" or m.startswith("torch.")
                  or (m.startswith("qval.") and m != "qval.gates" and layer_of(m, layers) in high))


def test_the_lower_layers_check_sees_a_gate_run_module():
    assert loaded_too_high(["qval.gates", "qval.gates.depth", "qval.gates.depth.result", "qval.config"]) == []
    high = ["qval.gates.depth.run", "qval.gates.base", "qval.engines.hf", "torch", "qval.pipeline"]
    assert loaded_too_high(high) == sorted(high)


@pytest.mark.parametrize("module", ["qval.config", "qval.judges", "qval.report.schema"])
def test_the_lower_layers_load_no_torch_gate_or_engine(module):
    """`import qval.config`, `qval.judges` or `qval.report.schema` loads no torch, no engine module (`qval.engines.*`)
    and no gate: no module of the engines' layer or above in `LAYERS`, so no gate's run module (`qval.gates.<name>.run`,
    `qval.export.gate`) and none of the code the runs share (`qval.gates.base`, `qval.gates.teacher_forced`,
    `qval.gates.needles`), nor the store, the pipeline or a command. A gate's torch-free parts do load: its
    declaration (`qval.gates.<name>`, which loads the package `qval.gates`, empty until `GATES` is read), its
    `config` and `metrics`, and, below the report and the judges, its `result`, `judge` and `section`."""
    code = f"import sys, json, {module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert loaded_too_high(json.loads(out)) == [], f"import {module} loads these"

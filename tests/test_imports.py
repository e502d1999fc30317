"""The package's import graph: no cycle inside qval/, and config validation loads no engine (its layers: test_layers.py).

The graph is read from the source (AST), not from a run: every `import` and `from … import`
statement in every .py under qval/ counts, at module level, inside functions and under
`if TYPE_CHECKING:` alike. `from pkg import name` is an edge to `pkg.name` when that is a module
of the package, else to `pkg`; relative imports are resolved. Importing `a.b.c` also runs the
`__init__` of `a` and `a.b`; those implicit parent-package edges are not counted, so a package's
`__init__` may import (and re-export) its submodules as long as no submodule imports the package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under `root` (a folder holding `package/`), by dotted name."""
    out = {}
    for p in sorted((root / package).rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(root: Path, package: str) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """Edges between the package's modules, and for each edge where it is written (file:line)."""
    mods = module_names(root, package)
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[: len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    targets.append(sub if sub in mods else mod)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for t in targets:
                if t in mods and t != name:
                    graph[name].add(t)
                    where[(name, t)].append(f"{path.relative_to(root)}:{node.lineno}")
    return graph, where


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    nodes = sorted(set(graph) | {w for ws in graph.values() for w in ws})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def cycle_report(root: Path, package: str) -> str:
    """'' when the package has no import cycle, else each cycle's modules and edges with file:line."""
    graph, where = import_graph(root, package)
    lines = []
    for comp in cycles(graph):
        inside = set(comp)
        lines.append(f"import cycle of {len(comp)} modules: {', '.join(comp)}")
        for a in comp:
            for b in sorted(graph[a] & inside):
                lines.append(f"    {a} -> {b}   ({', '.join(where[(a, b)])})")
    return "\n".join(lines)


def test_no_import_cycle_inside_qval():
    report = cycle_report(ROOT, "qval")
    assert not report, "\n" + report


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def test_the_check_finds_a_planted_cycle(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import thing\n",
        "pkg/b.py": "def thing():\n    from pkg import c\n",  # inside a function: counts too
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",  # so does TYPE_CHECKING
        "pkg/sub/__init__.py": "from . import leaf\n",  # a package importing its submodule: no cycle
        "pkg/sub/leaf.py": "import os\nfrom ..a import thing\n",
        "pkg/d.py": "import pkg.e\n",
        "pkg/e.py": "from . import d\n",
    })
    report = cycle_report(tmp_path, "pkg")
    assert "import cycle of 3 modules: pkg.a, pkg.b, pkg.c" in report
    assert "pkg.b -> pkg.c   (pkg/b.py:2)" in report and "pkg.c -> pkg.a   (pkg/c.py:3)" in report
    assert "import cycle of 2 modules: pkg.d, pkg.e" in report and "pkg.d -> pkg.e   (pkg/d.py:1)" in report
    assert "pkg.sub" not in report


def test_the_check_passes_a_package_without_a_cycle(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from .base import Thing\nfrom . import impl\n",
        "pkg/base.py": "class Thing: ...\n",
        "pkg/impl.py": "from .base import Thing\n\ndef f():\n    from . import base\n",
    })
    assert cycle_report(tmp_path, "pkg") == ""


def test_config_validation_imports_no_engine():
    code = ("import sys, qval.config\n"
            "qval.config.load_config('checks/fp8_kvfp16.yaml')\n"
            "qval.config.parse_config({'name': 'x', 'quant': {'format': 'fp8'}, 'engine': {'backend': 'realquant'},\n"
            "                          'gates': {'agreement': {'min_top1': 0.5}}})\n"
            "print(sorted(m for m in sys.modules if m.startswith('qval.engines.')))\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]", out  # the backends' declarations are qval.backends, beside the config
    assert out[1] == "False", "importing and validating a config imports torch"

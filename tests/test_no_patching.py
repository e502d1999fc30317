"""No qval module assigns to an attribute of torch or transformers (issue 27): a fast path is qval's own
component, installed on the model instances it runs, never a patch of a library's classes, functions
or modules (which would change the host process and break silently on an upgrade).

An AST scan of every module under qval/. It flags:
- an assignment, augmented assignment or `del` whose target is an attribute or item reached from a
  name bound to torch or transformers (`import torch`, `from torch import nn`, `import
  transformers.integrations.sdpa_attention as sdpa`, `from transformers import X`, at any scope):
  `torch.nn.Linear.forward = f`, `sdpa.use_gqa_in_sdpa = f`, `ALL_ATTENTION_FUNCTIONS[k] = f`;
- any `setattr(...)` / `delattr(...)`: a dynamic target hides what is assigned (qval assigns its own
  objects' attributes directly);
- an assignment to `__class__` (swapping a library object's class), or to a model config's
  `_attn_implementation` (a model's attention is set through its public `set_attn_implementation`,
  on a model qval built: qval/engines/decode_attention.py);
- a call of `.register(...)` on a torch or transformers object, except the one registration of
  qval's own attention name (decode_attention.py), which adds a name and replaces nothing.

Two lists of exceptions, each entry checked to still exist: torch's documented process-wide
settings that deterministic mode sets (qval/determinism.py: they are torch's configuration API, not
code), and that one registration.
"""

from __future__ import annotations

import ast
from pathlib import Path

QVAL = Path(__file__).resolve().parents[1] / "qval"
LIBRARIES = ("torch", "transformers")

#: torch's documented settings, assigned by deterministic mode on a CUDA run (file, target)
SETTINGS = {
    ("determinism.py", "torch.utils.deterministic.fill_uninitialized_memory"),
    ("determinism.py", "torch.backends.cudnn.deterministic"),
    ("determinism.py", "torch.backends.cudnn.benchmark"),
    ("determinism.py", "torch.backends.cudnn.allow_tf32"),
    ("determinism.py", "torch.backends.cuda.matmul.allow_tf32"),
}
#: transformers' registries, given qval's attention under qval's own name (file, call)
REGISTRATIONS = {
    ("engines/decode_attention.py", "AttentionInterface.register"),
    ("engines/decode_attention.py", "AttentionMaskInterface.register"),
}


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` of an attribute chain (items shown as `[]`), None when it does not start at a name."""
    parts: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        parts.append(node.attr if isinstance(node, ast.Attribute) else "[]")
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def library_names(tree: ast.AST) -> set[str]:
    """Names a module binds to torch or transformers (or anything inside them), at any scope."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBRARIES:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in LIBRARIES:
            names.update(a.asname or a.name for a in node.names)
    return names


def findings(path: Path, rel: str) -> list[tuple[str, str, int]]:
    """(kind, target, line) of every flagged statement of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    libs = library_names(tree)
    out: list[tuple[str, str, int]] = []

    def target(t: ast.AST, line: int) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                target(e, line)
            return
        if not isinstance(t, (ast.Attribute, ast.Subscript)):
            return
        name = _dotted(t)
        if isinstance(t, ast.Attribute) and t.attr in ("__class__", "_attn_implementation", "_attn_implementation_internal"):
            out.append(("assigns", name or t.attr, line))
        elif name is not None and name.split(".")[0] in libs and (rel, name) not in SETTINGS:
            out.append(("assigns", name, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t, node.lineno)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and (not isinstance(node, ast.AnnAssign) or node.value is not None):
            target(node.target, node.lineno)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                target(t, node.lineno)
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in ("setattr", "delattr"):
                out.append((fn.id, ast.unparse(node.args[0]) if node.args else "?", node.lineno))
            elif isinstance(fn, ast.Attribute) and fn.attr == "register":
                name = _dotted(fn)
                if name is not None and name.split(".")[0] in libs and (rel, name) not in REGISTRATIONS:
                    out.append(("registers", name, node.lineno))
    return sorted(out, key=lambda hit: hit[2])


def scan() -> dict[str, list[tuple[str, str, int]]]:
    found = {}
    for path in sorted(QVAL.rglob("*.py")):
        rel = path.relative_to(QVAL).as_posix()
        if hits := findings(path, rel):
            found[rel] = hits
    return found


def test_no_module_assigns_to_torch_or_transformers():
    found = scan()
    assert not found, "qval patches a library (or hides a target behind setattr): " + "; ".join(
        f"qval/{rel}:{line} {kind} {name}" for rel, hits in found.items() for kind, name, line in hits)


def test_the_exceptions_still_exist():
    """A stale exception would let the next patch of that target through unseen."""
    seen_settings, seen_registrations = set(), set()
    for path in sorted(QVAL.rglob("*.py")):
        rel = path.relative_to(QVAL).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                seen_settings.update((rel, _dotted(t)) for t in node.targets)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                seen_registrations.add((rel, _dotted(node.func)))
    assert SETTINGS <= seen_settings, SETTINGS - seen_settings
    assert REGISTRATIONS <= seen_registrations, REGISTRATIONS - seen_registrations


def test_the_scan_catches_each_kind_of_patch(tmp_path):
    """The patterns the runtime used before issue 27, and the others the rule names, each caught."""
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\n"
        "import transformers.integrations.sdpa_attention as sdpa\n"
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS\n"
        "def f(owner, cfg, model, x):\n"
        "    from torch import nn\n"
        "    torch.nn.Linear.forward = f\n"
        "    nn.Linear.forward = f\n"
        "    sdpa.use_gqa_in_sdpa = f\n"
        "    ALL_ATTENTION_FUNCTIONS['x'] = f\n"
        "    setattr(owner, 'forward', f)\n"
        "    cfg._attn_implementation = 'x'\n"
        "    model.__class__ = int\n"
        "    torch.nn.Module.register = f\n"
        "    del sdpa.repeat_kv\n"
        "    x.forward = f\n"  # an instance of qval's: allowed
        "    model.set_attn_implementation('x')\n",  # the public API on a model: allowed
        encoding="utf-8")
    hits = findings(src, "m.py")
    assert [(k, n) for k, n, _ in hits] == [
        ("assigns", "torch.nn.Linear.forward"), ("assigns", "nn.Linear.forward"), ("assigns", "sdpa.use_gqa_in_sdpa"),
        ("assigns", "ALL_ATTENTION_FUNCTIONS.[]"), ("setattr", "owner"), ("assigns", "cfg._attn_implementation"),
        ("assigns", "model.__class__"), ("assigns", "torch.nn.Module.register"), ("assigns", "sdpa.repeat_kv")]

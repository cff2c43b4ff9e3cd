"""No import circles in `rlvr_jax`: the package's import graph has no strongly connected
component of more than one module; and the layers import downwards only (`LAYERS`).

The graph is read from the source with `ast` (nothing is imported). Its nodes are the modules
of the package, a package being its `__init__.py`. Every import statement is an edge — at
module level, inside functions and methods (lazy imports), and under `if TYPE_CHECKING:` (a
type-only dependency is still a dependency: it is what a lazy or type-only import hides) —
from the module holding it to the module it names:

- `import a.b.c` and `from a.b.c import name`, where `name` is not a submodule of `a.b.c`:
  an edge to `a.b.c` (a package: its `__init__.py`);
- `from a.b import c`, where `a.b.c` is a module: an edge to `a.b.c`;
- relative imports are resolved against the importing module's package first.

The packages a module sits in are not edges of their own: Python runs `a/__init__.py` before
`a.b`, but that is the interpreter's order, not a dependency `a.b` chose. So a package's
`__init__` importing its submodules is no circle, while a submodule importing its own package
back (`from rlvr_jax.x import f` in `rlvr_jax/x/y.py`, with `rlvr_jax/x/__init__.py` importing
`y`) is one: the edge y → `rlvr_jax.x` closes it. Imports of modules outside the package are
ignored.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rlvr_jax

ROOT = Path(rlvr_jax.__file__).resolve().parent
PACKAGE = "rlvr_jax"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an `ImportFrom` names (`from .x import y` → `<package>.x`)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `module` imports anywhere in its source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != module}


def graph(known: dict[str, Path] | None = None) -> dict[str, set[str]]:
    known = modules() if known is None else known
    return {m: imports(m, p, known) for m, p in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], edges: dict[str, set[str]]) -> str:
    inside = set(component)
    lines = [f"  {m} -> {', '.join(sorted(edges[m] & inside))}" for m in component]
    return "\n".join([f"circle of {len(component)} modules:", *lines])


LAYERS = [
    ("rlvr_jax.rollout.device", "rlvr_jax.rollout.host"),
    ("rlvr_jax.rollout.device", "rlvr_jax.rollout.backends"),
    ("rlvr_jax.rollout.host", "rlvr_jax.rollout.backends"),
    ("rlvr_jax.config", "rlvr_jax.training"),
]
"""(importer, imported): no module of the first package imports one of the second. The
rollout engine's device half is plain JAX that never sees the host half's bookkeeping, and
neither half depends on a backend; loading a config never imports the trainer."""


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def downward_violations(edges: dict[str, set[str]]) -> list[str]:
    """`importer -> imported` for every edge that breaks `LAYERS`."""
    return sorted(
        f"{m} -> {t}"
        for m, targets in edges.items()
        for t in targets
        for low, high in LAYERS
        if _within(m, low) and _within(t, high)
    )


def test_the_layers_import_downwards():
    edges = graph()
    assert not downward_violations(edges), "\n".join(downward_violations(edges))
    bad = {"rlvr_jax.rollout.device.x": {"rlvr_jax.rollout.host.y", "rlvr_jax.models"}}
    assert downward_violations(bad) == ["rlvr_jax.rollout.device.x -> rlvr_jax.rollout.host.y"]
    # the rules see the packages they name (a renamed package would pass them vacuously)
    for low, high in LAYERS:
        assert any(_within(m, low) for m in edges) and any(_within(m, high) for m in edges)


def test_the_package_has_no_import_circles():
    edges = graph()
    found = circles(edges)
    assert not found, "\n".join(describe(c, edges) for c in found)


def test_the_graph_sees_lazy_imports_and_package_back_edges(tmp_path):
    # a package whose __init__ imports a submodule that lazily imports the package back, and
    # a pair of modules importing each other relatively: two circles; a plain subpackage
    # import from the package's __init__ is none
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import f\nfrom pkg import sub\n")
    (pkg / "a.py").write_text("def f():\n    from pkg import g\n    return g\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "x.py").write_text("from . import y\n")
    (pkg / "sub" / "y.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from .x import T\n")  # fmt: skip
    known = modules(pkg, "pkg")
    edges = {m: imports(m, p, known) for m, p in known.items()}
    assert edges["pkg"] == {"pkg.a", "pkg.sub"}
    assert edges["pkg.sub.x"] == {"pkg.sub.y"}
    assert circles(edges) == [["pkg", "pkg.a"], ["pkg.sub.x", "pkg.sub.y"]]

"""No config key is silently ignored: every field of the schema is read somewhere in the
package (or is marked dry-run-only, read by the memory plan alone).

Reads are found statically in the package's source: an attribute `X.key` where X is known to
be the key's section — reached through the section's field name (`cfg.rollout.backend`), a
variable assigned from one (`r = cfg.rollout; r.backend`), a parameter annotated with the
section's class (`def f(sft: SFTConfig)`), or the loop variable over a list of sections
(`for src in cfg.data.sources: src.path`) — and whole-section reads (`dataclasses.fields`,
`dataclasses.asdict`, `to_dict`, `vars` of a section). A new key that nothing reads fails here
with its dotted name.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from rlvr_jax.config import schema

PACKAGE = Path(schema.__file__).resolve().parents[1]
SKIPPED = {PACKAGE / "config" / "schema.py", PACKAGE / "config" / "loader.py"}
WHOLE_SECTION_CALLS = {"fields", "asdict", "to_dict", "vars", "astuple"}


def sections() -> dict[str, type]:
    """Every config dataclass of the schema by class name."""
    return {
        name: cls
        for name, cls in vars(schema).items()
        if isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and cls.__module__ == schema.__name__
    }


def field_types() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(field name → section classes it holds, field name → classes held in a list by it)."""
    single: dict[str, set[str]] = {}
    listed: dict[str, set[str]] = {}
    for cls in sections().values():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                single.setdefault(f.name, set()).add(tp.__name__)
            for arg in typing.get_args(tp):
                if dataclasses.is_dataclass(arg):
                    listed.setdefault(f.name, set()).add(arg.__name__)
    return single, listed


def all_keys() -> dict[tuple[str, str], str]:
    """(class, field) → its dotted name from the root `Config` (first path found)."""
    out: dict[tuple[str, str], str] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            out.setdefault((cls.__name__, f.name), key)
            tp = hints[f.name]
            inner = [tp, *typing.get_args(tp)]
            for t in inner:
                if dataclasses.is_dataclass(t) and (t.__name__, "") not in out:
                    out[(t.__name__, "")] = key
                    walk(t, f"{key}.")

    walk(schema.Config, "")
    return {k: v for k, v in out.items() if k[1]}


class Reads(ast.NodeVisitor):
    """Collects (section class, field) pairs read in one module."""

    def __init__(self, single: dict[str, set[str]], listed: dict[str, set[str]]) -> None:
        self.single, self.listed = single, listed
        self.names = set(sections())
        self.reads: set[tuple[str, str]] = set()
        self.whole: set[str] = set()
        self.aliases: dict[str, set[str]] = {}

    def types_of(self, node: ast.AST) -> set[str]:
        """The section classes an expression may evaluate to (`cfg` is the package's name for
        the root `Config`)."""
        if isinstance(node, ast.Attribute):
            own = self.aliases.get(_dotted(node), set())
            root = {"Config"} if node.attr == "cfg" else set()
            return own | root | self.single.get(node.attr, set())
        if isinstance(node, ast.Name):
            root = {"Config"} if node.id == "cfg" else set()
            return root | self.aliases.get(node.id, set())
        if isinstance(node, ast.Subscript | ast.Starred):
            return self.types_of(node.value)
        if isinstance(node, ast.IfExp):
            return self.types_of(node.body) | self.types_of(node.orelse)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.types_of(v) for v in node.values))
        if isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] in self.names:
            return {_dotted(node.func).split(".")[-1]}
        return set()

    def annotation_types(self, node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.names} | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in self.names
        }

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            found = self.annotation_types(a.annotation)
            if found:
                self.aliases.setdefault(a.arg, set()).update(found)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        found = self.types_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name | ast.Attribute) and found:
                self.aliases.setdefault(_dotted(target), set()).update(found)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        found = self.annotation_types(node.annotation) | (
            self.types_of(node.value) if node.value else set()
        )
        if isinstance(node.target, ast.Name) and found:
            self.aliases.setdefault(node.target.id, set()).update(found)
        self.generic_visit(node)

    def _iterated(self, target: ast.AST, it: ast.AST) -> None:
        held = self.listed.get(it.attr, set()) if isinstance(it, ast.Attribute) else set()
        if isinstance(target, ast.Name) and held:
            self.aliases.setdefault(target.id, set()).update(held)

    def visit_For(self, node: ast.For) -> None:
        self._iterated(node.target, node.iter)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._iterated(node.target, node.iter)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        for cls in self.types_of(node.value):
            self.reads.add((cls, node.attr))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
        if name in WHOLE_SECTION_CALLS and node.args:
            self.whole.update(self.types_of(node.args[0]))
        if name == "getattr" and len(node.args) >= 2:
            key = node.args[1]
            for cls in self.types_of(node.args[0]):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    self.reads.add((cls, key.value))
                else:
                    self.whole.add(cls)
        self.generic_visit(node)


def _dotted(node: ast.AST) -> str:
    """`a.b.c` of a Name/Attribute chain ('' for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def package_reads() -> tuple[set[tuple[str, str]], set[str]]:
    single, listed = field_types()
    reads: set[tuple[str, str]] = set()
    whole: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in SKIPPED:
            continue
        visitor = Reads(single, listed)
        visitor.visit(ast.parse(path.read_text(), filename=str(path)))
        # a second pass sees aliases assigned after their first use in the file
        second = Reads(single, listed)
        second.aliases = visitor.aliases
        second.visit(ast.parse(path.read_text(), filename=str(path)))
        reads |= visitor.reads | second.reads
        whole |= visitor.whole | second.whole
    return reads, whole


def dry_run_only(cls_name: str, field_name: str) -> bool:
    cls = sections()[cls_name]
    f = {f.name: f for f in dataclasses.fields(cls)}[field_name]
    return bool(f.metadata.get("dry_run_only"))


@pytest.mark.slow
def test_every_config_key_is_read_somewhere():
    reads, whole = package_reads()
    # a section is read when any of its keys is
    section_fields = {
        (owner, name)
        for (owner, name), _ in all_keys().items()
        if dataclasses.is_dataclass(typing.get_type_hints(sections()[owner])[name])
    }
    for owner, name in section_fields:
        child = typing.get_type_hints(sections()[owner])[name].__name__
        if child in whole or any(cls == child for cls, _ in reads):
            reads.add((owner, name))
    unread = [
        dotted
        for (cls, name), dotted in sorted(all_keys().items(), key=lambda kv: kv[1])
        if (cls, name) not in reads and cls not in whole and not dry_run_only(cls, name)
    ]
    assert not unread, f"config keys that nothing in rlvr_jax reads: {unread}"


def test_the_walk_catches_an_unread_key():
    # the check itself can fail: a key with a name no code uses is reported
    single, listed = field_types()
    visitor = Reads(single, listed)
    visitor.visit(ast.parse("def f(cfg):\n    return cfg.rollout.max_slots\n"))
    assert ("RolloutConfig", "max_slots") in visitor.reads
    assert ("RolloutConfig", "no_such_key_xyz") not in visitor.reads
    visitor.visit(ast.parse("def g(r: RolloutConfig):\n    return r.decode_chunk\n"))
    assert ("RolloutConfig", "decode_chunk") in visitor.reads
    visitor.visit(ast.parse("for s in cfg.data.sources:\n    s.weight\n"))
    assert ("SourceConfig", "weight") in visitor.reads

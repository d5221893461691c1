"""The package's layout holds: no import cycles, the core never imports Celery,
and the Celery-side modules stay small.  Read from the source (ast), not by importing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "celery_redislock"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, at run time (TYPE_CHECKING
    blocks left out); deferred imports inside functions count too."""
    tree = ast.parse(path.read_text("utf-8"))
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - node.level + 1]
                target = ".".join(prefix + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            found.update(subs if len(subs) == len(node.names) else [target, *subs])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known and m != name}


def test_no_import_cycles() -> None:
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", ["primitives", "transport"])
def test_the_core_never_imports_celery_or_the_upper_layers(layer: str) -> None:
    known = modules()
    upper = ("celery_redislock.tasks", "celery_redislock.unique", "celery_redislock.ops")
    for name, path in known.items():
        if not name.startswith(f"celery_redislock.{layer}"):
            continue
        text = path.read_text("utf-8")
        assert "import celery" not in text and "from celery" not in text, name
        assert not [m for m in imports_of(name, path, known) if m.startswith(upper)], name


def test_importing_the_primitives_leaves_celery_unimported() -> None:
    code = (
        "import sys, celery_redislock\n"
        "from celery_redislock import Lock, Semaphore, ReadWriteLock, AlreadyQueued\n"
        "from celery_redislock.primitives import unique\n"
        "print(sorted(m for m in ('celery', 'kombu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("layer", ["tasks", "unique", "ops", "compat", "testing", "demo"])
def test_the_upper_layers_never_import_a_private_module_of_another_layer(layer: str) -> None:
    """A layer's ``_name`` modules are its own: what another layer needs has a public name."""
    known = modules()
    found = {}
    for name, path in known.items():
        if not name.startswith(f"celery_redislock.{layer}"):
            continue
        private = [
            m
            for m in imports_of(name, path, known)
            if m.count(".") >= 2
            and m.rsplit(".", 1)[1].startswith("_")
            and not m.startswith(f"celery_redislock.{layer}.")
        ]
        if private:
            found[name] = private
    assert found == {}


@pytest.mark.parametrize("layer", ["tasks", "unique", "ops", "primitives"])
def test_modules_stay_small(layer: str) -> None:
    sizes = {
        path.name: len(path.read_text("utf-8").splitlines())
        for path in (PACKAGE / layer).glob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 400} == {}

"""The import graph of the package flows one way.

A static scan of loader/ (every `import` and `from ... import`, at any depth, including
those under `if TYPE_CHECKING:` and inside functions) finds each module's imports of other
gfxasm modules; then:
  * no op module (gfxasm.ops.*) imports a command-line module (gfxasm.cli, *_cli, perf.cli);
  * the graph has no cycle;
  * collapsed to the package's top-level parts (gfxasm.emu, gfxasm.perf, gfxasm.ops, ...;
    the root package's own __init__ left out: it is the surface that imports the layers),
    the graph has no cycle either: in particular the emulator (gfxasm.emu) imports nothing
    of the timing model (gfxasm.perf), which is built on it (the timed schedule lives in
    perf and registers itself with the emulator);
and, importing every module in a fresh interpreter, no module is shadowed by an attribute
of the same name in its package (e.g. `gfxasm.launch` the function hiding a module).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

LOADER = Path(__file__).resolve().parent.parent / "loader"
PACKAGE = "gfxasm"


def module_name(path: Path) -> str:
    parts = path.relative_to(LOADER).with_suffix("").parts
    return ".".join((PACKAGE,) + (parts[:-1] if parts[-1] == "__init__" else parts))


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in LOADER.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """gfxasm modules that `path` imports (a `from package import name` counts the submodule
    when there is one, else the package)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:      # `import gfxasm.emu.x as y` -> the module itself
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def is_cli(name: str) -> bool:
    return name == f"{PACKAGE}.cli" or name.endswith("_cli") or name.endswith(".cli")


def test_ops_do_not_import_the_command_line():
    bad = {name: sorted(filter(is_cli, targets)) for name, targets in graph().items()
           if name.startswith(f"{PACKAGE}.ops") and any(map(is_cli, targets))}
    assert not bad, f"op modules importing CLI modules: {bad}"


def test_no_import_cycle():
    edges = graph()
    # A package's __init__ importing its own submodules (to export or register them) is
    # the package's surface, not a layer: leave those edges out.
    edges = {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in edges.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph `edges` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}                      # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def layer(name: str) -> str:
    """gfxasm.emu.kernel -> gfxasm.emu: the top-level part of the package a module is in."""
    return ".".join(name.split(".")[:2])


def layer_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, targets in graph().items():
        if name == PACKAGE:
            continue
        edges.setdefault(layer(name), set()).update(layer(t) for t in targets if layer(t) != layer(name))
    return edges


def test_layers_form_no_cycle():
    cycle = find_cycle(layer_graph())
    assert cycle is None, "package layers import each other: " + " -> ".join(cycle)


def test_the_emulator_does_not_import_the_timing_model():
    edges = graph()
    bad = {name: sorted(t for t in targets if t.startswith(f"{PACKAGE}.perf"))
           for name, targets in edges.items() if name.startswith(f"{PACKAGE}.emu")}
    assert not any(bad.values()), f"emulator modules importing gfxasm.perf: {bad}"
    # and the arrow the other way is real (the scan is not blind to it)
    assert f"{PACKAGE}.emu" in layer_graph()[f"{PACKAGE}.perf"]


def test_the_layer_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_scan_sees_imports():
    """The scan is not blind: known edges of today's tree are found."""
    edges = graph()
    assert f"{PACKAGE}.runcases" in edges[f"{PACKAGE}.ops.fmha"]
    assert f"{PACKAGE}.launcher" in edges[f"{PACKAGE}.ops.mxfp8_gemm"]
    assert f"{PACKAGE}.manifest" in edges[f"{PACKAGE}.codegen"]          # under TYPE_CHECKING
    assert f"{PACKAGE}.runcases" in edges[f"{PACKAGE}.cli"]


SHADOW_PROBE = """
import importlib, json, sys
names = json.loads(sys.argv[1])
for name in names:
    importlib.import_module(name)
shadowed = []
for name in names:
    parent, _, leaf = name.rpartition(".")
    if parent and getattr(sys.modules[parent], leaf, None) is not sys.modules[name]:
        shadowed.append(f"{name} is hidden by {type(getattr(sys.modules[parent], leaf, None)).__name__} "
                        f"{parent}.{leaf}")
print(json.dumps(shadowed))
"""


def test_no_module_is_shadowed_by_a_function():
    names = sorted(n for n in modules() if not n.endswith("__main__"))
    done = subprocess.run([sys.executable, "-c", SHADOW_PROBE, json.dumps(names)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []

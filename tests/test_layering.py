"""The import graph of the package flows one way.

A static scan of loader/ (every `import` and `from ... import`, at any depth, including
those under `if TYPE_CHECKING:` and inside functions) finds each module's imports of other
gfxasm modules; then:
  * no op module (gfxasm.ops.*) imports a command-line module (gfxasm.cli, *_cli, perf.cli);
  * the graph has no cycle;
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
    state: dict[str, int] = {}                      # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


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

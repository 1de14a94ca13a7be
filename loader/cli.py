"""The `gfxasm` command line.

    gfxasm build [--force] [--install-llvm]  assemble every variant into build/<variant>.co, then check it
    gfxasm list                     kernels, variants, arguments
    gfxasm check                    every built .co against the manifest
    gfxasm run KERNEL | --all       random inputs → emulator → compare with the reference
    gfxasm dis KERNEL               disassemble a built variant
    gfxasm corpus fetch | coverage  the pinned aiter corpus (gfxasm.corpus_cli)
    gfxasm stats | bench ...        gfxasm.perf's commands (they parse their own arguments)

These commands take --manifest/-m (repeatable; default: kernels.yaml of this checkout).
A subcommand is one entry of COMMANDS: a function registered with @command (its name, a
help line, a function adding its options), or one implemented elsewhere, by delegate().

`gfxasm run` needs a reference for each kernel: a factory registered with @run_case
(gfxasm.runcases) that makes fresh inputs and the expected outputs (RunCase). Op modules
register theirs when gfxasm.ops is imported; a manifest may also name a cases file (its
`cases` field).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .manifest import DEFAULT_MANIFEST, Manifest, ManifestError, Variant
from .runcases import RUN_CASES, RunCase, run_case  # noqa: F401  (run-case files import them from here too)


# --- `gfxasm run` references (registered in gfxasm.runcases) ----------------------------

@functools.lru_cache(maxsize=None)
def load_cases(path: Path) -> None:
    """Execute a manifest's cases file once, so that its @run_case registrations happen."""
    spec = importlib.util.spec_from_file_location(f"gfxasm_cases_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load run cases from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def load_all_cases(manifest: Manifest) -> None:
    importlib.import_module("gfxasm.ops")
    if manifest.cases is not None:
        load_cases(manifest.cases)


def compare(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> tuple[float, int]:
    """(largest absolute error where a finite value is expected, number of elements off).

    "Off" is torch.isclose with equal_nan=True — the criterion of torch.testing.assert_close
    with equal_nan — so a NaN poison left where the kernel had to write is off, and one that
    had to survive (bytes the kernel must not touch) is not.
    """
    actual, expected = actual.double(), expected.double()
    off = ~torch.isclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True)
    finite = torch.isfinite(expected)
    errors = (actual[finite] - expected[finite]).abs()
    largest = errors.nan_to_num(nan=float("inf")).max().item() if errors.numel() else 0.0
    return largest, int(off.sum())


# --- commands ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    help: str
    # Returns the exit status. Takes the parsed namespace — or, when `options` is None, the
    # raw argument list: such a command parses its own arguments (and its own --help).
    run: Callable[[Any], int]
    options: Callable[[argparse.ArgumentParser], None] | None   # adds the command's options


COMMANDS: dict[str, Command] = {}


def _no_options(parser: argparse.ArgumentParser) -> None:
    pass


def command(name: str, help: str, options: Callable[[argparse.ArgumentParser], None] = _no_options):
    def register(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = Command(help, run, options)
        return run
    return register


def delegate(name: str, help: str, module: str, function: str) -> None:
    """A command implemented elsewhere as function(argv) -> status, imported when used."""
    COMMANDS[name] = Command(help, lambda argv: getattr(importlib.import_module(module), function)(argv), None)


def shown(path: Path) -> str:
    """A path as short as it can be said from the current directory."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def _kernel_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", help="kernel name from the manifest")
    parser.add_argument("--variant", help="variant (needed when the kernel has several)")


def _find_kernel(manifests: list[Manifest], kernel: str):
    for manifest in manifests:
        if kernel in manifest.kernels:
            return manifest.kernels[kernel]
    names = ", ".join(k for m in manifests for k in m.kernels) or "none"
    raise ValueError(f"no kernel '{kernel}' in {', '.join(shown(m.path) for m in manifests)} (kernels: {names})")


def _find_variant(manifests: list[Manifest], kernel: str, variant: str | None) -> Variant:
    return _find_kernel(manifests, kernel).variant(variant)


def _build_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--install-llvm", action="store_true",
                        help="install clang-22 lld-22 llvm-22 with apt-get (as root) when LLVM is missing")


@command("build", "assemble every kernel variant into <build_dir>/<variant>.co and check it", _build_options)
def cmd_build(ns: argparse.Namespace) -> int:
    from .build import build_manifest
    for manifest in ns.manifests:
        results = build_manifest(manifest, force=ns.force, install_llvm=ns.install_llvm)
        for result in results:
            if result.assembled:
                print(f"assembled {shown(result.variant.kernel.source)} → {shown(result.co_path)}")
        fresh = sum(r.assembled for r in results)
        print(f"{shown(manifest.path)}: {len(results)} variants ({fresh} assembled, {len(results) - fresh} "
              f"up to date), all match the manifest")
    return 0


@command("list", "list kernels, their variants and arguments")
def cmd_list(ns: argparse.Namespace) -> int:
    for manifest in ns.manifests:
        print(f"{shown(manifest.path)}:{'' if manifest.kernels else ' no kernels'}")
        for kernel in manifest.kernels.values():
            x, y, z = kernel.workgroup
            print(f"  {kernel.name}: {kernel.description}")
            print(f"    source {shown(kernel.source)}, symbol {kernel.symbol}, workgroup {x}x{y}x{z}, "
                  f"LDS {kernel.lds_bytes} B, grid [{', '.join(e.text for e in kernel.grid)}]")
            for variant in kernel.variants.values():
                defines = ", ".join(f"{k}={v}" for k, v in variant.defines.items()) or "no defines"
                print(f"    variant {variant.name} ({defines}), kernarg {variant.kernarg_size} B:")
                for arg in variant.args:
                    print(f"      @{arg.offset:<4} {arg.describe()}")
    return 0


@command("check", "check every built .co against the manifest")
def cmd_check(ns: argparse.Namespace) -> int:
    from .check import verify
    problems = []
    for manifest in ns.manifests:
        variants = list(manifest.variants())
        for variant in variants:
            if variant.co_path.is_file():
                problems += verify(variant.co_path, variant)
            else:
                problems.append(f"{shown(variant.co_path)} is not built ({manifest.build_hint})")
        print(f"{shown(manifest.path)}: {len(variants)} variants checked")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", nargs="?", help="kernel name from the manifest")
    parser.add_argument("--variant", help="only this variant (default: all of the kernel's)")
    parser.add_argument("--all", action="store_true", help="every kernel of the manifests")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def _run_one(variant: Variant, seed: int) -> bool:
    from .launcher import launch
    factory = RUN_CASES.get(variant.kernel.name)
    if factory is None:
        print(f"{variant.name:<24} FAIL  no reference registered (gfxasm.runcases.run_case)")
        return False
    case = factory(variant, torch.Generator().manual_seed(seed))
    started = time.perf_counter()
    try:
        result = launch(variant.kernel, variant=variant.name, **case.args)
    except Exception as exc:   # reported, and the exit status says so; the other kernels still run
        print(f"{variant.name:<24} FAIL  {type(exc).__name__}: {exc}")
        return False
    seconds = time.perf_counter() - started
    instructions = getattr(result, "wave_instructions", "-")
    ok = True
    for name, expected in case.expected.items():
        largest, off = compare(case.args[name], expected, case.atol, case.rtol)
        ok &= off == 0
        print(f"{variant.name:<24} {'ok  ' if off == 0 else 'FAIL'}  {name}: max|err| {largest:.3g}, "
              f"{off}/{expected.numel()} off (atol {case.atol:.3g}, rtol {case.rtol:.3g})  "
              f"{instructions} wave-instructions  {seconds:.2f} s  {case.note}")
    return ok


@command("run", "run kernels on the emulator against their references", _run_options)
def cmd_run(ns: argparse.Namespace) -> int:
    from .build import build_manifest
    if ns.all == (ns.kernel is not None):
        raise ValueError("name a KERNEL or pass --all")
    for manifest in ns.manifests:
        build_manifest(manifest)
        load_all_cases(manifest)
    if ns.all:
        variants = [v for m in ns.manifests for v in m.variants()]
        if not variants:
            print("no kernels in " + ", ".join(shown(m.path) for m in ns.manifests))
    else:
        variants = ([_find_variant(ns.manifests, ns.kernel, ns.variant)] if ns.variant
                    else list(_find_kernel(ns.manifests, ns.kernel).variants.values()))
    results = [_run_one(variant, ns.seed) for variant in variants]
    return 0 if all(results) else 1


@command("dis", "disassemble a built kernel variant", _kernel_options)
def cmd_dis(ns: argparse.Namespace) -> int:
    from .toolchain import find_tool
    variant = _find_variant(ns.manifests, ns.kernel, ns.variant)
    if not variant.co_path.is_file():
        raise FileNotFoundError(f"{shown(variant.co_path)} is not built: {variant.kernel.manifest.build_hint}")
    return subprocess.run([find_tool("llvm-objdump"), "-d", "--mcpu=gfx950", str(variant.co_path)]).returncode


delegate("corpus", "the pinned aiter corpus of hardware-proven gfx950 code objects: fetch, coverage",
         "gfxasm.corpus_cli", "corpus_main")
delegate("stats", "static analysis of gfx950 code objects (gfxasm stats FILE.co --help)",
         "gfxasm.perf.cli", "stats_main")
delegate("bench", "benchmark every kernel in bench/ (measured on a gfx950, modelled elsewhere)",
         "gfxasm.perf.cli", "bench_main")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS and COMMANDS[argv[0]].options is None:
        return COMMANDS[argv[0]].run(argv[1:])
    parser = argparse.ArgumentParser(prog="gfxasm", description="gfx950 assembly kernels: build, check, run")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        sub = subparsers.add_parser(name, help=cmd.help, description=cmd.help)
        if cmd.options is not None:
            sub.add_argument("-m", "--manifest", action="append", type=Path,
                             help=f"manifest file (repeatable; default {shown(DEFAULT_MANIFEST)})")
            cmd.options(sub)
    ns = parser.parse_args(argv)
    from .build import BuildError
    from .toolchain import ToolchainError
    try:
        ns.manifests = [Manifest.load(path) for path in ns.manifest or [DEFAULT_MANIFEST]]
        return COMMANDS[ns.command].run(ns)
    except (ManifestError, BuildError, ToolchainError, FileNotFoundError, ValueError) as exc:
        print(f"gfxasm {ns.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

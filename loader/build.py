"""Assemble every kernel variant of a manifest into <build_dir>/<variant>.co.

Per variant, in two passes over one generated file, build/gen/<variant>.s:

1. the code part (codegen.code_part: manifest symbols, then `.include` of the kernel
   source) goes through `llvm-mc -filetype=asm`, which reports assembler errors with
   file:line, and prints the code back with macros expanded and symbols resolved. From
   that listing come the register counts and the MUBUF offset scan.
2. the descriptor part (kernel descriptor and metadata, with those counts) is appended
   and clang assembles and links the whole into the `.co`, which is then checked
   against the manifest.

A variant is rebuilt only when the hash of its inputs changed: the code part, the
manifest entry, the kernel source and every file it includes, the generator, and the
toolchain.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from . import check, codegen
from .manifest import Manifest, Variant, default_manifest
from .toolchain import ToolchainError, find_tool

_INCLUDE = re.compile(r'^\s*\.include\s+"([^"]+)"', re.MULTILINE)
_SET = re.compile(r"^\.set\s+(\S+),\s*(-?\d+)\s*$", re.MULTILINE)
_AGPR = re.compile(r"\ba\[(\d+):(\d+)\]|\ba(\d+)\b")
APT_PACKAGES = ("clang-22", "lld-22", "llvm-22")


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    clang: str
    llvm_mc: str
    ld_lld: str
    version: str

    @classmethod
    def find(cls) -> "Toolchain":
        clang = find_tool("clang")
        version = subprocess.run([clang, "--version"], capture_output=True, text=True, check=True).stdout
        return cls(clang, find_tool("llvm-mc"), find_tool("ld.lld"), version)


def ensure_toolchain(install: bool = False) -> Toolchain:
    """The LLVM tools; when missing and `install` (gfxasm build --install-llvm), installed with
    apt-get, which needs root on Debian/Ubuntu. Nothing is installed unless asked."""
    try:
        return Toolchain.find()
    except ToolchainError as missing:
        if not install:
            raise BuildError(f"{missing} (or pass --install-llvm to gfxasm build / ./build.sh)") from None
        refusal = _install_refusal()
        if refusal:
            raise BuildError(f"{missing}; --install-llvm cannot install it: {refusal}") from None
    print(f"gfxasm build: LLVM not found; installing {' '.join(APT_PACKAGES)} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", *APT_PACKAGES]):
        if subprocess.run(command, env=env, stdin=subprocess.DEVNULL).returncode != 0:
            raise BuildError(f"'{' '.join(command)}' failed; install LLVM >= 20 or set LLVM_BIN")
    find_tool.cache_clear()
    try:
        return Toolchain.find()
    except ToolchainError as still_missing:
        raise BuildError(str(still_missing)) from None


def _install_refusal() -> str | None:
    """Why apt-get cannot install LLVM here, or None when it can."""
    if os.environ.get("LLVM_BIN"):
        return "LLVM_BIN is set (it names the tools to use)"
    if not shutil.which("apt-get"):
        return "apt-get not found"
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return "apt-get needs root"
    return None


@dataclass
class Listing:
    """The assembler's listing of a code part: one instruction per line, symbols resolved."""
    text: str

    @functools.cached_property
    def instructions(self) -> list[str]:
        lines = (line.split(";", 1)[0].strip() for line in self.text.splitlines())
        return [line for line in lines if line and not line.startswith(".") and not line.endswith(":")]

    def register_counts(self) -> codegen.RegisterCounts:
        symbols = dict(_SET.findall(self.text))
        vgprs, sgprs = (int(symbols[codegen.COUNT_SYMBOLS[kind]]) for kind in ("vgprs", "sgprs"))
        # The assembler tracks VGPRs and SGPRs but not AGPRs: take the highest a-register named.
        agprs = 0
        for instruction in self.instructions:
            for _, last, single in _AGPR.findall(instruction):
                agprs = max(agprs, int(last or single) + 1)
        return codegen.RegisterCounts(vgprs=vgprs, sgprs=sgprs, agprs=agprs)


@dataclass(frozen=True)
class BuildResult:
    variant: Variant
    co_path: Path
    assembled: bool        # False when the .co was up to date


def include_dirs(variant: Variant) -> list[Path]:
    return [variant.kernel.source.parent, *variant.kernel.manifest.include_dirs]


def _included_files(source: Path, search: list[Path], seen: set[Path]) -> None:
    """Add `source` and, recursively, every file it `.include`s that can be found."""
    seen.add(source)
    for name in _INCLUDE.findall(source.read_text(errors="replace")):
        found = next((d / name for d in search if (d / name).is_file()), None)
        if found is not None and found.resolve() not in seen:
            _included_files(found.resolve(), search, seen)


def _manifest_entry(variant: Variant) -> dict:
    kernel = variant.kernel
    return {"symbol": kernel.symbol, "workgroup": kernel.workgroup, "lds_bytes": kernel.lds_bytes,
            "float_denorm_mode_32": kernel.float_denorm_mode_32, "defines": variant.defines,
            "args": [[a.name, a.type.name, a.direction, a.offset] for a in variant.args]}


def inputs_digest(variant: Variant, code: str, toolchain: Toolchain) -> str:
    digest = hashlib.sha256()
    for part in (code, json.dumps(_manifest_entry(variant), sort_keys=True), toolchain.clang,
                 toolchain.version, Path(codegen.__file__).read_text(), Path(__file__).read_text()):
        digest.update(part.encode() + b"\0")
    files: set[Path] = set()
    _included_files(variant.kernel.source, [variant.kernel.manifest.root, *include_dirs(variant)], files)
    for path in sorted(files):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _run(command: list[str], cwd: Path, what: str) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise BuildError(f"{what} failed:\n{done.stderr.rstrip()}")
    return done.stdout


def build_variant(variant: Variant, toolchain: Toolchain, force: bool = False) -> BuildResult:
    # Several processes may build one variant at once (pytest -n workers, two `gfxasm build`s):
    # one at a time, or they would unlink and write each other's .co, .partial and gen files.
    gen_dir = variant.kernel.manifest.build_dir / "gen"
    gen_dir.mkdir(parents=True, exist_ok=True)
    with open(gen_dir / f"{variant.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_variant(variant, toolchain, force, gen_dir)


def _build_variant(variant: Variant, toolchain: Toolchain, force: bool, gen_dir: Path) -> BuildResult:
    manifest = variant.kernel.manifest
    co_path = variant.co_path
    generated, stamp = gen_dir / f"{variant.name}.s", gen_dir / f"{variant.name}.stamp"
    code = codegen.code_part(variant)
    digest = inputs_digest(variant, code, toolchain)
    if not force and co_path.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return BuildResult(variant, co_path, assembled=False)

    # Until this build succeeds there is no .co: a failed build must not leave a stale one to launch.
    stamp.unlink(missing_ok=True)
    co_path.unlink(missing_ok=True)
    generated.write_text(code)
    # Absolute paths throughout, so the assembler's messages name the file unambiguously
    # ("/.../tests/fixtures/x.s:12:3: error: ...") wherever the build was started.
    includes = [f"-I{d}" for d in include_dirs(variant)]
    what = f"assembling {variant.kernel.source} (variant {variant.name})"
    listing = Listing(_run([toolchain.llvm_mc, "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx950", "-filetype=asm",
                            *includes, str(generated)], manifest.root, what))
    problems = check.mubuf_offset_problems(listing.instructions, variant.kernel.source)
    if problems:
        raise BuildError("\n".join(problems))

    generated.write_text(code + codegen.descriptor_part(variant, listing.register_counts()))
    co_path.parent.mkdir(parents=True, exist_ok=True)
    partial = co_path.with_suffix(".co.partial")
    _run([toolchain.clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx950",
          f"--ld-path={toolchain.ld_lld}", *includes, str(generated), "-o", str(partial)], manifest.root, what)
    partial.replace(co_path)
    stamp.write_text(digest)
    return BuildResult(variant, co_path, assembled=True)


def build_kernels(names: Iterable[str], force: bool = False) -> None:
    """Build (incrementally) and verify the variants of the named kernels of the default
    manifest only — so that an op's tests and bench do not depend on another kernel that is
    mid-edit. An installed (prebuilt) manifest is only verified, never assembled."""
    manifest = default_manifest()
    variants = [v for name in names for v in manifest.kernel(name).variants.values()]
    if manifest.prebuilt:
        results = [BuildResult(v, v.co_path, assembled=False) for v in variants]
    else:
        toolchain = ensure_toolchain()
        results = [build_variant(v, toolchain, force) for v in variants]
    _verify(results)


def build_manifest(manifest: Manifest, force: bool = False, toolchain: Toolchain | None = None,
                   install_llvm: bool = False) -> list[BuildResult]:
    """Build every variant (only what changed unless `force`), then verify each `.co`.

    The manifest installed with the package (prebuilt) is never assembled: its code objects
    came with the wheel, and each is only verified; a missing one is an error."""
    if manifest.prebuilt:
        results = [BuildResult(v, v.co_path, assembled=False) for v in manifest.variants()]
    else:
        toolchain = toolchain or ensure_toolchain(install_llvm)
        # The work is in the assembler processes, so threads build variants in parallel.
        with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
            results = list(pool.map(lambda variant: build_variant(variant, toolchain, force), manifest.variants()))
    _verify(results)
    return results


def _verify(results: list[BuildResult]) -> None:
    missing = [str(r.co_path) for r in results if not r.co_path.is_file()]
    if missing:
        raise BuildError(f"{', '.join(missing)}: not found; {results[0].variant.kernel.manifest.build_hint}")
    problems = [p for r in results for p in check.verify(r.co_path, r.variant)]
    if problems:
        raise BuildError("built code objects disagree with the manifest:\n" + "\n".join(problems))

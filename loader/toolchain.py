"""Locate the LLVM tools gfxasm needs (clang, ld.lld, llvm-objdump, ...).

`LLVM_BIN` names a directory holding unsuffixed tools; otherwise Debian's versioned
names are tried from the newest down to LLVM 20 (the first release with gfx950).
"""
from __future__ import annotations

import functools
import os
import shutil

SUPPORTED_VERSIONS = (22, 21, 20)
INSTALL_HINT = "install LLVM >= 20 (Debian: apt-get install clang-22 lld-22 llvm-22) or set LLVM_BIN"


class ToolchainError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def find_tool(name: str) -> str:
    """Absolute path of an LLVM tool such as 'clang', 'ld.lld' or 'llvm-objdump'."""
    llvm_bin = os.environ.get("LLVM_BIN")
    if llvm_bin:
        path = os.path.join(llvm_bin, name)
        if os.access(path, os.X_OK):
            return path
        raise ToolchainError(f"{name} not found in LLVM_BIN={llvm_bin}")
    for version in SUPPORTED_VERSIONS:
        path = shutil.which(f"{name}-{version}")
        if path:
            return path
    raise ToolchainError(f"{name} (LLVM >= 20) not found: {INSTALL_HINT}")

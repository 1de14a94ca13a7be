"""Disassembly of a gfx950 code object's code: one `Line` per instruction, as LLVM prints it.

The emulator's decoder (gfxasm.emu.decode) parses these lines; this package only obtains
them, from one of two sources that give identical lines (tests/test_disasm_backends.py
compares them; with `-m full` on every gfx950 corpus object and every built kernel):

    llvm-c        in process: LLVM-C's disassembler from AMD's rocm-llvm-python wheel
                  (`pip install 'gfxasm[llvm]'`); nothing from apt is needed (llvm_c.py)
    llvm-objdump  `llvm-objdump -d --mcpu=gfx950` of an LLVM >= 20 toolchain, run per object
                  (objdump.py)

$GFXASM_DISASSEMBLER names one of them; unset, llvm-c is used where rocm-llvm-python is
installed and llvm-objdump otherwise (`source_name()` says which). A named or installed
source that fails raises; no call falls back to the other source.
"""
from __future__ import annotations

import importlib.util
import os

from .lines import MCPU, DisassemblyError, Line

__all__ = ["DisassemblyError", "LLVM_C", "Line", "MCPU", "OBJDUMP", "SOURCE_ENV", "disassemble",
           "llvm_c_installed", "source_name"]
SOURCE_ENV = "GFXASM_DISASSEMBLER"
LLVM_C, OBJDUMP = "llvm-c", "llvm-objdump"


def source_name() -> str:
    """The source `disassemble` uses now (see the package docstring)."""
    named = os.environ.get(SOURCE_ENV)
    if named:
        if named not in (LLVM_C, OBJDUMP):
            raise DisassemblyError(f"{SOURCE_ENV}={named!r}: the disassemblers are {LLVM_C!r} (rocm-llvm-python, "
                                   f"`pip install 'gfxasm[llvm]'`) and {OBJDUMP!r}")
        return named
    return LLVM_C if llvm_c_installed() else OBJDUMP


def llvm_c_installed() -> bool:
    """Whether rocm-llvm-python is installed (`rocm` may be absent, or another wheel's)."""
    try:
        return importlib.util.find_spec("rocm.llvm") is not None
    except ModuleNotFoundError:
        return False


def disassemble(code: bytes, source: str | None = None) -> list[Line]:
    """Every instruction of the code object's executable sections, in address order, from
    `source` (LLVM_C or OBJDUMP; None: `source_name()`)."""
    if (source or source_name()) == LLVM_C:
        from . import llvm_c             # imports rocm-llvm-python only when used
        return llvm_c.disassemble(code)
    from . import objdump
    return objdump.disassemble(code)

"""Disassembly of a gfx950 code object's code: one `Line` per instruction, as LLVM prints it.

The emulator's decoder (gfxasm.emu.decode) parses these lines; this package only obtains
them, from one of two sources that give identical lines (tests/test_disasm_backends.py
compares them; with `-m full` on every gfx950 corpus object and every built kernel):

    llvm-c        in process: LLVM-C's disassembler from AMD's rocm-llvm-python wheel
                  (`pip install 'gfxasm[llvm]'`); nothing from apt is needed (llvm_c.py)
    llvm-objdump  `llvm-objdump -d --mcpu=gfx950` of an LLVM >= 20 toolchain, run per object
                  (objdump.py)

$GFXASM_DISASSEMBLER names one of them; unset, llvm-objdump is used where an LLVM >= 20
toolchain is found and llvm-c otherwise, so a pip-only install (the `llvm` extra, nothing
from apt) emulates (`source_name()` says which). llvm-objdump comes first because the two
LLVMs are not the same release and do not decode every gfx950 encoding alike: the
`v_cmpx_*_e64` with an SGPR destination (tests/emu/test_vop.py) is an instruction to
LLVM 22's llvm-objdump and an undecodable `.long` to rocm-llvm-python 7.2's LLVM, which the
emulator then refuses. The choice is made per call from the environment; a source that
fails raises, and no call falls back to the other.
"""
from __future__ import annotations

import importlib.util
import os

from .lines import MCPU, DisassemblyError, Line

__all__ = ["DisassemblyError", "LLVM_C", "Line", "MCPU", "OBJDUMP", "SOURCE_ENV", "disassemble",
           "llvm_c_installed", "objdump_found", "source_name"]
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
    return OBJDUMP if objdump_found() or not llvm_c_installed() else LLVM_C


def objdump_found() -> bool:
    """Whether an LLVM >= 20 llvm-objdump is found (LLVM_BIN, or llvm-objdump-<version> on PATH)."""
    from ..toolchain import ToolchainError, find_tool
    try:
        find_tool("llvm-objdump")
    except ToolchainError:
        return False
    return True


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

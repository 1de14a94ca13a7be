"""Disassembly by `llvm-objdump -d --mcpu=gfx950` of an LLVM >= 20 toolchain, one run per object."""
from __future__ import annotations

import re
import subprocess
import tempfile

from ..toolchain import ToolchainError, find_tool
from .lines import MCPU, DisassemblyError, Line

# One instruction of llvm-objdump's AMDGPU output: "\t<asm>  // <address>: <dwords in hex>", then
# " <symbol+offset>" for a branch whose target has no label (the operand stays a number).
_OBJDUMP_LINE = re.compile(r"^\t(?P<asm>.*?)\s*// (?P<addr>[0-9A-Fa-f]+): (?P<words>[0-9A-Fa-f]+(?: [0-9A-Fa-f]+)*)"
                           r"(?: <[^>]+>)?$")


def disassemble(code: bytes) -> list[Line]:
    try:
        objdump = find_tool("llvm-objdump")
    except ToolchainError as exc:
        raise ToolchainError(f"{exc}; or `pip install 'gfxasm[llvm]'` to disassemble in process") from None
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(code)
        f.flush()
        proc = subprocess.run([objdump, "-d", f"--mcpu={MCPU}", f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise DisassemblyError(f"llvm-objdump failed: {proc.stderr.strip()}")
    return [Line(m["asm"].strip(), int(m["addr"], 16), tuple(int(w, 16) for w in m["words"].split()))
            for m in map(_OBJDUMP_LINE.match, proc.stdout.splitlines()) if m]

"""What a disassembly source gives: one `Line` per instruction."""
from __future__ import annotations

from dataclasses import dataclass

MCPU = "gfx950"


class DisassemblyError(RuntimeError):
    pass


@dataclass(frozen=True)
class Line:
    text: str                 # the instruction as printed, e.g. "s_cbranch_scc1 L_end"
    pc: int                   # its address
    words: tuple[int, ...]    # its dwords, literal included

"""The table from ISA mnemonic to handler.

Each family module (sop, smem, vop, mfma, ds, mem, ...) registers its handlers here with
`@handles(names..., klass=...)`. The class names the issue category used by the hazard
checks and the timing model: salu, smem, branch, valu, trans, mfma, vmem, ds, lds_dma,
nop, waitcnt, barrier, end.

A handler may also register `check(inst)`: the data-independent part of its operand and
modifier validation (formats, operand sizes), raising UnsupportedInstruction for what it
does not model. The handler itself must still refuse the same things when it runs;
`check` lets `gfxasm corpus coverage` judge a code object without running it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import UnsupportedInstruction


@dataclass(frozen=True)
class Handler:
    fn: Callable
    klass: str
    name: str
    check: Callable | None = None


HANDLERS: dict[str, Handler] = {}


def handles(*names: str, klass: str, check: Callable | None = None):
    def register(fn):
        for name in names:
            if name in HANDLERS:
                raise RuntimeError(f"two handlers for {name}")
            HANDLERS[name] = Handler(fn, klass, name, check)
        return fn
    return register


def lookup(inst) -> Handler:
    try:
        return HANDLERS[inst.name]
    except KeyError:
        raise UnsupportedInstruction(f"instruction {inst.name} at pc {inst.pc:#x} is not implemented "
                                     f"by the emulator ({inst.text})") from None

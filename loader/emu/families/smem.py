"""Scalar memory: s_load_dword* and s_buffer_load_dword*.

The data is read at issue and lands in the SGPRs when `s_waitcnt lgkmcnt` retires the
load; scalar loads may return out of order, which the executor enforces (only
lgkmcnt(0) is a safe wait while one is in flight).
"""
from __future__ import annotations

import numpy as np

from .. import races
from ..errors import MemoryFault
from ..memory import OutOfBounds
from ..registry import handles

WIDTHS = {"dword": 1, "dwordx2": 2, "dwordx4": 4, "dwordx8": 8, "dwordx16": 16}


def _offset(ex, inst, w) -> np.ndarray:
    """Byte offset: an SGPR or an immediate, plus an optional `offset:` immediate."""
    off = inst.ops[2]
    value = ex.s32(off, w).astype(np.uint64) if off.kind == "s" else np.full(ex._n(w), int(off.text, 0), np.uint64)
    return value + np.uint64(int(inst.mods.get("offset", 0)))


def _issue_load(ex, inst, w, addr: np.ndarray, count: int):
    if (addr & np.uint64(3)).any():
        raise MemoryFault(f"scalar load from unaligned address {int(addr[(addr & np.uint64(3)) != 0][0]):#x} "
                          f"({ex.where()})")
    try:
        data = ex.memory.read(addr, 4 * count).view(np.uint32).reshape(-1, count)
    except OutOfBounds as err:
        ex.fault(w, err, "scalar load", lanes=1)
    races.note(ex, w, addr[:, None], np.ones((addr.size, 1), bool), 4 * count, races.READ)
    dst = inst.ops[0]
    waves = ex.wave_ids(w)

    def land(rows):
        ex.waves.sgpr[waves[rows], dst.index:dst.index + count] = data[rows]
    ex.issue(w, "lgkm", land, dest=("s", dst.index, count), smem=True)


@handles(*(f"s_load_{n}" for n in WIDTHS), klass="smem")
def s_load(ex, inst, w):
    count = WIDTHS[inst.name[len("s_load_"):]]
    base = ex.s64(inst.ops[1], w) & np.uint64(0xFFFFFFFFFFFF)
    _issue_load(ex, inst, w, base + _offset(ex, inst, w), count)


@handles(*(f"s_buffer_load_{n}" for n in WIDTHS), klass="smem")
def s_buffer_load(ex, inst, w):
    count = WIDTHS[inst.name[len("s_buffer_load_"):]]
    desc = ex.sregs(inst.ops[1], w, 4).astype(np.uint64)
    base = desc[:, 0] | ((desc[:, 1] & np.uint64(0xFFFF)) << np.uint64(32))
    offset = _offset(ex, inst, w)
    # Out-of-range dwords of a scalar buffer load read as zero, like vector buffer loads.
    in_range = offset[:, None] + np.uint64(4) * np.arange(1, count + 1, dtype=np.uint64) <= desc[:, 2:3]
    if not in_range.all():
        from ..errors import UnsupportedInstruction
        raise UnsupportedInstruction(f"s_buffer_load partly out of range is not modelled ({ex.where()})")
    _issue_load(ex, inst, w, base + offset, count)

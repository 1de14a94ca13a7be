"""gfx950 lane swaps: v_permlane16_swap_b32 and v_permlane32_swap_b32 (VOP1, and the e64
form that carries bound_ctrl/fi). Both operands are read and both are written.

  v_permlane16_swap vdst, vsrc: the odd 16-lane rows of vdst (rows 1 and 3) trade places
    with the even rows of vsrc (rows 0 and 2): vdst lane l (l & 16) <-> vsrc lane l ^ 16.
  v_permlane32_swap vdst, vsrc: lanes 32-63 of vdst <-> lanes 0-31 of vsrc (l ^ 32).

Sources: LLVM's intrinsic docs (llvm.amdgcn.permlane16.swap / permlane32.swap: "Odd rows
of the first operand are swapped with even rows of the second operand"; "Rows 2 and 3 of
the first operand are swapped with rows 0 and 1 of the second operand") and the fact
sheet §3, where aiter's hardware-proven fwd_hd128_bf16.co is right only when both row
pairs (1<->0 and 3<->2) swap.

EXEC: with both lanes of a swapped pair active the pair swaps; with both inactive
nothing is written. A pair with one lane active and one inactive is what fi/bound_ctrl
govern, and that behaviour is not documented anywhere we could find: it is rejected.

Hazard: a VALU write of a VGPR needs 2 wait states before v_permlane*_swap reads it
(fact sheet §4; LLVM 22 checkPermlaneHazards, which counts any VALU producer). One
exception, from hardware evidence: when the producer is itself a v_permlane*_swap, 1 wait
state is enough — aiter's hardware-proven fwd_hd128_bf16.co reads a v_permlane32_swap
result with v_permlane16_swap after exactly 1 wait state 8 times per tile (pc 0x70a8 and
neighbours), while it keeps 2 (v_nop) after every other VALU producer; LLVM 22 would insert
an s_nop there. 0 wait states after a permlane producer is unverified and reported. The
rule is checked here rather than through ex.role = 'permlane' (hazards.py cannot tell a
permlane writer from other VALU writers); every other read hazard still goes through
hazards.py.
"""
from __future__ import annotations

import numpy as np

from .. import hazards
from ..errors import UnsupportedInstruction
from ..registry import handles

LANE = np.arange(64)
STRIDE = {"v_permlane16_swap_b32": 16, "v_permlane32_swap_b32": 32}


@handles(*STRIDE, klass="valu")
def permlane_swap(ex, inst, w):
    if inst.enc in ("dpp", "sdwa"):
        raise UnsupportedInstruction(f"{inst.enc} form of {inst.name} is not modelled ({ex.where()})")
    vdst, vsrc = inst.ops
    if vdst.kind != "v" or vsrc.kind != "v":
        raise UnsupportedInstruction(f"{inst.name} takes VGPR operands ({ex.where()})")
    stride = STRIDE[inst.name]
    partner = LANE ^ stride
    upper = (LANE & stride) != 0          # vdst lanes that are swapped out
    _check_sources(ex, w, (vdst, vsrc))
    a = ex.v32(vdst, w)
    b = ex.v32(vsrc, w)
    active = ex.exec_bits(w)
    mixed = active != active[:, partner]
    if mixed.any():
        row = int(np.flatnonzero(mixed.any(axis=1))[0])
        lane = int(np.flatnonzero(mixed[row])[0])
        raise UnsupportedInstruction(
            f"{inst.name} with lane {lane} active and its swap partner lane {lane ^ stride} inactive: "
            f"the fi/bound_ctrl behaviour for inactive lanes is not modelled "
            f"({ex.where(int(ex.wave_ids(w)[row]))})")
    new_a = b[:, partner]                 # vdst upper lanes <- vsrc lower lanes
    new_b = a[:, partner]                 # vsrc lower lanes <- vdst upper lanes
    if vdst.index == vsrc.index:          # one register: its paired rows trade places
        ex.set_v(vdst, w, np.where(upper[None, :], new_a, new_b), active)
    else:
        ex.set_v(vdst, w, new_a, active & upper[None, :])
        ex.set_v(vsrc, w, new_b, active & ~upper[None, :])
    written = _permlane_written_at(ex)
    for op in (vdst, vsrc):
        written[ex.wave_ids(w), op.index] = ex.waves.clock[w]


_VALU_WRITERS = [hazards.VALU, hazards.TRANS, hazards.DST_SEL, hazards.ACCVGPR_WRITE]


def _permlane_written_at(ex) -> np.ndarray:
    """Clock of the last v_permlane*_swap write of each VGPR (per wave)."""
    at = getattr(ex.waves, "_permlane_written_at", None)
    if at is None:
        at = ex.waves._permlane_written_at = np.full(ex.waves.busy["v"].shape, -(1 << 40), np.int64)
    return at


def _check_sources(ex, w, operands):
    """VALU write -> permlane read: 2 wait states, 1 if the writer was a permlane swap."""
    if not ex.strict:
        return
    waves = ex.waves
    perm_at = _permlane_written_at(ex)
    for op in operands:
        writer = waves.written_by["v"][w, op.index]
        at = waves.written_at["v"][w, op.index]
        need = np.where(np.isin(writer, _VALU_WRITERS), np.where(perm_at[ex.wave_ids(w), op.index] == at, 1, 2), 0)
        gap = waves.clock[w] - at - 1
        short = gap < need
        if short.any():
            row = int(np.flatnonzero(short)[0])
            what = "a v_permlane*_swap" if need[row] == 1 else "a VALU op"
            ex.hazard(w, short, f"v{op.index} read {int(gap[row])} wait states after {what} wrote it; "
                                f"{int(need[row])} are required (insert s_nop)")

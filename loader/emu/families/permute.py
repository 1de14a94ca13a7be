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
(fact sheet §4), checked through ex.role = 'permlane'.
"""
from __future__ import annotations

import numpy as np

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
    ex.role = "permlane"
    a = ex.v32(vdst, w)
    b = ex.v32(vsrc, w)
    ex.role = None
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
        return
    ex.set_v(vdst, w, new_a, active & upper[None, :])
    ex.set_v(vsrc, w, new_b, active & ~upper[None, :])

"""DPP (data-parallel primitives, gfx9 form) lane moves on src0 of a VOP1/VOP2 op.

Each DPP control gives every lane a source lane; a source lane outside the row/wave or
disabled by EXEC is invalid. An invalid source reads 0 when bound_ctrl is set and
otherwise leaves the destination lane unwritten. row_mask/bank_mask disable whole
rows (16 lanes) and banks (lanes with the same (lane >> 2) & 3 in every row).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedInstruction

LANE = np.arange(64)
ROW_BASE = LANE & ~15
IN_ROW = LANE & 15


def _source_lanes(mods: dict) -> tuple[np.ndarray, np.ndarray]:
    """(source lane per lane, valid per lane) for the DPP control in `mods`."""
    if "quad_perm" in mods:
        perm = np.asarray(mods["quad_perm"])
        return (LANE & ~3) | perm[LANE & 3], np.ones(64, bool)
    if "row_shl" in mods:
        n = mods["row_shl"]
        return LANE + n, IN_ROW + n < 16
    if "row_shr" in mods:
        n = mods["row_shr"]
        return LANE - n, IN_ROW - n >= 0
    if "row_ror" in mods:
        n = mods["row_ror"]
        return ROW_BASE | ((IN_ROW - n) % 16), np.ones(64, bool)
    if "wave_shl" in mods:
        return LANE + 1, LANE + 1 < 64
    if "wave_shr" in mods:
        return LANE - 1, LANE >= 1
    if "wave_rol" in mods:
        return (LANE + 1) % 64, np.ones(64, bool)
    if "wave_ror" in mods:
        return (LANE - 1) % 64, np.ones(64, bool)
    if "row_mirror" in mods:
        return ROW_BASE | (15 - IN_ROW), np.ones(64, bool)
    if "row_half_mirror" in mods:
        return (LANE & ~7) | (7 - (LANE & 7)), np.ones(64, bool)
    if "row_newbcast" in mods:
        return ROW_BASE | mods["row_newbcast"], np.ones(64, bool)
    if "row_bcast" in mods:
        if mods["row_bcast"] == 15:   # lane 15 of row r-1 to every lane of row r
            return ROW_BASE - 1, LANE >= 16
        if mods["row_bcast"] == 31:   # lane 31 to rows 2 and 3
            return np.full(64, 31), LANE >= 32
    raise UnsupportedInstruction(f"DPP control {mods} is not modelled")


def _control(inst):
    cached = getattr(inst, "_dpp", None)
    if cached is None:
        src, valid = _source_lanes(inst.mods)
        src = np.where(valid, src, 0)
        row_mask = inst.mods.get("row_mask", 0xF)
        bank_mask = inst.mods.get("bank_mask", 0xF)
        enabled = (((row_mask >> (LANE >> 4)) & 1) == 1) & (((bank_mask >> ((LANE >> 2) & 3)) & 1) == 1)
        cached = (src, valid, enabled, bool(inst.mods.get("bound_ctrl", 0)))
        inst._dpp = cached
    return cached


def apply_source(ex, inst, w, bits: np.ndarray) -> np.ndarray:
    src, valid, _, bound_ctrl = _control(inst)
    active = ex.exec_bits(w)
    ok = valid[None, :] & active[:, src]
    moved = bits[:, src]
    return np.where(ok, moved, 0).astype(bits.dtype) if bound_ctrl else moved


def write_mask(ex, inst, w) -> np.ndarray:
    src, valid, enabled, bound_ctrl = _control(inst)
    mask = np.broadcast_to(enabled, (ex._n(w), 64)).copy()
    if not bound_ctrl:
        mask &= valid[None, :] & ex.exec_bits(w)[:, src]
    return mask

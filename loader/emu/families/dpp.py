"""DPP (data-parallel primitives, gfx9 "DPP16" form) lane moves on src0 of a VOP1/VOP2 op.

The control is decoded from the raw DPP dword (the second dword of the instruction),
never from the printed text: LLVM has printed the same BOUND_CTRL bit as `bound_ctrl:0`
(before LLVM 13) and as `bound_ctrl:1` (since), so the text is not a reliable source.

    DPP dword: src0 [7:0], dpp_ctrl [16:8], bound_ctrl [19], src0_neg [20], src0_abs [21],
               src1_neg [22], src1_abs [23], bank_mask [27:24], row_mask [31:28]

Semantics (LLVM AMDGPUModifierSyntax "dpp32_ctrl"/"bound_ctrl"/"fi"; gem5's Vega model
`dppInstImpl`/`processDPP`, written by AMD):
  * each control gives every lane a source lane (table in `source_lanes`);
  * a source lane is *invalid* when it falls outside the row/wave (row_shl/shr,
    wave_shl/shr, row_bcast) or is disabled by EXEC ("fi:0: interaction with inactive
    lanes is controlled by bound_ctrl"; gfx9 has no FI bit);
  * an invalid source reads 0 when BOUND_CTRL is set, otherwise the destination lane is
    not written (it keeps its old value);
  * row_mask / bank_mask only gate the destination write (row r = lanes 16r..16r+15,
    bank k = lanes with (lane >> 2) & 3 == k in every row); they do not affect which
    source lanes are fetched.
Shift/rotate direction: `row_shr:n` makes lane i read lane i-n, `row_shl:n` lane i+n,
`row_ror:n` lane (i-n) mod 16 within the row; wave_shr/wave_ror: lane i reads i-1,
wave_shl/wave_rol: lane i reads i+1. row_bcast:15: rows 1-3 read the last lane of the
previous row (row 0 invalid); row_bcast:31: rows 2-3 read lane 31 (rows 0-1 invalid).
row_newbcast:n (gfx90a+, dpp_ctrl 0x150+n): every lane reads lane n of its own row.
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedInstruction

LANE = np.arange(64)
ROW_BASE = LANE & ~15
IN_ROW = LANE & 15
ALL = np.ones(64, bool)


def fields(inst) -> dict:
    """Raw DPP fields of a `_dpp` instruction (from its second dword)."""
    if len(inst.words) < 2:
        raise UnsupportedInstruction(f"DPP instruction without a DPP dword: {inst.text}")
    d = inst.words[1]
    return {"ctrl": (d >> 8) & 0x1FF, "bound_ctrl": (d >> 19) & 1, "bank_mask": (d >> 24) & 0xF,
            "row_mask": (d >> 28) & 0xF, "reserved18": (d >> 18) & 1}


def source_lanes(ctrl: int) -> tuple[np.ndarray, np.ndarray]:
    """(source lane per lane, in-range per lane) for a 9-bit dpp_ctrl value."""
    if ctrl <= 0xFF:                                   # quad_perm
        perm = np.array([(ctrl >> (2 * k)) & 3 for k in range(4)])
        return (LANE & ~3) | perm[LANE & 3], ALL
    if 0x101 <= ctrl <= 0x10F:                         # row_shl:n
        n = ctrl & 0xF
        return LANE + n, IN_ROW + n < 16
    if 0x111 <= ctrl <= 0x11F:                         # row_shr:n
        n = ctrl & 0xF
        return LANE - n, IN_ROW - n >= 0
    if 0x121 <= ctrl <= 0x12F:                         # row_ror:n
        n = ctrl & 0xF
        return ROW_BASE | ((IN_ROW - n) % 16), ALL
    if ctrl == 0x130:                                  # wave_shl:1
        return LANE + 1, LANE + 1 < 64
    if ctrl == 0x134:                                  # wave_rol:1
        return (LANE + 1) % 64, ALL
    if ctrl == 0x138:                                  # wave_shr:1
        return LANE - 1, LANE >= 1
    if ctrl == 0x13C:                                  # wave_ror:1
        return (LANE - 1) % 64, ALL
    if ctrl == 0x140:                                  # row_mirror
        return ROW_BASE | (15 - IN_ROW), ALL
    if ctrl == 0x141:                                  # row_half_mirror
        return (LANE & ~7) | (7 - (LANE & 7)), ALL
    if ctrl == 0x142:                                  # row_bcast:15
        return ROW_BASE - 1, LANE >= 16
    if ctrl == 0x143:                                  # row_bcast:31
        return np.full(64, 31), LANE >= 32
    if 0x150 <= ctrl <= 0x15F:                         # row_newbcast:n (gfx90a+)
        return ROW_BASE | (ctrl & 0xF), ALL
    raise UnsupportedInstruction(f"DPP control {ctrl:#x} is reserved on gfx950")


def _control(inst):
    cached = getattr(inst, "_dpp", None)
    if cached is None:
        f = fields(inst)
        if f["reserved18"]:
            raise UnsupportedInstruction(f"DPP dword bit 18 (FI on gfx10+) is set; gfx9 DPP has no "
                                         f"fetch-inactive mode: {inst.text}")
        src, in_range = source_lanes(f["ctrl"])
        src = np.where(in_range, src, 0)
        row_mask, bank_mask = f["row_mask"], f["bank_mask"]
        enabled = (((row_mask >> (LANE >> 4)) & 1) == 1) & (((bank_mask >> ((LANE >> 2) & 3)) & 1) == 1)
        cached = (src, in_range, enabled, bool(f["bound_ctrl"]), f["ctrl"])
        inst._dpp = cached
    return cached


def is_newbcast(inst) -> bool:
    return 0x150 <= _control(inst)[4] <= 0x15F


def apply_source(ex, inst, w, bits: np.ndarray) -> np.ndarray:
    """src0 as each lane fetches it: [n,64] of any dtype (32- or 64-bit lanes)."""
    src, in_range, _, bound_ctrl, _ = _control(inst)
    moved = bits[:, src]
    if bound_ctrl:
        ok = in_range[None, :] & ex.exec_bits(w)[:, src]
        return np.where(ok, moved, 0).astype(bits.dtype)
    return moved


def write_mask(ex, inst, w) -> np.ndarray:
    """Lanes the DPP op may write (before EXEC): row/bank masks, and valid sources unless
    BOUND_CTRL turns invalid sources into zeros."""
    src, in_range, enabled, bound_ctrl, _ = _control(inst)
    mask = np.broadcast_to(enabled, (ex._n(w), 64)).copy()
    if not bound_ctrl:
        mask &= in_range[None, :] & ex.exec_bits(w)[:, src]
    return mask

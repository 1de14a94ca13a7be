"""Sparse MFMA (SMFMAC) instructions of gfx950: A holds 4:2 structured-sparse data.

    v_smfmac_* vdst, srcA, srcB, idx [abid:n]        D = vdst + A_dense . B

Each lane's srcA holds the non-zero values of 2x as many dense K positions as it has
elements; srcB (twice A's registers) and vdst/srcC have the dense MFMA's layout. Per
group of 4 consecutive dense positions (in the lane's register order of B) the lane
has 2 non-zeros, and two 2-bit indices say where they sit: non-zero j of the lane
pairs with B element 4*(j/2) + idx_j of the same lane group. The indices come from
the lane's own idx VGPR: non-zero j uses bits [2j+1:2j] of the index set ABID selects
(LLVM PR #193541, "[AMDGPU] Correct gfx950 smfmac sparse index verifier", by AMD, with
the CDNA3/CDNA4 ISA's sparse layout tables): 16-bit sources of the gfx940 forms (4
non-zeros per lane) use an 8-bit set, ABID 0..3; 8-bit gfx940 forms and 16-bit gfx950
forms (8 non-zeros) a 16-bit set, ABID 0..1; 8-bit gfx950 forms (16 non-zeros) all 32
bits. Register counts were checked with llvm-mc 22 (A 2 / B 4 VGPRs for the gfx940
shapes, A 4 / B 8 for the gfx950 ones); passes from the wait states llc-22 inserts
before a VALU reads the result: 4 (16x16) and 8 (32x32).

Which dense K index a lane's B element stands for (contiguous or the f8f6f4 split
order) does not change D: A and B of lane group g are paired element by element, and
relabelling K the same way for both leaves every dot product unchanged. So D[i][j] =
C + sum over groups g and elements t of A'(i + M*g, t) * B(j + M*g, t), formed in
float64 and rounded once (as mfma.py does; exact for i8).

Rejected (UnsupportedInstruction): two non-zeros of a group given the same index
(unverified), CBSZ != 0 (its SMFMAC meaning is unverified), an ABID beyond the index
sets, source modifiers, and a partial EXEC.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedInstruction
from ..registry import handles
from ..state import LANES
from .mfma import BF8, BF16, F16, FP8, I8, _d_flat, _i32_result, _writer, decode_elements


@dataclass(frozen=True)
class SparseSpec:
    m: int
    a_fmt: str
    b_fmt: str
    a_regs: int          # VGPRs of compressed A; B has twice as many
    passes: int

    @property
    def c_regs(self) -> int:
        return 4 if self.m == 16 else 16

    @property
    def nonzeros(self) -> int:             # A elements per lane
        return self.a_regs * (2 if self.a_fmt in (F16, BF16) else 4)


def _table() -> dict[str, SparseSpec]:
    t: dict[str, SparseSpec] = {}
    for m, k_old, k_new in ((16, 32, 64), (32, 16, 32)):
        passes = 4 if m == 16 else 8
        for ty in (F16, BF16):
            t[f"v_smfmac_f32_{m}x{m}x{k_old}_{ty}"] = SparseSpec(m, ty, ty, 2, passes)
            t[f"v_smfmac_f32_{m}x{m}x{k_new}_{ty}"] = SparseSpec(m, ty, ty, 4, passes)
        t[f"v_smfmac_i32_{m}x{m}x{2 * k_old}_i8"] = SparseSpec(m, I8, I8, 2, passes)
        t[f"v_smfmac_i32_{m}x{m}x{2 * k_new}_i8"] = SparseSpec(m, I8, I8, 4, passes)
        for a in (FP8, BF8):
            for b in (FP8, BF8):
                t[f"v_smfmac_f32_{m}x{m}x{2 * k_old}_{a}_{b}"] = SparseSpec(m, a, b, 2, passes)
                t[f"v_smfmac_f32_{m}x{m}x{2 * k_new}_{a}_{b}"] = SparseSpec(m, a, b, 4, passes)
    return t


SMFMAC = _table()


def _operand(ex, inst, w, op, count: int, what: str):
    if op.kind not in ("v", "a") or op.count != count or op.neg or op.abs:
        raise UnsupportedInstruction(f"{inst.name}: {what} {op.text} must be {count} VGPRs or AGPRs "
                                     f"without modifiers ({ex.where()})")
    return ex.vregs(op, w, count)


def _positions(ex, inst, idx_bits: np.ndarray, spec: SparseSpec) -> np.ndarray:
    """int[n, 64, nonzeros]: the B element each non-zero of A pairs with."""
    set_bits = 2 * spec.nonzeros
    abid = int(inst.mods.get("abid", 0))
    if abid * set_bits >= 32:
        raise UnsupportedInstruction(f"{inst.name}: abid:{abid} selects no index set ({set_bits}-bit sets "
                                     f"in 32 bits) ({ex.where()})")
    sel = idx_bits.astype(np.uint64) >> np.uint64(abid * set_bits)
    j = np.arange(spec.nonzeros)
    f = ((sel[..., None] >> (2 * j).astype(np.uint64)) & np.uint64(3)).astype(np.int64)
    if (f[..., 0::2] == f[..., 1::2]).any():
        raise UnsupportedInstruction(f"{inst.name}: two non-zeros of a 4-group share an index; the "
                                     f"hardware's result is unverified ({ex.where()})")
    return 4 * (j // 2) + f


def smfmac(ex, inst, w):
    spec = SMFMAC[inst.name]
    if int(inst.mods.get("cbsz", 0)) or any(k in inst.mods for k in ("neg", "neg_lo", "neg_hi", "clamp")):
        raise UnsupportedInstruction(f"{inst.name}: modifiers {inst.mods} are not modelled ({ex.where()})")
    if len(inst.ops) != 4:
        raise UnsupportedInstruction(f"{inst.name}: unexpected operand list ({ex.where()})")
    dst, a_op, b_op, idx_op = inst.ops
    if not ex.waves.exec_all(w):
        raise UnsupportedInstruction(f"{inst.name} with a partial EXEC mask: behaviour for disabled lanes "
                                     f"is unverified ({ex.where()})")
    ex.role = None
    a_regs = _operand(ex, inst, w, a_op, spec.a_regs, "srcA")
    b_regs = _operand(ex, inst, w, b_op, 2 * spec.a_regs, "srcB")
    if idx_op.kind != "v" or idx_op.count != 1:
        raise UnsupportedInstruction(f"{inst.name}: index {idx_op.text} must be one VGPR ({ex.where()})")
    pos = _positions(ex, inst, ex.v32(idx_op, w), spec)
    if dst.kind not in ("v", "a") or dst.count != spec.c_regs:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be {spec.c_regs} registers "
                                     f"({ex.where()})")
    ex.role, ex.srcc_is_dst = "c", True          # vdst is also srcC, read in place
    c_regs = ex.vregs(dst, w, spec.c_regs)
    ex.role, ex.srcc_is_dst = None, False

    n, m, nz = a_regs.shape[0], spec.m, spec.nonzeros
    groups = LANES // m
    a = decode_elements(a_regs, spec.a_fmt).reshape(n, LANES, nz)
    b = decode_elements(b_regs, spec.b_fmt).reshape(n, LANES, 2 * nz)
    dense = np.zeros((n, LANES, 2 * nz))
    np.put_along_axis(dense, pos, a, axis=2)
    # Lane l = row + M*g: [n, G, M, T] -> [n, M, G*T] for A rows and B columns alike.
    a_rows = dense.reshape(n, groups, m, 2 * nz).transpose(0, 2, 1, 3).reshape(n, m, -1)
    b_cols = b.reshape(n, groups, m, 2 * nz).transpose(0, 2, 1, 3).reshape(n, m, -1)
    with np.errstate(all="ignore"):
        dot = np.matmul(a_rows, b_cols.transpose(0, 2, 1)).reshape(n, m * m)
        d = np.take(dot, _d_flat(m), axis=1)
        c = c_regs.reshape(n, -1)
        writer = _writer(inst.name, spec.passes)
        if spec.a_fmt == I8:
            out = _i32_result(ex, inst, d + c.view(np.int32))
        else:
            out = (d + c.view(np.float32)).astype(np.float32).view(np.uint32)
    ex.set_v(dst, w, out.reshape(n, spec.c_regs, LANES), None, writer)


for _name in SMFMAC:
    handles(_name, klass="mfma")(smfmac)

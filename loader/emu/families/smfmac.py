"""Sparse MFMA (SMFMAC) instructions of gfx950: A holds 4:2 structured-sparse data.

    v_smfmac_* vdst, srcA, srcB, idx [abid:n]        D = vdst + A_dense . B

Only what evidence settles is modelled (docs/smfmac-evidence.md says which evidence
decided each form); everything else is refused (UnsupportedInstruction), never guessed.

The 14 gfx940 forms (CDNA3 shapes: 16x16x32 / 32x32x16 f16 and bf16, 16x16x64 / 32x32x32
i8 and fp8/bf8 pairs; A 2 VGPRs, B 4): AMD's matrix instruction calculator
(ROCm/amd_matrix_instruction_calculator, CDNA3) gives every layout. Lane i + M*g holds
row i of A and column i of B for the dense K range of lane group g, contiguous and in
register order for both: B element t is k = T*g + t (T dense K per lane), and A's
non-zeros of each group of 4 consecutive k sit in one 16-bit (8-bit sources) or 32-bit
(16-bit sources) slot, in order. The index VGPR holds one nibble per group of 4 (two
2-bit positions, the first non-zero in the low bits); ABID picks the set when CBSZ is
0 (8 bits per set for 16-bit sources, ABID 0..3; 16 bits for 8-bit, ABID 0..1). So
non-zero j of a lane pairs with B element 4*(j/2) + idx_j of the same lane.

The gfx950 16x16x128 fp8/bf8 forms (A 4 VGPRs: 16 non-zeros per lane, B 8, all 32 index
bits): only what aiter's hardware-built fwd_hd128_mxfp8.co shows. It sums rows of P with
`v_smfmac_f32_16x16x128_fp8_fp8` against a pattern of ones, which is right only if the
non-zeros of dense positions 0..15 of every A lane group pair with all of B's lane groups
c and c + 2 for c = 0 (positions 16..31: c = 1). (The same-lane pairing of the gfx940
forms gives cosine 0.96 against the reference there.) Carried over from the gfx940 forms
(and every 8-bit MFMA layout: four consecutive k in one dword, in byte order), not shown
by the kernel, which adds the rows of both position pairs: each 4-group of A meets one
dword of B, its position index selecting the byte in that dword. Which 4-group of A meets
which dword of B inside such a class is not settled, so D is formed only when it cannot
matter: per row and class, every non-zero of A has one value and every 4-group selects
the same two positions. Then D[i][j] = C + a(i, c) * (the selected bytes of column j in
lane groups c and c + 2), summed over c. Any other operand is refused.

Refused: the other 10 gfx950 forms (16x16x64 / 32x32x32 f16 and bf16, 16x16x128 i8,
32x32x64 i8 and fp8/bf8): no evidence settles their pairing; two non-zeros of a group
given the same index; CBSZ != 0 (AMD's calculator and its own comments disagree on what
it does to the index set); an ABID beyond the index sets; source modifiers; a partial
EXEC. D is formed in float64 and rounded once (as mfma.py; exact for i8). Passes: 4
(16x16) and 8 (32x32), from the wait states llc-22 inserts before a VALU reads D.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedInstruction
from ..registry import handles
from ..state import LANES
from .mfma import BF8, BF16, F16, FP8, I8, _d_flat, _i32_result, _writer, decode_elements


LANE = "lane"          # non-zero j pairs with B element 4*(j/2) + idx_j of its own lane (gfx940 forms)
CLASSES = "classes"    # the 16x16x128 fp8/bf8 row-sum rule: only class-uniform operands
EVIDENCE = "docs/smfmac-evidence.md"


@dataclass(frozen=True)
class SparseSpec:
    m: int
    a_fmt: str
    b_fmt: str
    a_regs: int          # VGPRs of compressed A; B has twice as many
    passes: int
    pairing: str | None  # LANE, CLASSES, or None: no evidence settles it (refused)

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
        f8_new = CLASSES if m == 16 else None
        for ty in (F16, BF16):
            t[f"v_smfmac_f32_{m}x{m}x{k_old}_{ty}"] = SparseSpec(m, ty, ty, 2, passes, LANE)
            t[f"v_smfmac_f32_{m}x{m}x{k_new}_{ty}"] = SparseSpec(m, ty, ty, 4, passes, None)
        t[f"v_smfmac_i32_{m}x{m}x{2 * k_old}_i8"] = SparseSpec(m, I8, I8, 2, passes, LANE)
        t[f"v_smfmac_i32_{m}x{m}x{2 * k_new}_i8"] = SparseSpec(m, I8, I8, 4, passes, None)
        for a in (FP8, BF8):
            for b in (FP8, BF8):
                t[f"v_smfmac_f32_{m}x{m}x{2 * k_old}_{a}_{b}"] = SparseSpec(m, a, b, 2, passes, LANE)
                t[f"v_smfmac_f32_{m}x{m}x{2 * k_new}_{a}_{b}"] = SparseSpec(m, a, b, 4, passes, f8_new)
    return t


SMFMAC = _table()


def _check_settled(inst):
    """Static (coverage) check: a form whose pairing no evidence settles is refused."""
    if SMFMAC[inst.name].pairing is None:
        raise UnsupportedInstruction(f"{inst.name}: which B element each non-zero of A meets is not "
                                     f"settled by any evidence ({EVIDENCE}); refused rather than guessed")


def _operand(ex, inst, w, op, count: int, what: str):
    if op.kind not in ("v", "a") or op.count != count or op.neg or op.abs:
        raise UnsupportedInstruction(f"{inst.name}: {what} {op.text} must be {count} VGPRs or AGPRs "
                                     f"without modifiers ({ex.where()})")
    return ex.vregs(op, w, count)


def _positions(ex, inst, idx_bits: np.ndarray, spec: SparseSpec) -> np.ndarray:
    """int[n, 64, nonzeros]: position (0..3) within its 4-group of each non-zero of A."""
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
    return f


def _lane_pairing(a, b, f, m):
    """A_dense rows and B columns [n, M, K'] under the same-lane pairing (gfx940 forms)."""
    n, _, nz = a.shape
    dense = np.zeros((n, LANES, 2 * nz))
    np.put_along_axis(dense, 4 * (np.arange(nz) // 2) + f, a, axis=2)
    groups = LANES // m
    # Lane l = row + M*g: [n, G, M, T] -> [n, M, G*T] for A rows and B columns alike.
    a_rows = dense.reshape(n, groups, m, 2 * nz).transpose(0, 2, 1, 3).reshape(n, m, -1)
    b_cols = b.reshape(n, groups, m, 2 * nz).transpose(0, 2, 1, 3).reshape(n, m, -1)
    return a_rows, b_cols


def _class_pairing(ex, inst, a, b, f):
    """The 16x16x128 row-sum rule (module docstring): A rows and B columns [n, 16, 2] over the
    two classes, refusing any operand whose result would depend on the unsettled order."""
    n = a.shape[0]
    # lane = row + 16 g; non-zero j = 8 c + t (class c: dense positions 16c .. 16c + 15)
    a_cls = a.reshape(n, 4, 16, 2, 8)                       # [n, g, row, c, t]
    f_cls = f.reshape(n, 4, 16, 2, 4, 2)                    # [n, g, row, c, 4-group, pair]
    chosen = (1 << f_cls).sum(axis=-1)                      # bit set of each 4-group's two positions
    first = a_cls[:, :1, :, :, :1]
    same_value = (a_cls == first) | (np.isnan(a_cls) & np.isnan(first))
    if not same_value.all() or not (chosen == chosen[:, :1, :, :, :1]).all():
        raise UnsupportedInstruction(
            f"{inst.name}: only operands whose result does not depend on which 4-group of A meets "
            f"which dword of B are modelled (per row and dense half: one A value, one position pair "
            f"in every 4-group); that order is not settled ({EVIDENCE}) ({ex.where()})")
    sel = chosen[:, 0, :, :, 0]                             # [n, row, c]
    b_bytes = b.reshape(n, 4, 16, 8, 4)                     # [n, g, col, dword, byte]
    a_rows = np.zeros((n, 16, 2 * 4))                       # per (c, byte position): A's value or 0
    b_cols = np.zeros((n, 16, 2 * 4))
    for c in (0, 1):
        for pos in range(4):
            picked = (sel[:, :, c] >> pos) & 1                                  # [n, row]
            a_rows[:, :, 4 * c + pos] = np.where(picked == 1, a_cls[:, 0, :, c, 0], 0.0)
            b_cols[:, :, 4 * c + pos] = b_bytes[:, [c, c + 2]][..., pos].sum(axis=(1, 3))
    return a_rows, b_cols


def smfmac(ex, inst, w):
    spec = SMFMAC[inst.name]
    _check_settled(inst)
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
    f = _positions(ex, inst, ex.v32(idx_op, w), spec)
    if dst.kind not in ("v", "a") or dst.count != spec.c_regs:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be {spec.c_regs} registers "
                                     f"({ex.where()})")
    ex.role, ex.srcc_is_dst = "c", True          # vdst is also srcC, read in place
    c_regs = ex.vregs(dst, w, spec.c_regs)
    ex.role, ex.srcc_is_dst = None, False

    n, m, nz = a_regs.shape[0], spec.m, spec.nonzeros
    a = decode_elements(a_regs, spec.a_fmt).reshape(n, LANES, nz)
    b = decode_elements(b_regs, spec.b_fmt).reshape(n, LANES, 2 * nz)
    if spec.pairing == LANE:
        a_rows, b_cols = _lane_pairing(a, b, f, m)
    else:
        a_rows, b_cols = _class_pairing(ex, inst, a, b, f)
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
    handles(_name, klass="mfma", check=_check_settled)(smfmac)

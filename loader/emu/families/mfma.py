"""Dense MFMA (matrix fused multiply-add) instructions of gfx950.

Covered: f16/bf16 (16x16x32, 32x32x16 and the legacy 16x16x16 / 32x32x8), fp8/bf8
(16x16x32 and 32x32x16, every A/B format pair), signed i8 with i32 C/D (16x16x32,
32x32x16, 16x16x64, 32x32x32; exact, an i32 overflow rejected), and the f8f6f4
instructions v_mfma_f32_{16x16x128,32x32x64}_f8f6f4 and
v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4 with FP8/BF8 and FP4 (E2M1) operands
(CBSZ selects A's format, BLGP B's). FP6/BF6 operands are rejected with
UnsupportedInstruction (their packing in 6 VGPRs is unverified), as are the broadcast
controls (non-zero CBSZ/ABID/BLGP) of the other MFMAs, whose semantics are unverified.
For i8 the K order within a lane is irrelevant: any K permutation shared by A and B
gives the same exact integer sum.

Lane layouts (../shared/docs/gfx950-isa-facts.md §2), lane l, G = 64 / M lane groups:
  * A row i = l % M, B column j = l % N (M = N here), g = l // M;
  * non-f8f6f4: lane element e (16-bit: half e%2 of VGPR e/2; 8-bit: byte e%4 of VGPR
    e/4) holds k = E*g + e, E = elements per lane;
  * f8f6f4 FP8/BF8: byte t = 0..31 holds k = 16*g + t%16 + 16*G*(t/16), i.e.
    32x32x64: 16*(l/32) + t%16 + 32*(t/16); 16x16x128: 16*(l/16) + t%16 + 64*(t/16);
  * f8f6f4 FP4: nibble t = 0..31 of the 4 VGPRs (low nibble first) holds k = 32*g + t
    (fact sheet §2 [BLOG; TRITON]; CK's test/mx_mfma_op register tables agree);
  * C/D 16x16: D[4*(l/16) + r][l%16]; 32x32: D[8*(r/4) + 4*(l/32) + r%4][l%32].
  * Block scales (scale form): 32-element K blocks b = k/32; the E8M0 byte for A row
    i, block b comes from lane i + M*b of the scaleA VGPR (B likewise), byte
    2*op_sel_hi[n] + op_sel[n] of it (n = 0 for A, 1 for B). The probe dumps of
    ROCm/composable_kernel pin this together with the K order (tests/emu/data/).

Numerics (the hardware's internal accumulation order and precision are not
documented): D = C + sum_k A'[i][k] * B'[k][j] is formed in float64 and rounded once to
f32 (RNE). For the scale form A' and B' are the operands multiplied by their blocks'
power-of-two E8M0 factors (exact in float64), which equals scaling each 32-element block
dot product. Products are exact in float64; the sum is exact whenever the products'
exponents span less than about 53 - 2p bits (always for unscaled FP8 E4M3) and
float64-accurate otherwise, so D is the correctly rounded f32 of the exact result except
in extreme exponent spreads. Denormal inputs and results are kept: the MODE denormal
flags are not applied to MFMAs (UNVERIFIED; LLVM models no MODE dependence for them). An
E8M0 scale of 0xFF makes the affected rows/columns NaN. NaN results carry numpy's payload
(UNVERIFIED).

EXEC must be all ones: what an MFMA does for lanes EXEC disables is unverified, so a
partial EXEC is rejected rather than guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import hazards, numerics
from ..errors import UnsupportedInstruction
from ..registry import handles
from ..state import LANES

F16, BF16, FP8, BF8, I8 = "f16", "bf16", "fp8", "bf8", "i8"
FP6, BF6, FP4 = "fp6 (e2m3)", "bf6 (e3m2)", "fp4 (e2m1)"
F8F6F4_FORMATS = {0: FP8, 1: BF8, 2: FP6, 3: BF6, 4: FP4}
# VGPRs per lane of an f8f6f4 operand: 32 elements of 8, 6 or 4 bits (llvm-mc rejects
# other tuple sizes: "wrong register tuple size for cbsz value").
F8F6F4_REGS = {FP8: 8, BF8: 8, FP6: 6, BF6: 6, FP4: 4}


@dataclass(frozen=True)
class Spec:
    m: int              # M = N
    k: int              # K of one instruction
    a_fmt: str | None   # None: chosen by CBSZ/BLGP (f8f6f4)
    b_fmt: str | None
    ab_regs: int        # VGPRs per lane of A (and of B)
    c_regs: int
    passes: int
    f8f6f4: bool = False
    scaled: bool = False


def _dense_table() -> dict[str, Spec]:
    t: dict[str, Spec] = {}
    for ty in (F16, BF16):
        t[f"v_mfma_f32_16x16x32_{ty}"] = Spec(16, 32, ty, ty, 4, 4, 4)
        t[f"v_mfma_f32_32x32x16_{ty}"] = Spec(32, 16, ty, ty, 4, 16, 8)
        t[f"v_mfma_f32_16x16x16_{ty}"] = Spec(16, 16, ty, ty, 2, 4, 4)
        t[f"v_mfma_f32_32x32x8_{ty}"] = Spec(32, 8, ty, ty, 2, 16, 8)
    for a in (FP8, BF8):
        for b in (FP8, BF8):
            t[f"v_mfma_f32_16x16x32_{a}_{b}"] = Spec(16, 32, a, b, 2, 4, 4)
            t[f"v_mfma_f32_32x32x16_{a}_{b}"] = Spec(32, 16, a, b, 2, 16, 8)
    # Signed 8-bit integer MFMAs (i32 accumulators); passes from LLVM 22's gfx950 hazard
    # model (llc inserts 8 / 12 wait states before a VALU reads the 16x16 / 32x32 result).
    t["v_mfma_i32_16x16x32_i8"] = Spec(16, 32, I8, I8, 2, 4, 4)
    t["v_mfma_i32_32x32x16_i8"] = Spec(32, 16, I8, I8, 2, 16, 8)
    t["v_mfma_i32_16x16x64_i8"] = Spec(16, 64, I8, I8, 4, 4, 4)
    t["v_mfma_i32_32x32x32_i8"] = Spec(32, 32, I8, I8, 4, 16, 8)
    # Passes with an FP8/BF8 operand; with FP4 on both sides half of that (_f8f6f4_passes).
    t["v_mfma_f32_16x16x128_f8f6f4"] = Spec(16, 128, None, None, 8, 4, 8, f8f6f4=True)
    t["v_mfma_f32_32x32x64_f8f6f4"] = Spec(32, 64, None, None, 8, 16, 16, f8f6f4=True)
    t["v_mfma_scale_f32_16x16x128_f8f6f4"] = Spec(16, 128, None, None, 8, 4, 8, f8f6f4=True, scaled=True)
    t["v_mfma_scale_f32_32x32x64_f8f6f4"] = Spec(32, 64, None, None, 8, 16, 16, f8f6f4=True, scaled=True)
    return t


MFMA = _dense_table()


# ---------------------------------------------------------------- layouts
def element_k(spec: Spec) -> np.ndarray:
    """int[64, E]: the K index that lane l's element e holds (A and B alike)."""
    lanes = np.arange(LANES)[:, None]
    g = lanes // spec.m
    if spec.f8f6f4:
        t = np.arange(32)[None, :]
        groups = LANES // spec.m
        return 16 * g + t % 16 + 16 * groups * (t // 16)
    per_lane = spec.k * spec.m // LANES
    return per_lane * g + np.arange(per_lane)[None, :]


@lru_cache(maxsize=None)
def _gather_index(name: str) -> np.ndarray:
    """int[M, K]: position (lane * E + e) of operand element (row/column i, k)."""
    spec = MFMA[name]
    ks = element_k(spec)
    per_lane = ks.shape[1]
    idx = np.full((spec.m, spec.k), -1, np.int64)
    lanes = np.arange(LANES)
    for e in range(per_lane):
        idx[lanes % spec.m, ks[:, e]] = lanes * per_lane + e
    assert (idx >= 0).all(), name
    return idx


@lru_cache(maxsize=None)
def _flat_indices(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Flat gather indices of A as [M, K] and of B as [K, N] (both C-contiguous)."""
    idx = _gather_index(name)
    return np.ascontiguousarray(idx).ravel(), np.ascontiguousarray(idx.T).ravel()


@lru_cache(maxsize=None)
def _d_index(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row[R, 64], col[R, 64]): the D element lane l's result register r holds."""
    lanes = np.arange(LANES)[None, :]
    if m == 16:
        r = np.arange(4)[:, None]
        return np.broadcast_to(4 * (lanes // 16) + r, (4, LANES)), np.broadcast_to(lanes % 16, (4, LANES))
    r = np.arange(16)[:, None]
    return (np.broadcast_to(8 * (r // 4) + 4 * (lanes // 32) + r % 4, (16, LANES)),
            np.broadcast_to(lanes % 32, (16, LANES)))


@lru_cache(maxsize=None)
def _d_flat(m: int) -> np.ndarray:
    """Flat index into D[M, N] of register r, lane l, in (r, l) order."""
    rows, cols = _d_index(m)
    return np.ascontiguousarray(rows * m + cols).ravel()


@lru_cache(maxsize=None)
def _fp4_index(m: int) -> np.ndarray:
    """int[M * K]: for A[i][k] (C-contiguous [M, K], K = 2048 / M) the position
    lane * 32 + t of the FP4 element holding it: nibble t of lane l holds row l % M,
    k = 32 * (l / M) + t (fact sheet §2, f8f6f4 FP4: 16x16x128 k = 32*(l/16) + t,
    32x32x64 k = 32*(l/32) + t), the low nibble of each byte the even k."""
    lanes = np.arange(LANES)
    idx = np.empty((m, 2048 // m), np.int64)
    for t in range(32):
        idx[lanes % m, 32 * (lanes // m) + t] = lanes * 32 + t
    return idx.ravel()


def _read_fp4(ex, op, w, m: int, b_side: bool) -> np.ndarray:
    """float64 A [n, M, K] (or B [n, K, N]) from 4 registers of FP4 (E2M1) codes, rows of
    A in _row_order like _read_decode's."""
    if op.kind not in ("v", "a") or op.count != 4:
        raise UnsupportedInstruction(f"operand {op.text} is not 4 vector registers ({ex.where()})")
    regs = ex.vregs(op, w, 4)                                   # [n, 4, 64]
    n = regs.shape[0]
    by_lane = np.ascontiguousarray(regs.transpose(0, 2, 1)).view(np.uint8).reshape(n, LANES * 16)
    nibbles = np.stack([by_lane & 0xF, by_lane >> 4], axis=-1).reshape(n, LANES * 32)
    k = 2048 // m
    vals = _fp4_table()[np.take(nibbles, _fp4_index(m), axis=1)].reshape(n, m, k)
    if b_side:
        return np.ascontiguousarray(vals.transpose(0, 2, 1))
    return vals[:, _row_order(m)]


@lru_cache(maxsize=None)
def _fp4_table() -> np.ndarray:
    return numerics.fp4_e2m1_to_f32(np.arange(16, dtype=np.uint8)).astype(np.float64)


@lru_cache(maxsize=None)
def _fp8_table(fmt: str) -> np.ndarray:
    codes = np.arange(256, dtype=np.uint8)
    f = numerics.fp8_e4m3_to_f32 if fmt == FP8 else numerics.fp8_e5m2_to_f32
    return f(codes).astype(np.float64)


def decode_elements(regs: np.ndarray, fmt: str) -> np.ndarray:
    """uint32[n, R, 64] operand registers -> float64[n, 64 * E] element values in
    (lane, element) order."""
    n = regs.shape[0]
    per_lane = np.ascontiguousarray(regs.transpose(0, 2, 1))      # [n, 64, R]
    if fmt in (F16, BF16):
        halves = per_lane.view(np.uint16).reshape(n, -1)          # little-endian: e = 2r + h
        if fmt == F16:
            return halves.view(np.float16).astype(np.float64)
        return (halves.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    if fmt == I8:
        return per_lane.view(np.int8).reshape(n, -1).astype(np.float64)
    codes = per_lane.view(np.uint8).reshape(n, -1)
    return _fp8_table(fmt)[codes]


# ---------------------------------------------------------------- handler
def _formats(ex, inst, spec: Spec) -> tuple[str, str]:
    cbsz = int(inst.mods.get("cbsz", 0))
    abid = int(inst.mods.get("abid", 0))
    blgp = int(inst.mods.get("blgp", 0))
    if not spec.f8f6f4:
        if cbsz or abid or blgp:
            raise UnsupportedInstruction(
                f"{inst.name} with cbsz:{cbsz} abid:{abid} blgp:{blgp}: the broadcast controls of "
                f"non-f8f6f4 MFMAs are unverified and not modelled ({ex.where()})")
        return spec.a_fmt, spec.b_fmt
    if abid:
        raise UnsupportedInstruction(f"{inst.name} with abid:{abid} is not modelled ({ex.where()})")
    fmts = []
    for what, code in (("A (cbsz)", cbsz), ("B (blgp)", blgp)):
        fmt = F8F6F4_FORMATS.get(code)
        if fmt is None:
            raise UnsupportedInstruction(f"{inst.name}: operand {what} format {code} is reserved "
                                         f"({ex.where()})")
        if fmt in (FP6, BF6):
            # The order of the 32 six-bit elements in the 6 VGPRs is not pinned by any
            # source we found (fact sheet §2: UNVERIFIED), so it is not guessed.
            raise UnsupportedInstruction(
                f"{inst.name}: operand {what} format {code} ({fmt}) is not modelled: the packing of "
                f"FP6/BF6 elements in their 6 VGPRs is unverified ({ex.where()})")
        fmts.append(fmt)
    return fmts[0], fmts[1]


def _operand_regs(spec: Spec, fmt: str) -> int:
    return F8F6F4_REGS[fmt] if spec.f8f6f4 else spec.ab_regs


def _f8f6f4_passes(spec: Spec, a_fmt: str, b_fmt: str) -> int:
    """Fact sheet §2 (LLVM 22): 8 / 16 passes when A or B is FP8/BF8, else 4 / 8."""
    if not spec.f8f6f4 or a_fmt in (FP8, BF8) or b_fmt in (FP8, BF8):
        return spec.passes
    return spec.passes // 2


def _scale_bytes(ex, inst, op, w, operand: int) -> np.ndarray:
    """uint8[n, 64]: the E8M0 byte each lane supplies (byte 2*op_sel_hi + op_sel)."""
    op_sel = inst.mods.get("op_sel", (0, 0, 0))
    op_sel_hi = inst.mods.get("op_sel_hi", (0, 0, 0))
    if len(op_sel) > 2 and op_sel[2] or len(op_sel_hi) > 2 and op_sel_hi[2]:
        raise UnsupportedInstruction(f"{inst.name}: op_sel/op_sel_hi bit 2 is not defined ({ex.where()})")
    byte = 2 * int(op_sel_hi[operand]) + int(op_sel[operand])
    if op.kind != "v" or op.count != 1:
        raise UnsupportedInstruction(f"{inst.name}: scale operand {op.text} must be one VGPR ({ex.where()})")
    bits = ex.v32(op, w)
    return ((bits >> np.uint32(8 * byte)) & np.uint32(0xFF)).astype(np.uint8)


def _check_reg_operand(ex, inst, op, count: int, what: str):
    if op.kind not in ("v", "a") or op.count != count:
        raise UnsupportedInstruction(f"{inst.name}: {what} {op.text} must be {count} VGPRs or AGPRs "
                                     f"({ex.where()})")


@lru_cache(maxsize=None)
def _row_order(m: int) -> np.ndarray:
    """int[M]: A's rows in the order that makes the rows of D = A @ B come out as the
    result registers: D'[q] = D[order[q]] and D'.ravel() is register r, lane l at
    r * 64 + l (the same values np.take(D, _d_flat(m)) gathers)."""
    rows, cols = _d_index(m)
    rows, cols = np.ascontiguousarray(rows).ravel(), np.ascontiguousarray(cols).ravel()
    order = rows[::m]
    assert (cols == np.tile(np.arange(m), m)).all() and (rows == np.repeat(order, m)).all()
    assert sorted(order.tolist()) == list(range(m))
    return order


@lru_cache(maxsize=None)
def _unit_index(name: str, fmt_bytes: int, row_ordered: bool) -> np.ndarray:
    """Indices of whole uint32 register units (relative to the operand's first register,
    [R, 64] order) that, viewed as 1- or 2-byte elements, give the operand as A [M, K]
    with its rows in _row_order (row_ordered) or as B transposed, [N, K]. Each 32-bit
    unit holds consecutive k (the element index within a lane runs along K)."""
    per_reg = 4 // fmt_bytes
    spec = MFMA[name]
    per_lane = spec.ab_regs * per_reg
    p = _gather_index(name)
    if row_ordered:
        p = p[_row_order(spec.m)]
    p = p.ravel()
    lane, e = p // per_lane, p % per_lane
    elem = (e // per_reg) * (LANES * per_reg) + lane * per_reg + e % per_reg
    units = elem.reshape(-1, per_reg)
    assert (units == units[:, :1] + np.arange(per_reg)).all() and (units[:, 0] % per_reg == 0).all()
    return np.ascontiguousarray(units[:, 0] // per_reg)


@lru_cache(maxsize=None)
def _b_element_index(name: str, fmt_bytes: int) -> np.ndarray:
    """Indices of B's 1- or 2-byte elements (relative to the operand's first register, the
    registers viewed as elements) in [K, N] order: _unit_index's B units, element by
    element, transposed, so the gather gives B contiguous."""
    per_reg, spec = 4 // fmt_bytes, MFMA[name]
    elem = _unit_index(name, fmt_bytes, False)[:, None] * per_reg + np.arange(per_reg)
    return np.ascontiguousarray(elem.reshape(spec.m, -1).T).ravel()


def _read_decode(ex, op, w, count: int, fmt: str, index: np.ndarray, m: int, k: int,
                 b_side: bool) -> np.ndarray:
    """float64 A [n, M, K] (b_side False) or B [n, K, N] (b_side True), C-contiguous,
    from the `count` registers of op (read with ex's checks) gathered as uint32 units
    (A: _unit_index) or as elements (B: _b_element_index)."""
    if op.kind not in ("v", "a") or op.count != count:
        raise UnsupportedInstruction(f"operand {op.text} is not {count} vector registers ({ex.where()})")
    ex.check_read(op.kind, w, op.index, count)
    f = ex.waves.file(op.kind)
    if isinstance(w, slice) and w == slice(None):
        # Every wave: gather straight from the register file (no copy of the operand).
        flat, base = f.reshape(f.shape[0], -1), op.index * LANES
    else:
        regs = f[w, op.index:op.index + count]
        flat, base = regs.reshape(regs.shape[0], -1), 0
    elem = np.uint16 if fmt in (F16, BF16) else np.uint8
    if b_side:
        per = 4 // np.dtype(elem).itemsize
        vals = np.take(flat.view(elem), index + base * per, axis=1).reshape(-1, k, m)
    else:
        vals = np.take(flat, index + base, axis=1).view(elem).reshape(-1, m, k)
    if fmt == BF16:
        out = np.left_shift(vals, 16, dtype=np.uint32, order="C").view(np.float32).astype(np.float64)
    elif fmt == F16:
        out = vals.view(np.float16).astype(np.float64, order="C")
    elif fmt == I8:
        out = vals.view(np.int8).astype(np.float64, order="C")
    else:
        out = _fp8_table(fmt)[vals]
    return np.ascontiguousarray(out)


class _Prepared:
    """What an MFMA instruction's fields decide, checked once (on first execution)."""

    def __init__(self, inst, spec, a_fmt, b_fmt):
        self.spec = spec
        self.a_fmt, self.b_fmt = a_fmt, b_fmt
        ops = inst.ops
        self.dst, self.a_op, self.b_op, self.c_op = ops[:4]
        self.a_regs, self.b_regs = _operand_regs(spec, a_fmt), _operand_regs(spec, b_fmt)
        self.a_units = None if a_fmt == FP4 else _unit_index(inst.name, 2 if a_fmt in (F16, BF16) else 1, True)
        self.b_index = None if b_fmt == FP4 else _b_element_index(inst.name, 2 if b_fmt in (F16, BF16) else 1)
        order = _row_order(spec.m)
        nb = spec.k // 32
        # Scale lanes of A's rows (in _row_order) and B's columns, [M, nb] each.
        self.sa_lane = (order[:, None] + spec.m * np.arange(nb)[None, :]).ravel()
        self.sb_lane = (np.arange(spec.m)[:, None] + spec.m * np.arange(nb)[None, :]).ravel()
        self.writer = _writer(inst.name, _f8f6f4_passes(spec, a_fmt, b_fmt))
        c_op = self.c_op
        self.c_zero = c_op.kind == "imm"
        self.srcc_is_dst = (not self.c_zero and c_op.index == self.dst.index
                            and c_op.count == self.dst.count)


def _prepare(ex, inst):
    """The _Prepared record, or None when a field is rejected (the checked path then
    raises the same error, in the same order, every time the instruction runs)."""
    spec = MFMA[inst.name]
    try:
        a_fmt, b_fmt = _formats(ex, inst, spec)
    except UnsupportedInstruction:
        return None
    ops = inst.ops
    if len(ops) != (6 if spec.scaled else 4):
        return None
    dst, a_op, b_op, c_op = ops[:4]
    for op, count in ((dst, spec.c_regs), (a_op, _operand_regs(spec, a_fmt)), (b_op, _operand_regs(spec, b_fmt))):
        if op.kind not in ("v", "a") or op.count != count:
            return None
    if any(k in inst.mods for k in ("neg", "neg_lo", "neg_hi", "clamp")):
        return None
    if spec.scaled:
        op_sel = inst.mods.get("op_sel", (0, 0, 0))
        op_sel_hi = inst.mods.get("op_sel_hi", (0, 0, 0))
        if len(op_sel) > 2 and op_sel[2] or len(op_sel_hi) > 2 and op_sel_hi[2]:
            return None
        if any(op.kind != "v" or op.count != 1 for op in ops[4:6]):
            return None
    if c_op.kind == "imm":
        if c_op.text != "0":
            return None
    elif c_op.kind not in ("v", "a") or c_op.count != spec.c_regs or c_op.kind != dst.kind:
        return None
    return _Prepared(inst, spec, a_fmt, b_fmt)


_REJECTED = object()


class _NoWave:
    """Stands in for the executor where only an error location is needed."""

    def __init__(self, inst):
        self.inst = inst

    def where(self) -> str:
        return f"pc {self.inst.pc:#x} `{self.inst.text}`"


def check_fields(inst) -> None:
    """The registry's static check: raises for exactly the fields _prepare rejects, with
    _formats' precise reason where it is the format."""
    at = _NoWave(inst)
    _formats(at, inst, MFMA[inst.name])
    if _prepare(at, inst) is None:
        raise UnsupportedInstruction(f"{inst.name}: operand or modifier fields not modelled ({at.where()})")


def mfma(ex, inst, w):
    """The MFMA handler: the arithmetic of _mfma_checked (bit for bit), with the checks
    of the instruction's fields done once and the operand gathers fused with the
    register reads; _mfma_checked runs for instructions whose fields are rejected."""
    prep = inst.__dict__.get("_mfma_prepared")
    if prep is None:
        prep = _prepare(ex, inst) or _REJECTED
        inst._mfma_prepared = prep
    if prep is _REJECTED:
        return _mfma_checked(ex, inst, w)
    if not ex.waves.exec_all(w):
        raise UnsupportedInstruction(f"{inst.name} with a partial EXEC mask: MFMA behaviour for "
                                     f"disabled lanes is unverified ({ex.where()})")
    spec = prep.spec
    m, k = spec.m, spec.k
    ex.role = None
    a = _operand(ex, prep.a_op, w, prep.a_regs, prep.a_fmt, prep.a_units, m, k, False)
    b = _operand(ex, prep.b_op, w, prep.b_regs, prep.b_fmt, prep.b_index, m, k, True)
    n = a.shape[0]
    if spec.scaled:
        sa = _scale_bytes(ex, inst, inst.ops[4], w, 0)
        sb = _scale_bytes(ex, inst, inst.ops[5], w, 1)
    if prep.c_zero:
        c = None
    else:
        ex.role = "c"
        ex.srcc_is_dst = prep.srcc_is_dst
        c_op = prep.c_op
        ex.check_read(c_op.kind, w, c_op.index, spec.c_regs)
        # [n, c_regs, 64]: a view where w is a slice (d += c reads it in place, no copy)
        c = ex.waves.file(c_op.kind)[w, c_op.index:c_op.index + spec.c_regs].view(
            np.int32 if spec.a_fmt == I8 else np.float32)
        ex.role = None
        ex.srcc_is_dst = False
    with np.errstate(all="ignore"):
        if spec.scaled:
            nb = k // 32
            fa = numerics.e8m0_to_f64(np.take(sa, prep.sa_lane, axis=1)).reshape(n, m, nb)
            fb = numerics.e8m0_to_f64(np.take(sb, prep.sb_lane, axis=1)).reshape(n, m, nb)
            a = (a.reshape(n, m, nb, 32) * fa[..., None]).reshape(n, m, k)
            b = (b.reshape(n, nb, 32, m) * fb.transpose(0, 2, 1)[:, :, None, :]).reshape(n, k, m)
        d = np.matmul(a, b).reshape(n, spec.c_regs, LANES)      # rows in _row_order: register order
        if c is not None:
            d += c
        if spec.a_fmt == I8:
            ex.set_v(prep.dst, w, _i32_result(ex, inst, d), None, prep.writer)
        else:
            ex.set_v_f32(prep.dst, w, d, prep.writer)


def _operand(ex, op, w, count, fmt, units, m, k, b_side):
    if fmt == FP4:
        return _read_fp4(ex, op, w, m, b_side)
    return _read_decode(ex, op, w, count, fmt, units, m, k, b_side)


def _i32_result(ex, inst, d: np.ndarray) -> np.ndarray:
    """uint32 bits of the integer MFMA result d (float64 holding exact integers: products
    of i8 are below 2^14, K <= 64 of them and an i32 C stay far below 2^53). A result
    outside int32 would wrap or saturate; which one the hardware does is unverified."""
    if d.size and (d.max() > np.iinfo(np.int32).max or d.min() < np.iinfo(np.int32).min):
        raise UnsupportedInstruction(f"{inst.name}: the i32 result overflows; wrap-around or "
                                     f"saturation is unverified ({ex.where()})")
    return d.astype(np.int64).astype(np.uint32)


def _mfma_checked(ex, inst, w):
    spec = MFMA[inst.name]
    a_fmt, b_fmt = _formats(ex, inst, spec)
    ops = inst.ops
    if len(ops) != (6 if spec.scaled else 4):
        raise UnsupportedInstruction(f"{inst.name}: unexpected operand list ({ex.where()})")
    dst, a_op, b_op, c_op = ops[:4]
    _check_reg_operand(ex, inst, dst, spec.c_regs, "vdst")
    _check_reg_operand(ex, inst, a_op, _operand_regs(spec, a_fmt), "src A")
    _check_reg_operand(ex, inst, b_op, _operand_regs(spec, b_fmt), "src B")
    if any(k in inst.mods for k in ("neg", "neg_lo", "neg_hi", "clamp")):
        raise UnsupportedInstruction(f"{inst.name}: modifiers {inst.mods} are not modelled ({ex.where()})")
    exec_bits = ex.exec_bits(w)
    if not exec_bits.all():
        raise UnsupportedInstruction(f"{inst.name} with a partial EXEC mask: MFMA behaviour for "
                                     f"disabled lanes is unverified ({ex.where()})")

    # Operand reads (hazard role: A/B/scales default, srcC 'c').
    ex.role = None
    a_regs = ex.vregs(a_op, w, spec.ab_regs)
    b_regs = ex.vregs(b_op, w, spec.ab_regs)
    if spec.scaled:
        sa = _scale_bytes(ex, inst, ops[4], w, 0)
        sb = _scale_bytes(ex, inst, ops[5], w, 1)
    n = a_regs.shape[0]
    if c_op.kind == "imm":
        if c_op.text != "0":
            raise UnsupportedInstruction(f"{inst.name}: srcC constant {c_op.text} is not modelled, only 0 "
                                         f"({ex.where()})")
        c = None
    else:
        _check_reg_operand(ex, inst, c_op, spec.c_regs, "srcC")
        if c_op.kind != dst.kind:
            raise UnsupportedInstruction(f"{inst.name}: srcC and vdst must be the same register file "
                                         f"({ex.where()})")
        ex.role = "c"
        ex.srcc_is_dst = c_op.index == dst.index and c_op.count == dst.count
        c = ex.vregs(c_op, w, spec.c_regs).view(np.float32).reshape(n, -1)     # register order
        ex.role = None
        ex.srcc_is_dst = False

    a_idx, b_idx = _flat_indices(inst.name)
    a = np.take(decode_elements(a_regs, a_fmt), a_idx, axis=1).reshape(n, spec.m, spec.k)
    b = np.take(decode_elements(b_regs, b_fmt), b_idx, axis=1).reshape(n, spec.k, spec.m)
    with np.errstate(all="ignore"):
        if spec.scaled:
            # D = sum_b 2^(sa-127) 2^(sb-127) (block-b dot). The power-of-two factors are
            # exact in float64 over the whole E8M0 range (2^-127..2^127, operands <= 2^16),
            # so they are applied to the operands: one product over K. 0xFF -> NaN.
            nb = spec.k // 32
            lane = np.arange(spec.m)[:, None] + spec.m * np.arange(nb)[None, :]    # [M, nb]
            fa = numerics.e8m0_to_f64(np.take(sa, lane.ravel(), axis=1)).reshape(n, spec.m, nb)
            fb = numerics.e8m0_to_f64(np.take(sb, lane.ravel(), axis=1)).reshape(n, spec.m, nb)
            a = (a.reshape(n, spec.m, nb, 32) * fa[..., None]).reshape(n, spec.m, spec.k)
            b = (b.reshape(n, nb, 32, spec.m) * fb.transpose(0, 2, 1)[:, :, None, :]).reshape(n, spec.k, spec.m)
        dot = np.matmul(a, b).reshape(n, spec.m * spec.m)
        d = np.take(dot, _d_flat(spec.m), axis=1)
        if c is not None:
            d = d + c
        out = d.astype(np.float32).view(np.uint32).reshape(n, spec.c_regs, LANES)
    ex.set_v(dst, w, out, exec_bits, _writer(inst.name, spec.passes))


def _writer(name: str, passes: int) -> int:
    """Writer code of the destination for the wait-state checks (all MFMAs here are XDL)."""
    make = getattr(hazards, "mfma_writer", None)
    return make(name, passes) if make is not None else hazards.MFMA_BASE + passes


for _name in MFMA:
    handles(_name, klass="mfma", check=check_fields)(mfma)

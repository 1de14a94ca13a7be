"""Scalar ALU (SOP1/SOP2/SOPK/SOPC) and program control (SOPP).

Simple ops are one-line lane functions in tables keyed by the ISA's names; the driver
reads sources, applies the function, writes the destination and SCC.
"""
from __future__ import annotations

import numpy as np

from ..decode import branch_target, waitcnt_fields
from ..errors import UnsupportedInstruction
from ..registry import handles

U32, U64 = np.uint32, np.uint64
M32 = np.uint64(0xFFFFFFFF)


def _i32(x):
    return x.astype(np.uint32).view(np.int32)


def _i64(x):
    return x.astype(np.uint64).view(np.int64)


def _sh(x, bits):
    return (x & np.uint32(bits - 1)).astype(x.dtype)


# ---------------------------------------------------------------- SOP2 (32-bit)
# name -> fn(a, b, scc) -> (result uint64 (low 32 used), scc or None)
SOP2_32 = {
    "s_add_u32": lambda a, b, c: (a + b, (a + b) >> np.uint64(32) != 0),
    "s_sub_u32": lambda a, b, c: ((a - b) & M32, b > a),
    "s_addc_u32": lambda a, b, c: (a + b + c, (a + b + c) >> np.uint64(32) != 0),
    "s_subb_u32": lambda a, b, c: ((a - b - c) & M32, b + c > a),
    "s_add_i32": lambda a, b, c: _signed_add(a, b),
    "s_sub_i32": lambda a, b, c: _signed_sub(a, b),
    "s_min_i32": lambda a, b, c: (np.where(_i32(a) < _i32(b), a, b), _i32(a) < _i32(b)),
    "s_min_u32": lambda a, b, c: (np.minimum(a, b), a < b),
    "s_max_i32": lambda a, b, c: (np.where(_i32(a) > _i32(b), a, b), _i32(a) > _i32(b)),
    "s_max_u32": lambda a, b, c: (np.maximum(a, b), a > b),
    "s_and_b32": lambda a, b, c: (a & b, (a & b) != 0),
    "s_or_b32": lambda a, b, c: (a | b, (a | b) != 0),
    "s_xor_b32": lambda a, b, c: (a ^ b, (a ^ b) != 0),
    "s_andn2_b32": lambda a, b, c: (a & ~b & M32, (a & ~b & M32) != 0),
    "s_orn2_b32": lambda a, b, c: ((a | ~b) & M32, ((a | ~b) & M32) != 0),
    "s_nand_b32": lambda a, b, c: (~(a & b) & M32, (~(a & b) & M32) != 0),
    "s_nor_b32": lambda a, b, c: (~(a | b) & M32, (~(a | b) & M32) != 0),
    "s_xnor_b32": lambda a, b, c: (~(a ^ b) & M32, (~(a ^ b) & M32) != 0),
    "s_lshl_b32": lambda a, b, c: ((a << (b & np.uint64(31))) & M32, ((a << (b & np.uint64(31))) & M32) != 0),
    "s_lshr_b32": lambda a, b, c: (a >> (b & np.uint64(31)), (a >> (b & np.uint64(31))) != 0),
    "s_ashr_i32": lambda a, b, c: _ashr32(a, b),
    "s_mul_i32": lambda a, b, c: ((a * b) & M32, None),
    "s_mul_hi_u32": lambda a, b, c: ((a * b) >> np.uint64(32), None),
    "s_mul_hi_i32": lambda a, b, c: (((_sx(a) * _sx(b)) >> 32).astype(np.uint64) & M32, None),
    "s_cselect_b32": lambda a, b, c: (np.where(c != 0, a, b), None),
    "s_bfm_b32": lambda a, b, c: ((((np.uint64(1) << (a & np.uint64(31))) - np.uint64(1))
                                   << (b & np.uint64(31))) & M32, None),
    "s_lshl1_add_u32": lambda a, b, c: _shl_add(a, b, 1),
    "s_lshl2_add_u32": lambda a, b, c: _shl_add(a, b, 2),
    "s_lshl3_add_u32": lambda a, b, c: _shl_add(a, b, 3),
    "s_lshl4_add_u32": lambda a, b, c: _shl_add(a, b, 4),
    "s_absdiff_i32": lambda a, b, c: _absdiff(a, b),
    "s_bfe_u32": lambda a, b, c: _bfe(a, b, signed=False),
    "s_bfe_i32": lambda a, b, c: _bfe(a, b, signed=True),
    "s_pack_ll_b32_b16": lambda a, b, c: ((a & np.uint64(0xFFFF)) | ((b & np.uint64(0xFFFF)) << np.uint64(16)), None),
    "s_pack_lh_b32_b16": lambda a, b, c: ((a & np.uint64(0xFFFF)) | (b & np.uint64(0xFFFF0000)), None),
    "s_pack_hh_b32_b16": lambda a, b, c: ((a >> np.uint64(16)) | (b & np.uint64(0xFFFF0000)), None),
}


def _sx(a):
    return a.astype(np.uint32).view(np.int32).astype(np.int64)


def _signed_add(a, b):
    """Wrapped sum and signed overflow (SCC) of 32-bit operands."""
    exact = _sx(a) + _sx(b)
    return exact.astype(np.uint64) & M32, (exact < -(1 << 31)) | (exact >= (1 << 31))


def _signed_sub(a, b):
    exact = _sx(a) - _sx(b)
    return exact.astype(np.uint64) & M32, (exact < -(1 << 31)) | (exact >= (1 << 31))


def _ashr32(a, b):
    r = (_sx(a) >> (b & np.uint64(31)).astype(np.int64)).astype(np.uint64) & M32
    return r, r != 0


def _shl_add(a, b, n):
    r = (a << np.uint64(n)) + b
    return r & M32, r >> np.uint64(32) != 0


def _absdiff(a, b):
    r = np.abs(_sx(a) - _sx(b)).astype(np.uint64) & M32
    return r, r != 0


def _bfe(a, b, signed):
    offset = b & np.uint64(31)
    width = (b >> np.uint64(16)) & np.uint64(0x7F)
    field = (a >> offset) & ((np.uint64(1) << np.minimum(width, np.uint64(32))) - np.uint64(1))
    if signed:
        w = np.minimum(width, np.uint64(32)).astype(np.int64)
        v = field.astype(np.int64)
        sign = np.where(w > 0, (v >> np.maximum(w - 1, 0)) & 1, 0)
        v = np.where(sign == 1, v - (np.int64(1) << w), v)
        field = v.astype(np.uint64) & M32
    return field, field != 0


SOP2_64 = {
    "s_and_b64": lambda a, b, c: (a & b, (a & b) != 0),
    "s_or_b64": lambda a, b, c: (a | b, (a | b) != 0),
    "s_xor_b64": lambda a, b, c: (a ^ b, (a ^ b) != 0),
    "s_andn2_b64": lambda a, b, c: (a & ~b, (a & ~b) != 0),
    "s_orn2_b64": lambda a, b, c: (a | ~b, (a | ~b) != 0),
    "s_nand_b64": lambda a, b, c: (~(a & b), ~(a & b) != 0),
    "s_nor_b64": lambda a, b, c: (~(a | b), ~(a | b) != 0),
    "s_xnor_b64": lambda a, b, c: (~(a ^ b), ~(a ^ b) != 0),
    "s_cselect_b64": lambda a, b, c: (np.where(c != 0, a, b), None),
}
SOP2_64_SHIFT = {  # 64-bit value, 32-bit shift amount
    "s_lshl_b64": lambda a, b: a << (b & np.uint64(63)),
    "s_lshr_b64": lambda a, b: a >> (b & np.uint64(63)),
    "s_ashr_i64": lambda a, b: (_i64(a) >> (b & np.uint64(63)).astype(np.int64)).astype(np.uint64),
}


@handles(*SOP2_32, klass="salu")
def sop2_32(ex, inst, w):
    d, a, b = inst.ops
    fn = SOP2_32[inst.name]
    c = ex.waves.scc[w].astype(np.uint64)
    r, scc = fn(ex.s32(a, w).astype(np.uint64), ex.s32(b, w).astype(np.uint64), c)
    ex.set_s32(d, w, (np.asarray(r, np.uint64) & M32).astype(np.uint32))
    if scc is not None:
        ex.waves.scc[w] = scc


@handles(*SOP2_64, klass="salu")
def sop2_64(ex, inst, w):
    d, a, b = inst.ops
    c = ex.waves.scc[w].astype(np.uint64)
    r, scc = SOP2_64[inst.name](ex.s64(a, w), ex.s64(b, w), c)
    ex.set_s64(d, w, r)
    if scc is not None:
        ex.waves.scc[w] = scc


@handles(*SOP2_64_SHIFT, klass="salu")
def sop2_64_shift(ex, inst, w):
    d, a, b = inst.ops
    r = SOP2_64_SHIFT[inst.name](ex.s64(a, w), ex.s32(b, w).astype(np.uint64))
    ex.set_s64(d, w, r)
    ex.waves.scc[w] = r != 0


# ---------------------------------------------------------------- SOP1
SOP1_32 = {
    "s_mov_b32": lambda a: (a, None),
    "s_not_b32": lambda a: (~a & M32, (~a & M32) != 0),
    "s_brev_b32": lambda a: (_brev32(a), None),
    "s_abs_i32": lambda a: (np.abs(_sx(a)).astype(np.uint64) & M32, (np.abs(_sx(a)) & 0xFFFFFFFF) != 0),
    "s_sext_i32_i8": lambda a: (_sext(a, 8), None),
    "s_sext_i32_i16": lambda a: (_sext(a, 16), None),
    "s_ff1_i32_b32": lambda a: (_ff1(a, 32), None),
    "s_bcnt1_i32_b32": lambda a: (_popcount(a), _popcount(a) != 0),
    "s_bcnt0_i32_b32": lambda a: (np.uint64(32) - _popcount(a), (np.uint64(32) - _popcount(a)) != 0),
    "s_flbit_i32_b32": lambda a: (_flbit(a), None),
}
SOP1_64 = {
    "s_mov_b64": lambda a: (a, None),
    "s_not_b64": lambda a: (~a, ~a != 0),
}


def _brev32(a):
    r = np.zeros_like(a)
    for bit in range(32):
        r |= ((a >> np.uint64(bit)) & np.uint64(1)) << np.uint64(31 - bit)
    return r


def _sext(a, bits):
    v = (a & np.uint64((1 << bits) - 1)).astype(np.int64)
    v = np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v.astype(np.uint64) & M32


def _popcount(a):
    return np.array([bin(int(x)).count("1") for x in np.atleast_1d(a)], dtype=np.uint64).reshape(np.shape(a))


def _ff1(a, bits):
    out = np.full(np.shape(a), 0xFFFFFFFF, np.uint64)
    for bit in reversed(range(bits)):
        out = np.where((a >> np.uint64(bit)) & np.uint64(1) == 1, np.uint64(bit), out)
    return out


def _flbit(a):
    out = np.full(np.shape(a), 0xFFFFFFFF, np.uint64)
    for bit in range(32):
        out = np.where((a >> np.uint64(bit)) & np.uint64(1) == 1, np.uint64(31 - bit), out)
    return out


@handles(*SOP1_32, klass="salu")
def sop1_32(ex, inst, w):
    d, a = inst.ops
    r, scc = SOP1_32[inst.name](ex.s32(a, w).astype(np.uint64))
    ex.set_s32(d, w, (np.asarray(r, np.uint64) & M32).astype(np.uint32))
    if scc is not None:
        ex.waves.scc[w] = scc


@handles(*SOP1_64, klass="salu")
def sop1_64(ex, inst, w):
    d, a = inst.ops
    r, scc = SOP1_64[inst.name](ex.s64(a, w))
    ex.set_s64(d, w, r)
    if scc is not None:
        ex.waves.scc[w] = scc


SAVEEXEC = {
    "s_and_saveexec_b64": lambda e, s: s & e,
    "s_or_saveexec_b64": lambda e, s: s | e,
    "s_xor_saveexec_b64": lambda e, s: s ^ e,
    "s_andn2_saveexec_b64": lambda e, s: s & ~e,
    "s_orn2_saveexec_b64": lambda e, s: s | ~e,
    "s_andn1_saveexec_b64": lambda e, s: ~s & e,
}


@handles(*SAVEEXEC, klass="salu")
def saveexec(ex, inst, w):
    d, s = inst.ops
    from ..decode import SPECIAL_SGPRS, Operand
    exec_op = Operand("s", *SPECIAL_SGPRS["exec"])
    old = ex.s64(exec_op, w)
    new = SAVEEXEC[inst.name](old, ex.s64(s, w))
    ex.set_s64(d, w, old)
    ex.set_s64(exec_op, w, new)
    ex.waves.scc[w] = new != 0


@handles("s_getpc_b64", klass="salu")
def s_getpc(ex, inst, w):
    ex.set_s64(inst.ops[0], w, np.full(ex._n(w), inst.pc + 4, np.uint64))


# ---------------------------------------------------------------- SOPK
@handles("s_movk_i32", klass="salu")
def s_movk(ex, inst, w):
    d, k = inst.ops
    ex.set_s32(d, w, np.full(ex._n(w), int(k.text, 0) & 0xFFFF, np.int64).astype(np.int16).astype(np.int32).view(np.uint32))


@handles("s_addk_i32", klass="salu")
def s_addk(ex, inst, w):
    d, k = inst.ops
    imm = np.int64(np.int16(np.uint16(int(k.text, 0) & 0xFFFF)))
    a = ex.s32(d, w).astype(np.uint64)
    r, overflow = _signed_add(a, np.full_like(a, np.uint64(int(imm) & 0xFFFFFFFF)))
    ex.set_s32(d, w, r.astype(np.uint32))
    ex.waves.scc[w] = overflow


@handles("s_mulk_i32", klass="salu")
def s_mulk(ex, inst, w):
    d, k = inst.ops
    imm = np.int64(np.int16(np.uint16(int(k.text, 0) & 0xFFFF)))
    r = (_sx(ex.s32(d, w).astype(np.uint64)) * imm) & 0xFFFFFFFF
    ex.set_s32(d, w, r.astype(np.uint32))


# ---------------------------------------------------------------- SOPC
SOPC = {
    "eq": np.equal, "lg": np.not_equal, "gt": np.greater, "ge": np.greater_equal,
    "lt": np.less, "le": np.less_equal,
}


def _sopc_names():
    for t in ("i32", "u32"):
        for c in SOPC:
            yield f"s_cmp_{c}_{t}"
    yield "s_cmp_eq_u64"
    yield "s_cmp_lg_u64"


@handles(*_sopc_names(), klass="salu")
def sopc(ex, inst, w):
    cond, t = inst.name.split("_")[2:]
    a, b = inst.ops
    if t == "u64":
        x, y = ex.s64(a, w), ex.s64(b, w)
    else:
        x, y = ex.s32(a, w), ex.s32(b, w)
        if t == "i32":
            x, y = x.view(np.int32), y.view(np.int32)
    ex.waves.scc[w] = SOPC[cond](x, y)


@handles("s_cmpk_eq_u32", "s_cmpk_lg_u32", "s_cmpk_gt_u32", "s_cmpk_ge_u32", "s_cmpk_lt_u32",
         "s_cmpk_le_u32", "s_cmpk_eq_i32", "s_cmpk_lg_i32", "s_cmpk_gt_i32", "s_cmpk_ge_i32",
         "s_cmpk_lt_i32", "s_cmpk_le_i32", klass="salu")
def sopk_cmp(ex, inst, w):
    _, _, cond, t = inst.name.split("_")
    a, k = inst.ops
    x = ex.s32(a, w)
    imm = int(k.text, 0) & 0xFFFF
    if t == "i32":
        x = x.view(np.int32)
        imm = imm - 0x10000 if imm >= 0x8000 else imm
    ex.waves.scc[w] = SOPC[cond](x.astype(np.int64), imm)


@handles("s_bitcmp0_b32", "s_bitcmp1_b32", klass="salu")
def s_bitcmp(ex, inst, w):
    a, b = inst.ops
    bit = (ex.s32(a, w) >> (ex.s32(b, w) & np.uint32(31))) & np.uint32(1)
    ex.waves.scc[w] = bit == (1 if inst.name.startswith("s_bitcmp1") else 0)


# ---------------------------------------------------------------- SOPP
def _branch(ex, inst, w, take: np.ndarray):
    target = branch_target(inst)
    ex.next_pc = np.where(take, target, inst.pc + inst.size).astype(np.int64)


@handles("s_branch", klass="branch")
def s_branch(ex, inst, w):
    _branch(ex, inst, w, np.ones(ex._n(w), bool))


@handles("s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz",
         "s_cbranch_execz", "s_cbranch_execnz", klass="branch")
def s_cbranch(ex, inst, w):
    cond = inst.name[len("s_cbranch_"):]
    if cond.startswith("scc"):
        take = ex.waves.scc[w] == (cond == "scc1")
    else:
        reg = 106 if cond.startswith("vcc") else 126
        if cond.startswith("vcc"):
            ex.check_read("s", w, reg, 2)
        nonzero = (ex.waves.sgpr[w, reg] | ex.waves.sgpr[w, reg + 1]) != 0
        take = ~nonzero if cond.endswith("z") and not cond.endswith("nz") else nonzero
    _branch(ex, inst, w, take)


@handles("s_endpgm", klass="end")
def s_endpgm(ex, inst, w):
    ex.control = "end"


@handles("s_barrier", klass="barrier")
def s_barrier(ex, inst, w):
    ex.control = "barrier"


@handles("s_waitcnt", klass="waitcnt")
def s_waitcnt(ex, inst, w):
    vmcnt, _expcnt, lgkmcnt = waitcnt_fields(inst)
    if vmcnt < 63:
        ex.retire(w, "vm", vmcnt)
    if lgkmcnt < 15:
        ex.retire(w, "lgkm", lgkmcnt)


@handles("s_nop", "s_setprio", "s_sleep", "s_code_end", "s_sethalt", "s_ttracedata", klass="nop")
def s_nop(ex, inst, w):
    if inst.name == "s_sethalt" and int(inst.ops[0].text, 0) & 1:
        raise UnsupportedInstruction(f"s_sethalt 1 halts the wave; not modelled ({ex.where()})")
    if inst.name == "s_code_end":
        raise UnsupportedInstruction(f"executed s_code_end padding: fell off the end of the kernel "
                                     f"({ex.where()})")
    if inst.name == "s_sleep":
        ex.control = "sleep"          # a spin-wait gives way (kernel.run, concurrent.py)

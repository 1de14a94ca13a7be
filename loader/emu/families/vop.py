"""Vector ALU: VOP1, VOP2, VOP3 and VOPC, with EXEC masking, VCC and modifiers.

Every simple op is one entry of a table keyed by its ISA name:
    name: (destination type, source types, lane function)
The family driver (`valu`) is the one place that reads operands by type (neg/abs,
op_sel halves, DPP lane moves, f32 denormal flushing), calls the lane function on
whole [waves, 64] arrays, applies clamp/omod, and writes the lanes EXEC enables.
"""
from __future__ import annotations

import functools

import numpy as np

from .. import fast, hazards
from ..errors import UnsupportedInstruction
from ..registry import handles
from ..state import LANES, bits_to_mask
from . import dpp

F32, F16, F64, U32, I32, U64, U16, I16 = "f32", "f16", "f64", "u32", "i32", "u64", "u16", "i16"
M32 = np.uint64(0xFFFFFFFF)
F32_MIN_NORMAL = np.float32(1.1754944e-38)
TRANS_OPS = {"v_exp_f32", "v_log_f32", "v_rcp_f32", "v_rcp_iflag_f32", "v_rsq_f32", "v_sqrt_f32",
             "v_sin_f32", "v_cos_f32", "v_exp_f16", "v_log_f16", "v_rcp_f16", "v_rsq_f16",
             "v_sqrt_f16", "v_sin_f16", "v_cos_f16"}


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def _fma_f32(a, b, c):
    # The f32 product is exact in f64; rounding the f64 sum to f32 can differ from a single
    # rounding only when the f64 sum itself was a tie-breaking rounding (rare, documented).
    return (_f64(a) * _f64(b) + _f64(c)).astype(np.float32)


def _cvt_u32(x):
    x = np.nan_to_num(_f64(x), nan=0.0)
    return np.clip(np.trunc(x), 0, 0xFFFFFFFF).astype(np.uint64)


def _cvt_i32(x):
    x = np.nan_to_num(_f64(x), nan=0.0)
    return (np.clip(np.trunc(x), -(1 << 31), (1 << 31) - 1).astype(np.int64)).astype(np.uint64) & M32


def _sx32(a):
    a = np.asarray(a, dtype=np.uint64) & M32
    return a.astype(np.int64) - ((a >> np.uint64(31)).astype(np.int64) << 32)


def _u24(a):
    return np.asarray(a, dtype=np.uint64) & np.uint64(0xFFFFFF)


def _i24(a):
    v = (np.asarray(a, dtype=np.uint64) & np.uint64(0xFFFFFF)).astype(np.int64)
    return np.where(v >= 1 << 23, v - (1 << 24), v)


def _bfe_u(a, off, width):
    off, width = off & np.uint64(31), width & np.uint64(31)
    return (a >> off) & ((np.uint64(1) << width) - np.uint64(1))


def _bfe_i(a, off, width):
    field = _bfe_u(a, off, width).astype(np.int64)
    wid = (width & np.uint64(31)).astype(np.int64)
    sign = np.where(wid > 0, (field >> np.maximum(wid - 1, 0)) & 1, 0)
    return np.where(sign == 1, field - (np.int64(1) << wid), field).astype(np.uint64) & M32


def _perm(a, b, sel):
    """v_perm_b32: each selector byte picks a byte of {a:b} (b is bytes 0-3), 12 = 0x00,
    >= 13 = 0xFF, 8..11 replicate the sign bit of bytes 1, 3, 5, 7."""
    combined = (np.asarray(a, np.uint64) << np.uint64(32)) | np.asarray(b, np.uint64)
    out = np.zeros(np.broadcast(a, b, sel).shape, np.uint64)
    for i in range(4):
        s = (np.asarray(sel, np.uint64) >> np.uint64(8 * i)) & np.uint64(0xFF)
        byte = (combined >> (np.minimum(s, np.uint64(7)) * np.uint64(8))) & np.uint64(0xFF)
        sign_bit = (combined >> (np.uint64(16) * (s & np.uint64(3)) + np.uint64(15))) & np.uint64(1)
        byte = np.where(s >= 13, 0xFF, np.where(s == 12, 0, np.where(s >= 8, sign_bit * np.uint64(0xFF), byte)))
        out |= byte.astype(np.uint64) << np.uint64(8 * i)
    return out


def _alignbit(a, b, c):
    return (((np.asarray(a, np.uint64) << np.uint64(32)) | b) >> (c & np.uint64(31))) & M32


def _med3(a, b, c):
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


# v_min_f32 / v_max_f32 as the CDNA4 ISA reference gives them (section 12.7, VOP2; v_min3,
# v_max3 and v_med3_f32 of section 12.10 are defined through them), lane by lane:
#   1. MODE.IEEE and S0 a signaling NaN: S0 quieted (its payload with the quiet bit set);
#   2. MODE.IEEE and S1 a signaling NaN: S1 quieted;
#   3. S0 a NaN: S1 (itself when a NaN too);  4. S1 a NaN: S0;
#   5. otherwise the smaller (larger) with -0 < +0; of two equal values S1 (the same bits).
# np.fmin/np.fmax are not that: which NaN or zero they return depends on the array's
# length (their SIMD loop), so the same lanes could give different bits run to run.
_QUIET_BIT = np.uint32(0x00400000)


def _select_f32(ieee: bool, a, b, take_a):
    """The pseudocode's NaN steps around the ordered choice take_a (a where true, else b)."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    a_nan, b_nan = np.isnan(a), np.isnan(b)
    r = np.where(a_nan, b, np.where(b_nan, a, np.where(take_a, a, b)))
    if ieee:
        ab, bb = a.view(np.uint32), b.view(np.uint32)
        a_snan = a_nan & ((ab & _QUIET_BIT) == 0)
        b_snan = b_nan & ((bb & _QUIET_BIT) == 0)
        if a_snan.any() or b_snan.any():
            quiet = np.where(a_snan, ab | _QUIET_BIT, bb | _QUIET_BIT).view(np.float32)
            r = np.where(a_snan | b_snan, quiet, r)
    return r.astype(np.float32)


def _zeros_ordered(a, b):
    """a is -0 and b is +0: the one pair the pseudocode orders although a == b."""
    return (a == 0) & (b == 0) & np.signbit(a) & ~np.signbit(b)


def _fmin(ieee: bool, a, b):
    return _select_f32(ieee, a, b, (a < b) | _zeros_ordered(a, b))


def _fmax(ieee: bool, a, b):
    return _select_f32(ieee, a, b, (a > b) | _zeros_ordered(b, a))


def _fmed3(ieee: bool, a, b, c):
    """V_MED3_F32: with any NaN operand v_min3_f32, else v_max_f32 of the two operands
    that are not the maximum (the first of S0, S1 equal to it by ==, else S2)."""
    top = _fmax(ieee, _fmax(ieee, a, b), c)
    med = np.where(top == a, _fmax(ieee, b, c), np.where(top == b, _fmax(ieee, a, c), _fmax(ieee, a, b)))
    any_nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    return np.where(any_nan, _fmin(ieee, _fmin(ieee, a, b), c), med).astype(np.float32)


# Ops whose lane function also takes MODE.IEEE (its first argument).
IEEE_MODE_OPS = {
    "v_min_f32": (F32, (F32, F32), _fmin),
    "v_max_f32": (F32, (F32, F32), _fmax),
    "v_min3_f32": (F32, (F32, F32, F32), lambda ieee, a, b, c: _fmin(ieee, _fmin(ieee, a, b), c)),
    "v_max3_f32": (F32, (F32, F32, F32), lambda ieee, a, b, c: _fmax(ieee, _fmax(ieee, a, b), c)),
    "v_med3_f32": (F32, (F32, F32, F32), _fmed3),
}


def _exp2(x):
    return np.exp2(_f64(x)).astype(np.float32)


def _popcount32(a):
    a = np.asarray(a, np.uint64)
    return np.bitwise_count(a) if hasattr(np, "bitwise_count") else np.vectorize(lambda v: bin(int(v)).count("1"))(a).astype(np.uint64)


# name: (dst type, source types, lane function)
VOP = {
    # f32 arithmetic
    "v_add_f32": (F32, (F32, F32), lambda a, b: a + b),
    "v_sub_f32": (F32, (F32, F32), lambda a, b: a - b),
    "v_subrev_f32": (F32, (F32, F32), lambda a, b: b - a),
    "v_mul_f32": (F32, (F32, F32), lambda a, b: a * b),
    "v_mul_legacy_f32": (F32, (F32, F32), lambda a, b: np.where((a == 0) | (b == 0), np.float32(0), a * b)),
    "v_fma_f32": (F32, (F32, F32, F32), _fma_f32),
    "v_fmac_f32": (F32, (F32, F32, "dst:f32"), _fma_f32),
    "v_mac_f32": (F32, (F32, F32, "dst:f32"), lambda a, b, c: (a * b) + c),
    "v_mad_f32": (F32, (F32, F32, F32), lambda a, b, c: (a * b) + c),
    "v_ldexp_f32": (F32, (F32, I32), lambda a, b: np.ldexp(_f64(a), np.clip(b, -1000, 1000)).astype(np.float32)),
    # LLVM ConstantFolding (amdgcn_fract): v_fract is OpenCL fract, fmin(x - floor(x), 0x1.fffffep-1).
    "v_fract_f32": (F32, (F32,), lambda a: np.minimum((a - np.floor(a)).astype(np.float32),
                                                      np.float32(0.99999994))),
    "v_floor_f32": (F32, (F32,), np.floor),
    "v_ceil_f32": (F32, (F32,), np.ceil),
    "v_trunc_f32": (F32, (F32,), np.trunc),
    "v_rndne_f32": (F32, (F32,), np.rint),
    # transcendentals (hardware is ~1 ulp; computed exactly here, see TRANS_OPS for hazards)
    "v_exp_f32": (F32, (F32,), _exp2),
    "v_log_f32": (F32, (F32,), lambda a: np.log2(_f64(a)).astype(np.float32)),
    "v_rcp_f32": (F32, (F32,), lambda a: (1.0 / _f64(a)).astype(np.float32)),
    "v_rcp_iflag_f32": (F32, (F32,), lambda a: (1.0 / _f64(a)).astype(np.float32)),
    "v_rsq_f32": (F32, (F32,), lambda a: (1.0 / np.sqrt(_f64(a))).astype(np.float32)),
    "v_sqrt_f32": (F32, (F32,), lambda a: np.sqrt(_f64(a)).astype(np.float32)),
    "v_sin_f32": (F32, (F32,), lambda a: np.sin(2 * np.pi * _f64(a)).astype(np.float32)),
    "v_cos_f32": (F32, (F32,), lambda a: np.cos(2 * np.pi * _f64(a)).astype(np.float32)),
    # conversions
    "v_cvt_f32_u32": (F32, (U32,), lambda a: a.astype(np.float32)),
    "v_cvt_f32_i32": (F32, (I32,), lambda a: a.astype(np.float32)),
    "v_cvt_u32_f32": (U32, (F32,), _cvt_u32),
    "v_cvt_i32_f32": (U32, (F32,), _cvt_i32),
    "v_cvt_f32_f16": (F32, (F16,), lambda a: a),
    "v_cvt_f16_f32": (F16, (F32,), lambda a: a),
    "v_cvt_f32_ubyte0": (F32, (U32,), lambda a: (a & np.uint64(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte1": (F32, (U32,), lambda a: ((a >> np.uint64(8)) & np.uint64(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte2": (F32, (U32,), lambda a: ((a >> np.uint64(16)) & np.uint64(0xFF)).astype(np.float32)),
    "v_cvt_f32_ubyte3": (F32, (U32,), lambda a: (a >> np.uint64(24)).astype(np.float32)),
    # 32-bit integer
    "v_mov_b32": (U32, (U32,), lambda a: a),
    "v_add_u32": (U32, (U32, U32), lambda a, b: a + b),
    "v_sub_u32": (U32, (U32, U32), lambda a, b: a - b),
    "v_subrev_u32": (U32, (U32, U32), lambda a, b: b - a),
    "v_add_i32": (U32, (U32, U32), lambda a, b: a + b),
    "v_sub_i32": (U32, (U32, U32), lambda a, b: a - b),
    "v_add3_u32": (U32, (U32, U32, U32), lambda a, b, c: a + b + c),
    "v_mul_lo_u32": (U32, (U32, U32), lambda a, b: a * b),
    "v_mul_hi_u32": (U32, (U32, U32), lambda a, b: (a * b) >> np.uint64(32)),
    "v_mul_hi_i32": (U32, (I32, I32), lambda a, b: ((a * b) >> 32)),
    "v_mul_u32_u24": (U32, (U32, U32), lambda a, b: _u24(a) * _u24(b)),
    "v_mul_hi_u32_u24": (U32, (U32, U32), lambda a, b: (_u24(a) * _u24(b)) >> np.uint64(32)),
    "v_mul_i32_i24": (U32, (U32, U32), lambda a, b: _i24(a) * _i24(b)),
    "v_mul_hi_i32_i24": (U32, (U32, U32), lambda a, b: (_i24(a) * _i24(b)) >> 32),
    "v_mad_u32_u24": (U32, (U32, U32, U32), lambda a, b, c: _u24(a) * _u24(b) + c),
    "v_mad_i32_i24": (U32, (U32, U32, U32), lambda a, b, c: _i24(a) * _i24(b) + _sx32(c)),
    "v_and_b32": (U32, (U32, U32), lambda a, b: a & b),
    "v_or_b32": (U32, (U32, U32), lambda a, b: a | b),
    "v_xor_b32": (U32, (U32, U32), lambda a, b: a ^ b),
    "v_not_b32": (U32, (U32,), lambda a: ~a),
    "v_or3_b32": (U32, (U32, U32, U32), lambda a, b, c: a | b | c),
    "v_and_or_b32": (U32, (U32, U32, U32), lambda a, b, c: (a & b) | c),
    "v_lshlrev_b32": (U32, (U32, U32), lambda a, b: b << (a & np.uint64(31))),
    "v_lshrrev_b32": (U32, (U32, U32), lambda a, b: (b & M32) >> (a & np.uint64(31))),
    "v_ashrrev_i32": (U32, (U32, I32), lambda a, b: b >> (a & np.uint64(31)).astype(np.int64)),
    "v_lshl_add_u32": (U32, (U32, U32, U32), lambda a, b, c: (a << (b & np.uint64(31))) + c),
    "v_add_lshl_u32": (U32, (U32, U32, U32), lambda a, b, c: ((a + b) & M32) << (c & np.uint64(31))),
    "v_lshl_or_b32": (U32, (U32, U32, U32), lambda a, b, c: (a << (b & np.uint64(31))) | c),
    "v_xad_u32": (U32, (U32, U32, U32), lambda a, b, c: (a ^ b) + c),
    "v_bfe_u32": (U32, (U32, U32, U32), _bfe_u),
    "v_bfe_i32": (U32, (U32, U32, U32), _bfe_i),
    "v_bfi_b32": (U32, (U32, U32, U32), lambda a, b, c: (a & b) | (~a & c)),
    "v_bfm_b32": (U32, (U32, U32), lambda a, b: ((np.uint64(1) << (a & np.uint64(31))) - np.uint64(1)) << (b & np.uint64(31))),
    "v_perm_b32": (U32, (U32, U32, U32), _perm),
    "v_alignbit_b32": (U32, (U32, U32, U32), _alignbit),
    "v_alignbyte_b32": (U32, (U32, U32, U32), lambda a, b, c: _alignbit(a, b, (c & np.uint64(3)) * np.uint64(8))),
    "v_min_u32": (U32, (U32, U32), np.minimum),
    "v_max_u32": (U32, (U32, U32), np.maximum),
    "v_min_i32": (U32, (I32, I32), np.minimum),
    "v_max_i32": (U32, (I32, I32), np.maximum),
    "v_min3_u32": (U32, (U32, U32, U32), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u32": (U32, (U32, U32, U32), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i32": (U32, (I32, I32, I32), lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_i32": (U32, (I32, I32, I32), lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_med3_u32": (U32, (U32, U32, U32), _med3),
    "v_med3_i32": (U32, (I32, I32, I32), _med3),
    "v_bcnt_u32_b32": (U32, (U32, U32), lambda a, b: _popcount32(a) + b),
    # 64-bit
    "v_lshlrev_b64": (U64, (U32, U64), lambda a, b: b << (a & np.uint64(63))),
    "v_lshrrev_b64": (U64, (U32, U64), lambda a, b: b >> (a & np.uint64(63))),
    "v_lshl_add_u64": (U64, (U64, U32, U64), lambda a, b, c: (a << (b & np.uint64(7))) + c),
    "v_mov_b64": (U64, (U64,), lambda a: a),
}


def _read(ex, inst, w, op, ty: str, slot: int):
    """Source operand `op` as the lane values the lane function expects."""
    if ty in (U64, F64):
        v = ex.v64(op, w)
        if slot == 0 and inst.enc == "dpp":
            # gfx90a+ DP-ALU DPP (v_mov_b64_dpp): LLVM accepts only row_newbcast here.
            if not dpp.is_newbcast(inst):
                raise UnsupportedInstruction(f"64-bit DPP supports only row_newbcast ({ex.where()})")
            v = dpp.apply_source(ex, inst, w, v)
        return v.view(np.float64) if ty == F64 else v
    bits = ex.v32(op, w, fp16=ty == F16)
    if slot == 0 and inst.enc == "dpp":
        bits = dpp.apply_source(ex, inst, w, bits)
    if ty in (F16, U16, I16):
        op_sel = inst.mods.get("op_sel", (0, 0, 0, 0))
        if slot < len(op_sel) and op_sel[slot]:
            bits = bits >> np.uint32(16)
        half = (bits & np.uint32(0xFFFF)).astype(np.uint16)
        if ty == F16:
            x = half.view(np.float16).astype(np.float32)
            return _float_mods(x, op)
        return half.astype(np.uint64) if ty == U16 else half.view(np.int16).astype(np.int64)
    if ty == F32:
        x = bits.view(np.float32)
        if not ex.denorm_f32:
            x = flush_denorms(x, ex.fast)
        return _float_mods(x, op)
    if ty == I32:
        return bits.view(np.int32).astype(np.int64)
    return bits.astype(np.uint64)


def _float_mods(x, op):
    if op.abs:
        x = np.abs(x)
    if op.neg:
        x = -x
    return x


def flush_denorms(x: np.ndarray, fast=None) -> np.ndarray:
    """float32 x with its denormals made zeros of their sign (MODE flushes f32 denormals).
    x must be a fresh array (register reads copy, results are new): with the compiled
    kernels (`fast`, ex.fast) a C-contiguous float32 x is flushed in place."""
    if fast is not None and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable:
        fast.flush_f32(x.reshape(-1).view(np.uint32))
        return x
    small = np.abs(x) < F32_MIN_NORMAL
    if not small.any():
        # nothing to flush; callers pass fresh arrays, so no copy
        return x if x.dtype == np.float32 else x.astype(np.float32)
    return np.where(small, np.copysign(np.float32(0), x), x).astype(np.float32)


def _result_bits(ex, inst, ty: str, r, old_bits):
    """Lane results as uint32 (or uint64 for 64-bit types), after clamp/omod/flush."""
    if ty == F32:
        r = np.asarray(r, dtype=np.float32)
        scale = {None: 1, 2: 2, 4: 4}.get(inst.mods.get("mul"), None)
        if inst.mods.get("div") == 2:
            scale = 0.5
        if scale is None:
            raise UnsupportedInstruction(f"output modifier {inst.mods} ({ex.where()})")
        if scale != 1:
            r = (r * np.float32(scale)).astype(np.float32)
        if inst.mods.get("clamp"):
            r = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0).astype(np.float32)
        if not ex.denorm_f32:
            r = flush_denorms(r, ex.fast)
        return r.view(np.uint32)
    if ty == F16:
        if inst.mods.get("clamp"):
            r = np.clip(np.nan_to_num(r, nan=0.0), 0.0, 1.0)
        half = np.asarray(r, dtype=np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
        op_sel = inst.mods.get("op_sel", (0, 0, 0, 0))
        if len(op_sel) == 4 and op_sel[3]:
            return (old_bits & np.uint32(0xFFFF)) | (half << np.uint32(16))
        # gfx9 16-bit VALU ops zero the upper half of the destination (UNVERIFIED for
        # every opcode; LLVM models it as zeroesHigh16BitsOfDest on gfx9).
        return half
    if ty in (U64, F64):
        return np.asarray(r).view(np.uint64) if ty == F64 else np.asarray(r, dtype=np.uint64)
    return (np.asarray(r).astype(np.int64).astype(np.uint64) & M32).astype(np.uint32)


def _reject_sdwa(ex, inst):
    if inst.enc == "sdwa":
        raise UnsupportedInstruction(f"SDWA forms are not modelled ({ex.where()})")


_NO_MASK = np.ones((1, LANES), bool)
_NO_SCALARS = np.zeros((1, 3, 1), np.uint32)     # valu_f32's scalars where every source is a VGPR
_NOT_FAST = object()


def _valu_f32_plan(inst):
    """(code, source operands, their VGPRs (-1: SGPR or constant), neg, abs) of an
    instruction fast.valu_f32 can run (VGPR destination, VGPR/SGPR/constant sources, no
    DPP, SDWA or modifier fields), else _NOT_FAST; made once per instruction."""
    code = fast.VALU_F32.get(inst.name)
    if code is None or inst.mods or inst.enc in ("dpp", "sdwa"):
        return _NOT_FAST
    dst = inst.ops[0]
    nsrc = 3 if code in fast.VALU_F32_THREE else 2
    srcs = (*inst.ops[1:3], dst) if inst.name == "v_fmac_f32" else inst.ops[1:1 + nsrc]
    if dst.kind != "v" or any(op.kind == "a" for op in srcs):
        return _NOT_FAST
    pad = [False] * (3 - len(srcs))
    regs = np.array([[op.index if op.kind == "v" else -1 for op in srcs] + [-1] * len(pad)], np.int64)
    return code, srcs, regs, np.array([[op.neg for op in srcs] + pad]), np.array([[op.abs for op in srcs] + pad])


def _valu_f32_fast(ex, inst, w) -> bool:
    """valu's work for the ops of fast.VALU_F32 through the compiled fast.valu_f32 where
    _valu_f32_plan allows: the same reads and checks in the same order, the same bits.
    False: not done."""
    plan = inst.__dict__.get("_valu_f32_plan")
    if plan is None:
        plan = inst._valu_f32_plan = _valu_f32_plan(inst)
    if plan is _NOT_FAST:
        return False
    code, srcs, regs, neg, absolute = plan
    ex.role = None
    scalars = _NO_SCALARS
    for slot, op in enumerate(srcs):
        if op.kind == "v":
            ex.check_read("v", w, op.index, 1)
        else:
            if scalars is _NO_SCALARS:
                scalars = np.zeros((1, 3, len(ex.wave_ids(w))), np.uint32)
            scalars[0, slot] = ex.s32(op, w)
    run_f32_fast(ex, w, code, regs, scalars, neg, absolute, inst.ops[0].index)
    return True


def run_f32_fast(ex, w, code: int, regs, scalars, neg, absolute, dst: int):
    """fast.valu_f32 into the VGPRs dst.. (one per row of regs: a packed op has two) of
    the waves `w`, the sources read (checked) by the caller: as set_v, the EXEC mask, the
    write's checks before and its records after."""
    count = regs.shape[0]
    mask = ex.exec_mask(w)
    every = mask is None or bool(mask.all())
    ex.write_regs("v", w, dst, count)
    ex.fast.valu_f32(code, ex.waves.vgpr.view(np.float32), ex.wave_ids(w), regs, scalars.view(np.float32), neg,
                     absolute, not ex.denorm_f32, ex.ieee_mode, dst, _NO_MASK if every else mask, every)
    ex.record_write("v", w, dst, count, hazards.VALU)


def valu(ex, inst, w):
    if ex.fast is not None and _valu_f32_fast(ex, inst, w):
        return
    if inst.name in IEEE_MODE_OPS:
        dst_ty, src_tys, mode_fn = IEEE_MODE_OPS[inst.name]
        fn = functools.partial(mode_fn, ex.ieee_mode)
    else:
        dst_ty, src_tys, fn = VOP[inst.name]
    _reject_sdwa(ex, inst)
    if inst.mods.get("clamp") and dst_ty not in (F32, F16, F64):
        raise UnsupportedInstruction(f"integer clamp (saturation) is not modelled ({ex.where()})")
    ex.role = "dpp" if inst.enc == "dpp" else None
    dst = inst.ops[0]
    srcs = []
    for slot, ty in enumerate(src_tys):
        if ty.startswith("dst:"):
            srcs.append(_read(ex, inst, w, dst, ty[4:], slot))
        else:
            srcs.append(_read(ex, inst, w, inst.ops[1 + slot], ty, slot))
    ex.role = None
    with np.errstate(all="ignore"):
        r = fn(*srcs)
    if inst.enc == "dpp":
        mask = ex.exec_bits(w) & dpp.write_mask(ex, inst, w)   # exec_bits may be a cached view: never in place
    else:
        mask = ex.exec_mask(w)
    writer = hazards.TRANS if inst.name in TRANS_OPS else hazards.VALU
    if dst_ty in (U64, F64):
        ex.set_v64(dst, w, _result_bits(ex, inst, dst_ty, r, None), mask, writer)
        return
    old = ex.waves.file(dst.kind)[w, dst.index] if dst_ty == F16 else None
    ex.set_v(dst, w, _result_bits(ex, inst, dst_ty, r, old), mask, writer)


for _name in (*VOP, *IEEE_MODE_OPS):
    handles(_name, klass="trans" if _name in TRANS_OPS else "valu")(valu)


# ------------------------------------------------------------- carry ops
CARRY = {
    "v_add_co_u32": lambda a, b, c: a + b,
    "v_sub_co_u32": lambda a, b, c: a - b,
    "v_subrev_co_u32": lambda a, b, c: b - a,
    "v_addc_co_u32": lambda a, b, c: a + b + c,
    "v_subb_co_u32": lambda a, b, c: a - b - c,
    "v_subbrev_co_u32": lambda a, b, c: b - a - c,
}


@handles(*CARRY, klass="valu")
def carry_op(ex, inst, w):
    """vdst, sdst(carry out), src0, src1 [, carry in]: 33-bit results; the carry/borrow
    bit lands in sdst for the lanes EXEC enables and 0 elsewhere."""
    vdst, sdst, a_op, b_op = inst.ops[:4]
    _reject_sdwa(ex, inst)
    if inst.enc == "dpp" or inst.mods.get("clamp"):
        raise UnsupportedInstruction(f"DPP or clamp forms of carry ops are not modelled ({ex.where()})")
    a = _read(ex, inst, w, a_op, U32, 0).astype(np.int64)
    b = _read(ex, inst, w, b_op, U32, 1).astype(np.int64)
    c = ex.lane_mask(inst.ops[4], w).astype(np.int64) if len(inst.ops) > 4 else 0
    r = CARRY[inst.name](a, b, c)
    mask = ex.exec_bits(w)
    carry = ((r < 0) | (r > 0xFFFFFFFF)) & mask
    ex.set_v(vdst, w, (r & 0xFFFFFFFF).astype(np.uint32), mask)
    lo, hi = bits_to_mask(carry)
    ex.set_s64(sdst, w, lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32)), hazards.VALU)


@handles("v_cndmask_b32", klass="valu")
def cndmask(ex, inst, w):
    dst, a_op, b_op, sel = inst.ops
    _reject_sdwa(ex, inst)
    if inst.enc == "dpp":
        raise UnsupportedInstruction(f"DPP v_cndmask_b32 is not modelled ({ex.where()})")
    a = _read(ex, inst, w, a_op, F32 if (a_op.neg or a_op.abs) else U32, 0)
    b = _read(ex, inst, w, b_op, F32 if (b_op.neg or b_op.abs) else U32, 1)
    choose = ex.lane_mask(sel, w)
    a = a.view(np.uint32) if a.dtype == np.float32 else a.astype(np.uint32)
    b = b.view(np.uint32) if b.dtype == np.float32 else b.astype(np.uint32)
    ex.set_v(dst, w, np.where(choose, b, a), ex.exec_bits(w))


# ------------------------------------------------------------- lane access
@handles("v_readfirstlane_b32", klass="valu")
def readfirstlane(ex, inst, w):
    dst, src = inst.ops
    ex.role = "readlane"
    v = ex.v32(src, w)
    mask = ex.exec_bits(w)
    first = np.where(mask.any(axis=1), mask.argmax(axis=1), 0)
    ex.set_s32(dst, w, v[np.arange(v.shape[0]), first], hazards.VALU)


@handles("v_readlane_b32", klass="valu")
def readlane(ex, inst, w):
    dst, src, lane_op = inst.ops
    ex.role = "lane_select"
    lane = (ex.s32(lane_op, w) & np.uint32(63)).astype(np.int64)
    ex.role = "readlane"
    v = ex.v32(src, w)
    ex.set_s32(dst, w, v[np.arange(v.shape[0]), lane], hazards.VALU)


@handles("v_writelane_b32", klass="valu")
def writelane(ex, inst, w):
    dst, src, lane_op = inst.ops
    ex.role = "lane_select"
    lane = (ex.s32(lane_op, w) & np.uint32(63)).astype(np.int64)
    ex.role = None
    value = ex.s32(src, w)       # the data SGPR is an ordinary VALU read (2 wait states), not a lane select
    mask = np.zeros((len(value), LANES), bool)
    mask[np.arange(len(value)), lane] = True      # writes regardless of EXEC
    ex.set_v(dst, w, np.repeat(value[:, None], LANES, axis=1), mask)


@handles("v_mbcnt_lo_u32_b32", "v_mbcnt_hi_u32_b32", klass="valu")
def mbcnt(ex, inst, w):
    dst, a_op, b_op = inst.ops
    a = ex.v32(a_op, w).astype(np.uint64)
    b = ex.v32(b_op, w).astype(np.uint64)
    base = 0 if inst.name.endswith("lo_u32_b32") else 32
    lanes = np.arange(LANES, dtype=np.uint64)
    shift = np.clip(lanes.astype(np.int64) - base, 0, 32).astype(np.uint64)
    below = np.where(shift >= 32, a, a & ((np.uint64(1) << shift) - np.uint64(1)))
    ex.set_v(dst, w, ((_popcount32(below) + b) & M32).astype(np.uint32), ex.exec_bits(w))


@handles("v_nop", klass="valu")
def v_nop(ex, inst, w):
    pass


# ------------------------------------------------------------- compares
FLOAT_CMP = {
    "f": lambda a, b: np.zeros(a.shape, bool), "lt": np.less, "eq": np.equal, "le": np.less_equal,
    "gt": np.greater, "lg": lambda a, b: (a < b) | (a > b), "ge": np.greater_equal,
    "o": lambda a, b: ~np.isnan(a) & ~np.isnan(b), "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b), "nlg": lambda a, b: ~((a < b) | (a > b)), "ngt": lambda a, b: ~(a > b),
    "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b), "nlt": lambda a, b: ~(a < b),
    "tru": lambda a, b: np.ones(a.shape, bool),
}
INT_CMP = {
    "f": lambda a, b: np.zeros(a.shape, bool), "lt": np.less, "eq": np.equal, "le": np.less_equal,
    "gt": np.greater, "ne": np.not_equal, "lg": np.not_equal, "ge": np.greater_equal,
    "t": lambda a, b: np.ones(a.shape, bool),
}
CMP_TYPES = {"f32": F32, "f16": F16, "f64": F64, "i32": I32, "u32": U32, "i64": "i64", "u64": U64,
             "i16": I16, "u16": U16}


def _cmp_names():
    for x in ("cmp", "cmpx"):
        for t in ("f32", "f16", "f64"):
            for c in FLOAT_CMP:
                yield f"v_{x}_{c}_{t}"
        for t in ("i32", "u32", "i64", "u64", "i16", "u16"):
            for c in INT_CMP:
                yield f"v_{x}_{c}_{t}"


@handles(*_cmp_names(), klass="valu")
def vopc(ex, inst, w):
    _, kind, cond, t = inst.name.split("_")
    _reject_sdwa(ex, inst)
    sdst, a_op, b_op = inst.ops
    ty = CMP_TYPES[t]
    if ty == "i64":
        a, b = ex.v64(a_op, w).view(np.int64), ex.v64(b_op, w).view(np.int64)
    else:
        a, b = _read(ex, inst, w, a_op, ty, 0), _read(ex, inst, w, b_op, ty, 1)
    with np.errstate(invalid="ignore"):
        res = (FLOAT_CMP if t.startswith("f") else INT_CMP)[cond](a, b)
    mask = ex.exec_bits(w)
    lo, hi = bits_to_mask(res & mask)
    value = lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))
    ex.set_s64(sdst, w, value, hazards.VALU)
    if kind == "cmpx":
        from ..decode import SPECIAL_SGPRS, Operand
        ex.set_s64(Operand("s", *SPECIAL_SGPRS["exec"]), w, value, hazards.VALU)


@handles("v_cmp_class_f32", "v_cmpx_class_f32", klass="valu")
def cmp_class(ex, inst, w):
    _reject_sdwa(ex, inst)
    sdst, a_op, b_op = inst.ops
    a = _read(ex, inst, w, a_op, F32, 0)
    classes = ex.v32(b_op, w)
    bits = np.asarray(a, np.float32).view(np.uint32)
    neg = (bits >> np.uint32(31)) == 1
    isnan, isinf = np.isnan(a), np.isinf(a)
    snan = isnan & ((bits & np.uint32(0x400000)) == 0)
    zero, denorm = a == 0, (a != 0) & (np.abs(a) < F32_MIN_NORMAL)
    normal = ~isnan & ~isinf & ~zero & ~denorm
    tests = [snan, isnan & ~snan, isinf & neg, normal & neg, denorm & neg, zero & neg,
             zero & ~neg, denorm & ~neg, normal & ~neg, isinf & ~neg]
    res = np.zeros(a.shape, bool)
    for bit, t in enumerate(tests):
        res |= t & (((classes >> np.uint32(bit)) & np.uint32(1)) == 1)
    mask = ex.exec_bits(w)
    lo, hi = bits_to_mask(res & mask)
    value = lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))
    ex.set_s64(sdst, w, value, hazards.VALU)
    if inst.name.startswith("v_cmpx"):
        from ..decode import SPECIAL_SGPRS, Operand
        ex.set_s64(Operand("s", *SPECIAL_SGPRS["exec"]), w, value, hazards.VALU)


# ------------------------------------------------------------- AGPR moves
@handles("v_accvgpr_write_b32", klass="valu")
def accvgpr_write(ex, inst, w):
    dst, src = inst.ops
    ex.set_v(dst, w, ex.v32(src, w), ex.exec_bits(w), hazards.ACCVGPR_WRITE)


@handles("v_accvgpr_read_b32", "v_accvgpr_mov_b32", klass="valu")
def accvgpr_read(ex, inst, w):
    dst, src = inst.ops
    ex.set_v(dst, w, ex.v32(src, w), ex.exec_bits(w))

"""VOP3P: packed math (two results per lane), v_fma_mix* and the f16/bf16 dot products.

Operand selection (VOP3P, read from the raw encoding: op_sel dword0[13:11],
op_sel_hi {dword0[14], dword1[28:27]}, neg_hi dword0[10:8], neg_lo dword1[31:29],
clamp dword0[15]). For source i:
  * 16-bit packed ops: the low result takes half op_sel[i] of the 32-bit source, the
    high result half op_sel_hi[i]; neg_lo[i] / neg_hi[i] negate the value feeding the
    low / high result (float ops only).
  * packed f32 ops (v_pk_{fma,mul,add}_f32, v_pk_mov_b32): a source is a 64-bit register
    pair; op_sel[i] picks which 32-bit register of the pair feeds the low result,
    op_sel_hi[i] the high one. v_pk_mov_b32: D.lo = src0[op_sel[0]], D.hi = src1[op_sel[1]].
  * v_fma_mix*: op_sel_hi[i] = 1 reads source i as f16 (half op_sel[i]), 0 as f32;
    neg_lo[i] negates and neg_hi[i] takes the absolute value (LLVM prints them -v, |v|).

Inline constants (no literals exist in gfx9 VOP3P), as LLVM encodes them [LLVM 22
tests: immv216.ll, pk_max_f16_literal.ll, packed-fp32.ll, add.v2i16.ll]:
  * 16-bit packed float ops: the f16 value in the low half, 0 in the high half
    (`1.0` = <1.0, 0.0>; LLVM writes the splat <1.0, 1.0> as `1.0 op_sel_hi:[..,0]`);
  * 16-bit packed integer ops: the 32-bit sign-extended integer (`-1` = <-1, -1>,
    `32` = <32, 0>); float constants there are rejected;
  * packed f32 ops: the 32-bit constant feeds a result whose select bit is 0. What a
    set select bit reads from a constant is unverified (LLVM never emits it: it
    materialises <1.0, 0.0> in SGPRs instead), so that form is rejected.

Rounding: every result is rounded once, RNE, from the exact value (fused multiply-add
and dot products included: products are exact in float64 and the sums are made exact
with a two-sum correction). f32 results and inputs follow the f32 denormal mode, f16
the 16/64 mode; an overflowed f16 result saturates to +-65504 when MODE.FP16_OVFL is set.
clamp clamps to [0, 1]; a NaN under clamp is rejected (it depends on DX10_CLAMP, which
the emulator does not model). The internal precision of the hardware dot products
(v_dot2*) is UNVERIFIED: they are modelled as exact with one final rounding.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from .. import hazards, numerics
from ..errors import UnsupportedInstruction
from ..machine import imm_bits
from ..registry import handles
from .vop import flush_denorms, run_f32_fast



# ------------------------------------------------------------------ encoding fields
def fields(inst) -> dict:
    cached = getattr(inst, "_vop3p_fields", None)
    if cached is not None:
        return cached
    if len(inst.words) < 2 or (inst.words[0] >> 23) != 0x1A7:
        raise UnsupportedInstruction(f"{inst.name} at pc {inst.pc:#x} is not VOP3P-encoded ({inst.text})")
    d0, d1 = inst.words[0], inst.words[1]
    f = {
        "op_sel": tuple((d0 >> (11 + i)) & 1 for i in range(3)),
        "op_sel_hi": ((d1 >> 27) & 1, (d1 >> 28) & 1, (d0 >> 14) & 1),
        "neg_lo": tuple((d1 >> (29 + i)) & 1 for i in range(3)),
        "neg_hi": tuple((d0 >> (8 + i)) & 1 for i in range(3)),
        "clamp": (d0 >> 15) & 1,
    }
    inst._vop3p_fields = f
    return f


# ------------------------------------------------------------------ rounding helpers
def _two_sum(a, b):
    """s = fl(a + b) and the exact error e (a + b = s + e) in float64."""
    s = a + b
    bp = s - a
    e = (a - (s - bp)) + (b - bp)
    return s, np.where(np.isfinite(s), e, 0.0)


def _is_midpoint(s, mbits: int, emin: int):
    """s (float64) lies exactly halfway between two values of a format with mbits
    fraction bits and minimum normal exponent emin."""
    _, e2 = np.frexp(s)
    e = np.maximum(e2.astype(np.int64) - 1, emin)
    t = np.ldexp(np.abs(s), mbits + 1 - e)          # in units of half a quantum
    return np.isfinite(s) & (s != 0) & (t == np.floor(t)) & (np.fmod(t, 2) == 1)


def _nudge(s, e, mbits: int, emin: int):
    """Move s off a target-format midpoint toward s + e so a single RNE rounding of it
    gives the correctly rounded value of s + e."""
    fix = (e != 0) & _is_midpoint(s, mbits, emin)
    if not fix.any():
        return s
    return np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)


def _round_f32(s, e=None):
    if e is not None:
        s = _nudge(s, e, 23, -126)
    return np.asarray(s, np.float64).astype(np.float32)


def _round_f16_bits(ex, s, e=None):
    if e is not None:
        s = _nudge(s, e, 10, -14)
    return numerics.f32_to_f16_rne(np.asarray(s, np.float64),
                                   ovfl_saturate=bool(getattr(ex, "fp16_ovfl", False)))


def _fma64(a, b, c):
    """Exact a*b + c as (s, e) in float64 (a, b at most 24-bit significands)."""
    return _two_sum(np.asarray(a, np.float64) * np.asarray(b, np.float64), np.asarray(c, np.float64))


# ------------------------------------------------------------------ denormals / clamp
def _flush32(ex, x):
    x = np.asarray(x, np.float32)
    return x if ex.denorm_f32 else flush_denorms(x, ex.fast)


def _flush16_bits(ex, bits):
    return bits if ex.denorm_f16 else numerics.flush_f16_denorm_bits(bits)


def _clamp(ex, inst, x):
    """Clamp to [0, 1] when the clamp bit is set (float64/float32 values)."""
    if not fields(inst)["clamp"]:
        return x
    if np.isnan(x).any():
        raise UnsupportedInstruction(f"{inst.name} with clamp produced a NaN: the result depends on "
                                     f"MODE.DX10_CLAMP, which is not modelled ({ex.where()})")
    return np.clip(x, 0.0, 1.0).astype(x.dtype)


# ------------------------------------------------------------------ operand access
@lru_cache(maxsize=4096)
def _one_register(op, sel: int):
    """Register op.index + sel of `op` as a one-register operand (cached: operands are
    frozen and every execution of an instruction asks for the same ones)."""
    return replace(op, index=op.index + sel, count=1)


def _read32(ex, inst, w, op, what: str, sel: int = 0, pair: bool = False):
    """uint32[n, 64] from a VGPR/SGPR (register op.index + sel of a pair) or a constant."""
    if op.kind in ("v", "a", "s"):
        if op.count != (2 if pair else 1):
            raise UnsupportedInstruction(f"{inst.name}: {what} {op.text} has the wrong size ({ex.where()})")
        return ex.v32(_one_register(op, sel), w)
    if op.kind == "imm":
        if sel:
            raise UnsupportedInstruction(
                f"{inst.name}: a set op_sel/op_sel_hi bit on the constant {op.text} ({what}) is "
                f"unverified on gfx950 (LLVM never emits it) ({ex.where()})")
        return ex.v32(op, w)
    raise UnsupportedInstruction(f"{inst.name}: operand {op.text} is not supported ({ex.where()})")


def _const16_bits(ex, inst, op, is_float: bool) -> int:
    text = op.text
    if text in _FLOAT_TEXTS:
        if not is_float:
            raise UnsupportedInstruction(f"{inst.name}: float constant {text} on a packed integer "
                                         f"operand is not modelled ({ex.where()})")
        return imm_bits(op, 32, fp16=True) & 0xFFFF            # f16 in the low half, 0 above
    return imm_bits(op, 32)                                      # sign-extended 32-bit integer


_FLOAT_TEXTS = {"0.5", "-0.5", "1.0", "-1.0", "2.0", "-2.0", "4.0", "-4.0", "0.15915494"}


def _halves(ex, inst, w, op, slot: int, is_float: bool):
    """(lo, hi) uint16[n, 64] halves of a 16-bit packed source after op_sel/op_sel_hi."""
    f = fields(inst)
    if op.kind == "imm":
        word = np.full((ex._n(w), 64), _const16_bits(ex, inst, op, is_float), np.uint32)
    else:
        if op.count != 1:
            raise UnsupportedInstruction(f"{inst.name}: {op.text} must be one register ({ex.where()})")
        word = ex.v32(op, w)
    lo = (word >> np.uint32(16 * f["op_sel"][slot])) & np.uint32(0xFFFF)
    hi = (word >> np.uint32(16 * f["op_sel_hi"][slot])) & np.uint32(0xFFFF)
    return lo.astype(np.uint16), hi.astype(np.uint16)


def _f16_value(ex, bits):
    return numerics.f16_to_f32(_flush16_bits(ex, bits)).astype(np.float64)


def _bf16_value(bits):
    return numerics.bf16_to_f32(bits).astype(np.float64)


def _no_neg(ex, inst, *slots):
    f = fields(inst)
    for s in slots:
        if f["neg_lo"][s] or f["neg_hi"][s]:
            raise UnsupportedInstruction(f"{inst.name}: neg_lo/neg_hi on operand {s} is not modelled "
                                         f"({ex.where()})")


def _begin(ex):
    ex.role = None


# ------------------------------------------------------------------ packed f32
def _pk_f32_sources(ex, inst, w, nsrc):
    f = fields(inst)
    srcs = []
    for i in range(nsrc):
        op = inst.ops[1 + i]
        pair = []
        for half, sel_key, neg_key in ((0, "op_sel", "neg_lo"), (1, "op_sel_hi", "neg_hi")):
            bits = _read32(ex, inst, w, op, f"src{i}", f[sel_key][i], pair=op.kind != "imm")
            x = _flush32(ex, bits.view(np.float32))
            if f[neg_key][i]:
                x = -x
            pair.append(x)
        srcs.append(pair)
    return srcs


def _write_pk_f32(ex, inst, w, lo, hi):
    dst = inst.ops[0]
    if dst.kind != "v" or dst.count != 2:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be a VGPR pair ({ex.where()})")
    out = []
    for r in (lo, hi):
        r = _flush32(ex, _clamp(ex, inst, np.asarray(r, np.float32)))
        out.append(r.view(np.uint32))
    ex.set_v(dst, w, np.stack(out, axis=1), ex.exec_mask(w), hazards.VALU)


@handles("v_pk_fma_f32", klass="valu")
def pk_fma_f32(ex, inst, w):
    _begin(ex)
    (a0, a1), (b0, b1), (c0, c1) = _pk_f32_sources(ex, inst, w, 3)
    with np.errstate(all="ignore"):
        lo = _round_f32(*_fma64(a0, b0, c0))
        hi = _round_f32(*_fma64(a1, b1, c1))
    _write_pk_f32(ex, inst, w, lo, hi)


_PK_NOT_FAST = object()
_PK_SCALARS = np.zeros((2, 3, 1), np.uint32)      # unused: every source is a VGPR
_PK_ABS = np.zeros((2, 3), bool)


def _pk_f32_plan(inst):
    """(code, VGPR of each half and source [2, 3], neg [2, 3]) for fast.valu_f32 where a
    v_pk_mul/add_f32 reads VGPR pairs only into a VGPR pair without clamp, else
    _PK_NOT_FAST; made once per instruction."""
    f = fields(inst)
    dst, *srcs = inst.ops
    if f["clamp"] or any(op.kind != "v" or op.count != 2 for op in (dst, *srcs)):
        return _PK_NOT_FAST
    regs = np.array([[op.index + f[sel][i] for i, op in enumerate(srcs)] + [-1]
                     for sel in ("op_sel", "op_sel_hi")], np.int64)
    neg = np.array([[bool(f[key][0]), bool(f[key][1]), False] for key in ("neg_lo", "neg_hi")])
    return (3 if inst.name == "v_pk_mul_f32" else 0), regs, neg


def _pk_f32_fast(ex, inst, w) -> bool:
    """pk_binary_f32 through the compiled fast.valu_f32 where _pk_f32_plan allows: the
    source registers checked in _pk_f32_sources' order (src0 lo, hi, src1 lo, hi), the
    same bits. False: not done."""
    plan = inst.__dict__.get("_pk_f32_plan")
    if plan is None:
        plan = inst._pk_f32_plan = _pk_f32_plan(inst)
    if plan is _PK_NOT_FAST:
        return False
    code, regs, neg = plan
    for i in range(2):
        for half in range(2):
            ex.check_read("v", w, int(regs[half, i]), 1)
    run_f32_fast(ex, w, code, regs, _PK_SCALARS, neg, _PK_ABS, inst.ops[0].index)
    return True


@handles("v_pk_mul_f32", "v_pk_add_f32", klass="valu")
def pk_binary_f32(ex, inst, w):
    _begin(ex)
    if ex.fast is not None and _pk_f32_fast(ex, inst, w):
        return
    (a0, a1), (b0, b1) = _pk_f32_sources(ex, inst, w, 2)
    fn = np.multiply if inst.name == "v_pk_mul_f32" else np.add
    with np.errstate(all="ignore"):
        lo, hi = fn(a0, b0), fn(a1, b1)              # float32 arithmetic is correctly rounded
    _write_pk_f32(ex, inst, w, lo, hi)


@handles("v_pk_mov_b32", klass="valu")
def pk_mov_b32(ex, inst, w):
    _begin(ex)
    f = fields(inst)
    _no_neg(ex, inst, 0, 1)
    if f["clamp"]:
        raise UnsupportedInstruction(f"{inst.name} with clamp is not modelled ({ex.where()})")
    dst, s0, s1 = inst.ops
    lo = _read32(ex, inst, w, s0, "src0", f["op_sel"][0], pair=s0.kind != "imm")
    hi = _read32(ex, inst, w, s1, "src1", f["op_sel"][1], pair=s1.kind != "imm")
    if dst.kind != "v" or dst.count != 2:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be a VGPR pair ({ex.where()})")
    ex.set_v(dst, w, np.stack([lo, hi], axis=1), ex.exec_mask(w), hazards.VALU)


# ------------------------------------------------------------------ packed f16
def _ieee_max(a, b):
    r = np.fmax(a, b)
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a) & np.signbit(b), -0.0, 0.0), r)


def _ieee_min(a, b):
    r = np.fmin(a, b)
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a) | np.signbit(b), -0.0, 0.0), r)


def _maximum(a, b):            # IEEE 754-2019 maximum: NaN-propagating, -0 < +0
    r = np.maximum(a, b)
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a) & np.signbit(b), -0.0, 0.0), r)


def _minimum(a, b):
    r = np.minimum(a, b)
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a) | np.signbit(b), -0.0, 0.0), r)


# name: (number of sources, exact function on float64 values returning (s, e) or s)
PK_F16 = {
    "v_pk_fma_f16": (3, lambda a, b, c: _fma64(a, b, c)),
    "v_pk_add_f16": (2, lambda a, b: a + b),         # exact: f16 sums fit in float64
    "v_pk_mul_f16": (2, lambda a, b: a * b),         # exact
    "v_pk_max_f16": (2, _ieee_max),
    "v_pk_min_f16": (2, _ieee_min),
    "v_pk_maximum3_f16": (3, lambda a, b, c: _maximum(_maximum(a, b), c)),
    "v_pk_minimum3_f16": (3, lambda a, b, c: _minimum(_minimum(a, b), c)),
}


@handles(*PK_F16, klass="valu")
def pk_f16(ex, inst, w):
    _begin(ex)
    nsrc, fn = PK_F16[inst.name]
    f = fields(inst)
    lo_in, hi_in = [], []
    for i in range(nsrc):
        lo, hi = _halves(ex, inst, w, inst.ops[1 + i], i, True)
        lo, hi = _f16_value(ex, lo), _f16_value(ex, hi)
        lo_in.append(-lo if f["neg_lo"][i] else lo)
        hi_in.append(-hi if f["neg_hi"][i] else hi)
    out = []
    with np.errstate(all="ignore"):
        for vals in (lo_in, hi_in):
            r = fn(*vals)
            s, e = r if isinstance(r, tuple) else (r, None)
            s = _clamp(ex, inst, np.asarray(s, np.float64))
            out.append(_flush16_bits(ex, _round_f16_bits(ex, s, e)).astype(np.uint32))
    _write_word(ex, inst, w, out[0] | (out[1] << np.uint32(16)))


def _write_word(ex, inst, w, word):
    dst = inst.ops[0]
    if dst.kind != "v" or dst.count != 1:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be one VGPR ({ex.where()})")
    ex.set_v(dst, w, word.astype(np.uint32), ex.exec_mask(w), hazards.VALU)


# ------------------------------------------------------------------ packed 16-bit integer
def _i16(x):
    x = np.asarray(x, np.int64) & 0xFFFF
    return np.where(x >= 0x8000, x - 0x10000, x)


PK_INT = {
    "v_pk_add_u16": (2, lambda a, b: a + b, False),
    "v_pk_sub_u16": (2, lambda a, b: a - b, False),
    "v_pk_add_i16": (2, lambda a, b: a + b, True),
    "v_pk_sub_i16": (2, lambda a, b: a - b, True),
    "v_pk_mul_lo_u16": (2, lambda a, b: a * b, False),
    "v_pk_lshlrev_b16": (2, lambda a, b: b << (a & 15), False),
    "v_pk_lshrrev_b16": (2, lambda a, b: b >> (a & 15), False),
    "v_pk_ashrrev_i16": (2, lambda a, b: _i16(b) >> (a & 15), False),
    "v_pk_max_u16": (2, np.maximum, False),
    "v_pk_min_u16": (2, np.minimum, False),
    "v_pk_max_i16": (2, np.maximum, True),
    "v_pk_min_i16": (2, np.minimum, True),
    "v_pk_mad_u16": (3, lambda a, b, c: a * b + c, False),
    "v_pk_mad_i16": (3, lambda a, b, c: a * b + c, True),
}


@handles(*PK_INT, klass="valu")
def pk_int16(ex, inst, w):
    _begin(ex)
    nsrc, fn, signed = PK_INT[inst.name]
    _no_neg(ex, inst, *range(nsrc))
    if fields(inst)["clamp"]:
        raise UnsupportedInstruction(f"{inst.name} with clamp (saturation) is not modelled ({ex.where()})")
    lo_in, hi_in = [], []
    for i in range(nsrc):
        lo, hi = _halves(ex, inst, w, inst.ops[1 + i], i, False)
        conv = _i16 if signed else (lambda x: np.asarray(x, np.int64))
        lo_in.append(conv(lo))
        hi_in.append(conv(hi))
    lo = np.asarray(fn(*lo_in), np.int64) & 0xFFFF
    hi = np.asarray(fn(*hi_in), np.int64) & 0xFFFF
    _write_word(ex, inst, w, (lo | (hi << 16)).astype(np.uint32))


# ------------------------------------------------------------------ mix
@handles("v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16", klass="valu")
def fma_mix(ex, inst, w):
    _begin(ex)
    f = fields(inst)
    vals = []
    for i in range(3):
        op = inst.ops[1 + i]
        if f["op_sel_hi"][i]:                      # f16 source
            if op.kind == "imm":
                raise UnsupportedInstruction(f"{inst.name}: a constant read as f16 is not modelled "
                                             f"({ex.where()})")
            word = _read32(ex, inst, w, op, f"src{i}")
            half = (word >> np.uint32(16 * f["op_sel"][i])) & np.uint32(0xFFFF)
            x = _f16_value(ex, half.astype(np.uint16))
        else:
            if f["op_sel"][i]:
                raise UnsupportedInstruction(f"{inst.name}: op_sel on an f32 source is not defined "
                                             f"({ex.where()})")
            x = _flush32(ex, _read32(ex, inst, w, op, f"src{i}").view(np.float32)).astype(np.float64)
        if f["neg_hi"][i]:
            x = np.abs(x)
        if f["neg_lo"][i]:
            x = -x
        vals.append(x)
    with np.errstate(all="ignore"):
        s, e = _fma64(*vals)
        if inst.name == "v_fma_mix_f32":
            r = _flush32(ex, _clamp(ex, inst, _round_f32(s, e)))
            _write_word(ex, inst, w, r.view(np.uint32))
            return
        s = _clamp(ex, inst, s)
        half = _flush16_bits(ex, _round_f16_bits(ex, s, e)).astype(np.uint32)
    dst = inst.ops[0]
    old = ex.v32(dst, w)                            # the other half is preserved
    if inst.name == "v_fma_mixlo_f16":
        word = (old & np.uint32(0xFFFF0000)) | half
    else:
        word = (old & np.uint32(0xFFFF)) | (half << np.uint32(16))
    ex.set_v(dst, w, word, ex.exec_mask(w), hazards.VALU)


# ------------------------------------------------------------------ dot products
def _dot2(a_halves, b_halves, c, value):
    """Exact a.lo*b.lo + a.hi*b.hi + c, rounded once to f32."""
    (alo, ahi), (blo, bhi) = a_halves, b_halves
    with np.errstate(all="ignore"):
        p0 = value(alo) * value(blo)              # exact products (<= 22 significant bits)
        p1 = value(ahi) * value(bhi)
        s1, e1 = _two_sum(p0, p1)
        s2, e2 = _two_sum(s1, c)
        t, d = _two_sum(e1, e2)
        s3, e3 = _two_sum(s2, t)
        # exact value = s3 + e3 + d with |d| below the unit of e3 when e3 != 0: the sign of
        # the residual is that of e3, else that of d.
        return _round_f32(s3, np.where(e3 != 0, e3, d))


@handles("v_dot2_f32_f16", "v_dot2_f32_bf16", klass="valu")
def dot2_f32(ex, inst, w):
    _begin(ex)
    f = fields(inst)
    if f["op_sel"] != (0, 0, 0) or f["op_sel_hi"] != (1, 1, 1) or f["neg_hi"][2]:
        raise UnsupportedInstruction(f"{inst.name}: non-default op_sel/op_sel_hi or neg_hi on src2 "
                                     f"is not modelled ({ex.where()})")
    bf16 = inst.name.endswith("bf16")
    if bf16:
        _no_neg(ex, inst, 0, 1)
        value = _bf16_value
    else:
        def value(bits):
            return _f16_value(ex, bits)
    srcs = []
    for i in range(2):
        lo, hi = _halves(ex, inst, w, inst.ops[1 + i], i, True)
        srcs.append((lo, hi))
    if not bf16:
        # neg_lo / neg_hi negate the low / high f16 element (flip its sign bit).
        srcs = [tuple(np.where(f[k][i], h ^ np.uint16(0x8000), h).astype(np.uint16)
                      for k, h in (("neg_lo", srcs[i][0]), ("neg_hi", srcs[i][1]))) for i in range(2)]
    c = _flush32(ex, _read32(ex, inst, w, inst.ops[3], "src2").view(np.float32)).astype(np.float64)
    if f["neg_lo"][2]:
        c = -c
    r = _dot2(srcs[0], srcs[1], c, value)
    r = _flush32(ex, _clamp(ex, inst, r))
    _write_word(ex, inst, w, r.view(np.uint32))


@handles("v_dot2c_f32_bf16", "v_dot2c_f32_f16", klass="valu")
def dot2c_f32(ex, inst, w):
    """VOP2 D = S0.lo*S1.lo + S0.hi*S1.hi + D (e32 only)."""
    _begin(ex)
    if inst.enc not in ("", "e32") or inst.mods:
        raise UnsupportedInstruction(f"{inst.name} in encoding {inst.enc or 'e32'} with {inst.mods} "
                                     f"is not modelled ({ex.where()})")
    dst, s0, s1 = inst.ops
    value = _bf16_value if inst.name.endswith("bf16") else (lambda bits: _f16_value(ex, bits))
    halves = []
    for op in (s0, s1):
        if op.kind not in ("v", "s"):
            raise UnsupportedInstruction(f"{inst.name}: constant operands are not modelled ({ex.where()})")
        word = ex.v32(op, w)
        halves.append(((word & np.uint32(0xFFFF)).astype(np.uint16), (word >> np.uint32(16)).astype(np.uint16)))
    c = _flush32(ex, ex.v32(dst, w).view(np.float32)).astype(np.float64)
    r = _flush32(ex, _dot2(halves[0], halves[1], c, value))
    _write_word(ex, inst, w, r.view(np.uint32))

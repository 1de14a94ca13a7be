"""Conversions: bf16/f16 packing, OCP fp8/bf8 <-> f32, and the v_cvt_scalef32_* family.

Instruction semantics (fact sheet §3; ISA via numerics.py's sources; LLVM 22 intrinsic
lowering checked with llc for every select bit below):
  v_cvt_pk_bf16_f32 d, a, b      d = {bf16(b), bf16(a)}, RNE
  v_cvt_pk_f16_f32 d, a, b       d = {f16(b), f16(a)}, RNE (MODE.FP16_OVFL saturates)
  v_cvt_pkrtz_f16_f32 d, a, b    d = {f16(b), f16(a)}, round toward zero
  v_cvt_f32_bf16 d, s            d = s[15:0] << 16 (SDWA src0_sel WORD_1 takes the high half)
  v_cvt_pk_{fp8,bf8}_f32 d, a, b  bytes {fp8(a), fp8(b)} into word op_sel[3] of d; the
                                 other word of d is kept
  v_cvt_f32_{fp8,bf8} d, s       byte 0 of s (SDWA src0_sel BYTE_n / WORD_n selects)
  v_cvt_pk_f32_{fp8,bf8} d[2], s  bytes 0, 1 of s (SDWA src0_sel WORD_1: bytes 2, 3)
  v_cvt_scalef32_pk_{fp8,bf8}_f32 d, a, b, scale
                                 bytes {fp8(a / 2^s), fp8(b / 2^s)} into word op_sel[3]
  v_cvt_scalef32_f32_{fp8,bf8} d, s, scale
                                 f32(fp8(byte op_sel[1:0] of s)) * 2^s
  v_cvt_scalef32_pk_f32_{fp8,bf8} d[2], s, scale
                                 the two bytes of word op_sel[0] of s, times 2^s
  v_cvt_scalef32_pk_fp4_{f32,f16,bf16}, v_cvt_scalef32_pk_{f32,f16,bf16}_fp4
                                 FP4 (E2M1) pairs, one byte of the word (section near the end)
  v_cvt_scalef32_pk_{fp8,bf8}_{f16,bf16}, v_cvt_scalef32_f16_{fp8,bf8},
  v_cvt_scalef32_pk_{f16,bf16}_{fp8,bf8}   fp8/bf8 <-> 16-bit (last section)
  where 2^s = 2^(E - 127) with E the exponent field of the f32 scale operand.
op_sel is read from the raw VOP3 word (bits 11..14 = op_sel[0..3]); LLVM prints the
destination bit as the last list entry whatever the operand count.

Numerics: f32 sources follow the f32 denormal mode (flushed when it says so:
"Conversion from F32 supports MODE-based denormal control"); fp8 results may be
denormal regardless of MODE. Saturation of fp8/bf8 results is MODE.FP16_OVFL
(`ex.fp16_ovfl`, from the kernel descriptor's rsrc1 bit 26). An fp8/bf8 NaN result (a
NaN source; FP8 overflow or Inf without FP16_OVFL) is the NaN byte of AMD's host model,
sign | 0x7F (E4M3) / sign | 0x7E (E5M2) (numerics.GFX950_FP8_NAN; NaN-ness is hardware-
tested, the sign bit of a negative one is not). The scaled up-conversions to f32 give
+-Inf when the scaled value overflows f32 and NaN (sign of the code | 0x7FC00000) for a
scale exponent field of 0xFF (composable_kernel's gfx950 device tests and
amd_hip_ocp_host.hpp, numerics docstring; docs/fp8-conversion-evidence.md). Rejected as
unverified (UnsupportedInstruction): a 0xFF scale on every other scaled convert (the
down-conversions, FP4, the 16-bit ones), such an f32 overflow with FP16_OVFL set, an f32
denormal result under a flushing denormal mode, clamp/omod (llvm-mc 22 refuses `clamp`
and `mul:` on these, and its disassembler calls a set clamp bit an invalid encoding), and
the stochastic-rounding converts (not registered). f16/bf16 NaN payloads and the f32 NaN
decoded from an fp8 NaN follow numerics.py (UNVERIFIED payload bits).
"""
from __future__ import annotations

import numpy as np

from .. import hazards, numerics
from ..errors import UnsupportedInstruction
from ..registry import handles
from ..state import LANES
from . import dpp
from .vop import flush_denorms

F32_MIN_NORMAL = np.float32(1.1754944e-38)
_DST_SEL = getattr(hazards, "DST_SEL", hazards.CVT_SCALE_HI)


# ------------------------------------------------------------------ encoding helpers
def vop3_op_sel(inst) -> tuple[int, int, int, int]:
    """op_sel[0..3] from a VOP3 (gfx9) word; zeros for other encodings."""
    if inst.words and (inst.words[0] >> 26) == 0x34 and (inst.words[0] >> 23) != 0x1A7:
        d0 = inst.words[0]
        return tuple((d0 >> (11 + i)) & 1 for i in range(4))
    return (0, 0, 0, 0)


def _no_output_mods(ex, inst):
    mods = inst.mods
    if mods.get("clamp") or mods.get("mul") or mods.get("div"):
        raise UnsupportedInstruction(f"{inst.name} with clamp/omod is not modelled ({ex.where()})")


def _unverified(ex, inst, err):
    return UnsupportedInstruction(f"{inst.name}: {err} ({ex.where()})")


def _select_bits(ex, inst, undefined: tuple[int, ...]) -> tuple[int, int, int, int]:
    """op_sel[0..3] of a VOP3 conversion, after refusing clamp/omod and the op_sel bits
    (indices `undefined`) the instruction does not define; source reads follow."""
    _no_output_mods(ex, inst)
    sel = vop3_op_sel(inst)
    if any(sel[i] for i in undefined):
        raise UnsupportedInstruction(f"{inst.name}: op_sel bit(s) {list(undefined)} are not defined "
                                     f"({ex.where()})")
    ex.role = None
    return sel


_SDWA_SEL = {"BYTE_0": (0, 0xFF), "BYTE_1": (8, 0xFF), "BYTE_2": (16, 0xFF), "BYTE_3": (24, 0xFF),
             "WORD_0": (0, 0xFFFF), "WORD_1": (16, 0xFFFF), "DWORD": (0, 0xFFFFFFFF)}


def _vop1_source(ex, inst, w, op):
    """uint32[n, 64] src0 of a VOP1 conversion in any encoding (e32, e64, SDWA, DPP)."""
    if inst.enc == "sdwa":
        mods = inst.mods
        if mods.get("dst_sel", "DWORD") != "DWORD" or mods.get("clamp") or mods.get("mul") or mods.get("div"):
            raise UnsupportedInstruction(f"{inst.name}: SDWA dst_sel/clamp/omod are not modelled "
                                         f"({ex.where()})")
        sel = mods.get("src0_sel", "DWORD")
        if sel not in _SDWA_SEL:
            raise UnsupportedInstruction(f"{inst.name}: SDWA src0_sel {sel} ({ex.where()})")
        bits = ex.v32(op, w)
        shift, mask = _SDWA_SEL[sel]
        return (bits >> np.uint32(shift)) & np.uint32(mask)
    if inst.enc == "dpp":
        ex.role = "dpp"
        bits = dpp.apply_source(ex, inst, w, ex.v32(op, w))
        ex.role = None
        return bits
    return ex.v32(op, w)


def _write_mask(ex, inst, w):
    mask = ex.exec_bits(w)
    if inst.enc == "dpp":
        mask = mask & dpp.write_mask(ex, inst, w)
    return mask


def _f32_source(ex, op, bits):
    """f32 source value after the denormal mode and the neg/abs modifiers (float64)."""
    x = bits.view(np.float32)
    if not ex.denorm_f32:
        x = flush_denorms(x, ex.fast)             # bits are a fresh register read
    with np.errstate(invalid="ignore"):          # signaling NaNs quieten, as on the ALU
        x = x.astype(np.float64)
    if op.abs:
        x = np.abs(x)
    if op.neg:
        x = -x
    return x


def _dst1(ex, inst):
    dst = inst.ops[0]
    if dst.kind != "v" or dst.count != 1:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be one VGPR ({ex.where()})")
    return dst


def _flush_f32_result(ex, r):
    return r if ex.denorm_f32 else flush_denorms(r, ex.fast)


# ------------------------------------------------------------------ bf16 / f16 packing
def _pk16(ex, inst, w, encode, fast=None):
    """fast(ex, op, bits): the same halves as encode(_f32_source(...)) straight from the
    bits, or None where it does not apply (then encode runs)."""
    _no_output_mods(ex, inst)
    if any(vop3_op_sel(inst)):
        raise UnsupportedInstruction(f"{inst.name} with op_sel is not modelled ({ex.where()})")
    ex.role = None
    dst, a_op, b_op = inst.ops
    _dst1(ex, inst)
    halves = []
    for op in (a_op, b_op):
        bits = ex.v32(op, w)
        half = fast(ex, op, bits) if fast is not None else None
        halves.append(encode(_f32_source(ex, op, bits)).astype(np.uint32) if half is None else half)
    ex.set_v(dst, w, halves[0] | (halves[1] << np.uint32(16)), ex.exec_mask(w), hazards.VALU)


_SIGN, _EXP, _ABS = np.uint32(0x80000000), np.uint32(0x7F800000), np.uint32(0x7FFFFFFF)


def _bf16_rne_bits(ex, op, bits):
    """numerics.f32_to_bf16_rne(_f32_source(ex, op, bits)) as uint32 by integer RNE on the
    f32 bits (bf16 is f32's upper half: add 0x7FFF plus the kept lsb, which carries into
    the exponent, to Inf on overflow, and keeps denormals); None when a lane is NaN (the
    quiet-NaN payload rule is numerics')."""
    if ((bits & _ABS) > _EXP).any():
        return None
    if not ex.denorm_f32:
        bits = np.where((bits & _EXP) == 0, bits & _SIGN, bits)      # denormals flush to +-0
    if op.abs:
        bits = bits & _ABS
    if op.neg:
        bits = bits ^ _SIGN
    return (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)


def _pk_bf16_compiled(ex, inst, w) -> bool:
    """v_cvt_pk_bf16_f32 through fast.pk_bf16 where it applies (no modifier fields, VGPR
    operands, no NaN lane): _pk16's reads, checks and write in its order, the same bits.
    False: not done (nothing written; _pk16 then reads and checks again)."""
    dst, a_op, b_op = inst.ops
    if (inst.mods or inst.enc in ("dpp", "sdwa") or any(vop3_op_sel(inst))
            or any(op.kind != "v" or op.count != 1 for op in inst.ops)):
        return False
    ex.role = None
    for op in (a_op, b_op):
        ex.check_read("v", w, op.index, 1)
    rows = ex.wave_ids(w)
    out = np.empty((len(rows), LANES), np.uint32)
    if not ex.fast.pk_bf16(ex.waves.vgpr, rows, np.array([a_op.index, b_op.index]), not ex.denorm_f32,
                           np.array([a_op.abs, b_op.abs]), np.array([a_op.neg, b_op.neg]), out):
        return False
    ex.set_v(dst, w, out, ex.exec_mask(w), hazards.VALU)
    return True


@handles("v_cvt_pk_bf16_f32", klass="valu")
def cvt_pk_bf16_f32(ex, inst, w):
    if ex.fast is None or not _pk_bf16_compiled(ex, inst, w):
        _pk16(ex, inst, w, numerics.f32_to_bf16_rne, _bf16_rne_bits)


def _f16_out(ex, bits):
    return bits if ex.denorm_f16 else numerics.flush_f16_denorm_bits(bits)


@handles("v_cvt_pk_f16_f32", klass="valu")
def cvt_pk_f16_f32(ex, inst, w):
    ovfl = bool(getattr(ex, "fp16_ovfl", False))
    _pk16(ex, inst, w, lambda x: _f16_out(ex, numerics.f32_to_f16_rne(x, ovfl_saturate=ovfl)))


def f32_to_f16_rtz(x):
    """f16 bits of x (float64 holding f32 values) rounded toward zero: finite values never
    round up to Inf, Inf stays Inf, NaN stays NaN."""
    bits = numerics.f32_to_f16_rne(x).astype(np.int64)
    back = numerics.f16_to_f32(bits.astype(np.uint16)).astype(np.float64)
    away = np.isfinite(x) & (np.abs(back) > np.abs(x))     # RNE rounded away from zero
    return np.where(away, bits - 1, bits).astype(np.uint16)


@handles("v_cvt_pkrtz_f16_f32", klass="valu")
def cvt_pkrtz_f16_f32(ex, inst, w):
    if inst.enc == "e32":
        raise UnsupportedInstruction(f"{inst.name}_e32 does not exist on gfx950 ({ex.where()})")
    _pk16(ex, inst, w, lambda x: _f16_out(ex, f32_to_f16_rtz(x)))


@handles("v_cvt_f32_bf16", klass="valu")
def cvt_f32_bf16(ex, inst, w):
    _no_output_mods(ex, inst)
    ex.role = None
    dst, src = inst.ops
    _dst1(ex, inst)
    bits = _vop1_source(ex, inst, w, src) & np.uint32(0xFFFF)
    x = numerics.bf16_to_f32(bits.astype(np.uint16))
    if src.abs:
        x = np.abs(x)
    if src.neg:
        x = -x
    ex.set_v(dst, w, _flush_f32_result(ex, x).view(np.uint32), _write_mask(ex, inst, w), hazards.VALU)


# ------------------------------------------------------------------ fp8 / bf8
def _fmt(name: str) -> str:
    return "bf8" if "bf8" in name else "fp8"


def _encode(ex, inst, w, fmt: str, x):
    """fp8/bf8 codes of x; lanes EXEC disables are not converted (they write nothing, so
    an unmodelled NaN result there must not stop the kernel)."""
    sat = bool(getattr(ex, "fp16_ovfl", False))
    enc = numerics.f32_to_fp8_e5m2 if fmt == "bf8" else numerics.f32_to_fp8_e4m3
    x = np.where(ex.exec_bits(w), x, 0)
    # NaN results get AMD's host-model byte (numerics.GFX950_FP8_NAN): that they are NaN
    # is hardware-tested (ISA 7.3 table; composable_kernel test_mx_fp8 on gfx950).
    return enc(x, sat, nan_encoding=numerics.GFX950_FP8_NAN)


def _decode(fmt: str, codes):
    dec = numerics.fp8_e5m2_to_f32 if fmt == "bf8" else numerics.fp8_e4m3_to_f32
    return dec(np.asarray(codes, np.uint8))


def _write_word(ex, inst, w, dst, hi: bool, word16):
    """Write 16 bits into the low or high word of dst, keeping the other word."""
    old = ex.v32(dst, w)
    word16 = word16.astype(np.uint32)
    if hi:
        value = (old & np.uint32(0xFFFF)) | (word16 << np.uint32(16))
    else:
        value = (old & np.uint32(0xFFFF0000)) | word16
    ex.set_v(dst, w, value, ex.exec_bits(w), _DST_SEL if hi else hazards.VALU)


@handles("v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32", klass="valu")
def cvt_pk_fp8_f32(ex, inst, w):
    sel = _select_bits(ex, inst, (0, 1, 2))
    dst, a_op, b_op = inst.ops
    _dst1(ex, inst)
    fmt = _fmt(inst.name)
    lo = _encode(ex, inst, w, fmt, _f32_source(ex, a_op, ex.v32(a_op, w)))
    hi = _encode(ex, inst, w, fmt, _f32_source(ex, b_op, ex.v32(b_op, w)))
    _write_word(ex, inst, w, dst, bool(sel[3]), lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(8)))


@handles("v_cvt_f32_fp8", "v_cvt_f32_bf8", klass="valu")
def cvt_f32_fp8(ex, inst, w):
    _no_output_mods(ex, inst)
    ex.role = None
    dst, src = inst.ops
    _dst1(ex, inst)
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    code = _vop1_source(ex, inst, w, src) & np.uint32(0xFF)
    x = _decode(_fmt(inst.name), code)
    ex.set_v(dst, w, x.view(np.uint32), _write_mask(ex, inst, w), hazards.VALU)


def _dst2(ex, inst):
    dst = inst.ops[0]
    if dst.kind != "v" or dst.count != 2:
        raise UnsupportedInstruction(f"{inst.name}: vdst {dst.text} must be a VGPR pair ({ex.where()})")
    return dst


@handles("v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8", klass="valu")
def cvt_pk_f32_fp8(ex, inst, w):
    _no_output_mods(ex, inst)
    ex.role = None
    dst, src = inst.ops
    _dst2(ex, inst)
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    bits = _vop1_source(ex, inst, w, src)
    fmt = _fmt(inst.name)
    pair = [_decode(fmt, (bits >> np.uint32(8 * b)) & np.uint32(0xFF)).view(np.uint32) for b in (0, 1)]
    ex.set_v(dst, w, np.stack(pair, axis=1), _write_mask(ex, inst, w), hazards.VALU)


# ------------------------------------------------------------------ scaled converts
def _scale(ex, inst, w, op, nan_ok: bool = False):
    """E8M0 exponent byte taken from the exponent field of the f32 scale operand. Only lanes
    EXEC enables are checked; the others (whose results are never written) get 127.
    nan_ok: the caller models a 0xFF byte (NaN) and gets it through; otherwise an enabled
    lane with 0xFF is rejected."""
    bits = ex.v32(op, w)
    e = numerics.scale_exponent_from_f32_bits(bits)
    active = ex.exec_bits(w)
    if not nan_ok and ((e == 0xFF) & active).any():
        raise UnsupportedInstruction(f"{inst.name}: scale operand with exponent field 0xFF (Inf/NaN): "
                                     f"gfx950 behaviour unverified ({ex.where()})")
    return np.where(active, e, np.uint8(127)).astype(np.uint8)


@handles("v_cvt_scalef32_pk_fp8_f32", "v_cvt_scalef32_pk_bf8_f32", klass="valu")
def cvt_scalef32_pk_fp8_f32(ex, inst, w):
    sel = _select_bits(ex, inst, (0, 1, 2))
    dst, a_op, b_op, s_op = inst.ops
    _dst1(ex, inst)
    fmt = _fmt(inst.name)
    scale = _scale(ex, inst, w, s_op)
    out = []
    for op in (a_op, b_op):
        x = numerics.scale_down(_f32_source(ex, op, ex.v32(op, w)), scale)
        out.append(_encode(ex, inst, w, fmt, x).astype(np.uint32))
    _write_word(ex, inst, w, dst, bool(sel[3]), out[0] | (out[1] << np.uint32(8)))


_F32_QNAN = np.uint32(0x7FC00000)


def _scale_up_f32(ex, inst, w, codes, fmt, scale):
    """f32 of fp8/bf8 `codes` times 2^(scale-127) (scale: E8M0 bytes, 0xFF allowed), as
    fp8_to_f32_scale does on gfx950 (numerics docstring; docs/fp8-conversion-evidence.md):
    the exact product, +-Inf where it overflows f32 (composable_kernel's gfx950 device test
    of all 256 x 256 scale/code pairs, amd_hip_ocp_host.hpp's "Overflow: return infinity
    (gfx950 HW behavior)"), and NaN for an fp8 NaN or a 0xFF scale (the OCP MX rule; the
    same device test) with the bits amd_hip_ocp_host.hpp's to_float gives, the code's sign
    | 0x7FC00000 -- the same bits _decode gives an fp8 NaN (payload UNVERIFIED)."""
    codes = np.asarray(codes, np.uint32)
    x = numerics.scale_up(_decode(fmt, codes).astype(np.float64), scale, nan_scale="nan")
    with np.errstate(over="ignore", invalid="ignore"):
        r = x.astype(np.float32)
    active = ex.exec_bits(w)                        # lanes EXEC disables produce nothing
    finite = np.isfinite(x) & active
    if getattr(ex, "fp16_ovfl", False) and (finite & ~np.isfinite(r)).any():
        # The hardware data above are all from FP16_OVFL = 0 (HIP's and CK's default);
        # whether the bit turns this f32 overflow into saturation is untested.
        raise UnsupportedInstruction(f"{inst.name}: the scaled result overflows f32 with MODE.FP16_OVFL "
                                     f"set; gfx950 behaviour unverified ({ex.where()})")
    nan = np.isnan(x)
    if nan.any():
        bits = ((codes >> np.uint32(7)) << np.uint32(31)) | _F32_QNAN
        r = np.where(nan, bits.view(np.float32), r)
    tiny = finite & (r != 0) & (np.abs(r) < F32_MIN_NORMAL)
    if not ex.denorm_f32 and tiny.any():
        raise UnsupportedInstruction(f"{inst.name}: the scaled result is an f32 denormal while the f32 "
                                     f"denormal mode flushes; the hardware behaviour is unverified "
                                     f"({ex.where()})")
    return r


@handles("v_cvt_scalef32_f32_fp8", "v_cvt_scalef32_f32_bf8", klass="valu")
def cvt_scalef32_f32_fp8(ex, inst, w):
    sel = _select_bits(ex, inst, (2, 3))
    dst, src, s_op = inst.ops
    _dst1(ex, inst)
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    byte = sel[0] + 2 * sel[1]
    codes = (ex.v32(src, w) >> np.uint32(8 * byte)) & np.uint32(0xFF)
    r = _scale_up_f32(ex, inst, w, codes, _fmt(inst.name), _scale(ex, inst, w, s_op, nan_ok=True))
    ex.set_v(dst, w, r.view(np.uint32), ex.exec_bits(w), hazards.VALU)


@handles("v_cvt_scalef32_pk_f32_fp8", "v_cvt_scalef32_pk_f32_bf8", klass="valu")
def cvt_scalef32_pk_f32_fp8(ex, inst, w):
    sel = _select_bits(ex, inst, (1, 2, 3))
    dst, src, s_op = inst.ops
    _dst2(ex, inst)
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    word = ex.v32(src, w) >> np.uint32(16 * sel[0])
    scale = _scale(ex, inst, w, s_op, nan_ok=True)      # same fp8_to_f32_scale as the single form
    fmt = _fmt(inst.name)
    pair = [_scale_up_f32(ex, inst, w, (word >> np.uint32(8 * b)) & np.uint32(0xFF), fmt, scale).view(np.uint32)
            for b in (0, 1)]
    ex.set_v(dst, w, np.stack(pair, axis=1), ex.exec_bits(w), hazards.VALU)


# ------------------------------------------------------------------ FP4 (E2M1) converts
# Operand forms and select bits checked with llc-22 (llvm.amdgcn.cvt.scalef32.pk.*):
#   v_cvt_scalef32_pk_fp4_f32 d, a, b, scale   byte op_sel[2] + 2*op_sel[3] of d =
#                                              fp4(a / 2^s) | fp4(b / 2^s) << 4; other bytes kept
#   v_cvt_scalef32_pk_fp4_{f16,bf16} d, s, scale   the same from the two halves of s (low first)
#   v_cvt_scalef32_pk_{f32,f16,bf16}_fp4 d, s, scale
#                                              byte op_sel[0] + 2*op_sel[1] of s: low nibble ->
#                                              element 0, high nibble -> element 1, times 2^s
# llc puts one wait state after a byte-select (byte != 0) write before a VALU reads the
# register (gfx950 CvtScaleForwarding), so those writes carry the dst-sel writer code.
# FP4 results may be denormal (0.5) regardless of MODE; E2M1 has no Inf/NaN, so finite
# overflow saturates to +-6 and NaN/Inf sources are rejected (numerics.f32_to_fp4_e2m1).


def _encode_fp4(ex, inst, w, x):
    try:
        return numerics.f32_to_fp4_e2m1(np.where(ex.exec_bits(w), x, 0))
    except numerics.UnverifiedNumericsError as err:
        raise _unverified(ex, inst, err) from err


def _half_sources(ex, inst, w, op):
    """float64 [2, n, 64]: the low and high 16-bit halves of op as f16 or bf16 values. A
    denormal half under a flushing MODE is rejected: whether these converts flush their
    16-bit sources is unverified."""
    if op.neg or op.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    bits = ex.v32(op, w)
    halves = [(bits >> np.uint32(16 * h)) & np.uint32(0xFFFF) for h in (0, 1)]
    if inst.name.endswith("_bf16"):
        vals = [numerics.bf16_to_f32(h.astype(np.uint16)) for h in halves]
        flushing, smallest = not ex.denorm_f32, np.finfo(np.float32).tiny
    else:
        vals = [numerics.f16_to_f32(h.astype(np.uint16)) for h in halves]
        flushing, smallest = not ex.denorm_f16, np.finfo(np.float16).tiny
    out = np.stack(vals).astype(np.float64)
    tiny = (out != 0) & (np.abs(out) < smallest)
    if flushing and (tiny & ex.exec_bits(w)[None]).any():
        raise UnsupportedInstruction(f"{inst.name}: denormal 16-bit source under a flushing denormal "
                                     f"mode; the hardware behaviour is unverified ({ex.where()})")
    return out


@handles("v_cvt_scalef32_pk_fp4_f32", "v_cvt_scalef32_pk_fp4_f16", "v_cvt_scalef32_pk_fp4_bf16",
         klass="valu")
def cvt_scalef32_pk_fp4(ex, inst, w):
    sel = _select_bits(ex, inst, (0, 1))
    dst = _dst1(ex, inst)
    scale = _scale(ex, inst, w, inst.ops[-1])
    if inst.name.endswith("_f32"):
        xs = [_f32_source(ex, op, ex.v32(op, w)) for op in inst.ops[1:3]]
    else:
        xs = list(_half_sources(ex, inst, w, inst.ops[1]))
    lo, hi = (_encode_fp4(ex, inst, w, numerics.scale_down(x, scale)).astype(np.uint32) for x in xs)
    byte = sel[2] + 2 * sel[3]
    shift = np.uint32(8 * byte)
    old = ex.v32(dst, w)
    value = (old & ~np.uint32(0xFF << (8 * byte))) | ((lo | (hi << np.uint32(4))) << shift)
    ex.set_v(dst, w, value, ex.exec_bits(w), _DST_SEL if byte else hazards.VALU)


@handles("v_cvt_scalef32_pk_f32_fp4", "v_cvt_scalef32_pk_f16_fp4", "v_cvt_scalef32_pk_bf16_fp4",
         klass="valu")
def cvt_scalef32_pk_from_fp4(ex, inst, w):
    sel = _select_bits(ex, inst, (2, 3))
    dst, src, s_op = inst.ops
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    byte = (ex.v32(src, w) >> np.uint32(8 * (sel[0] + 2 * sel[1]))) & np.uint32(0xFF)
    scale = _scale(ex, inst, w, s_op)
    vals = [numerics.scale_up(numerics.fp4_e2m1_to_f32((byte >> np.uint32(4 * h)) & np.uint32(0xF))
                              .astype(np.float64), scale) for h in (0, 1)]
    if inst.name == "v_cvt_scalef32_pk_f32_fp4":
        _dst2(ex, inst)
        pair = [_exact(ex, inst, w, v, np.float32).view(np.uint32) for v in vals]
        ex.set_v(dst, w, np.stack(pair, axis=1), ex.exec_bits(w), hazards.VALU)
        return
    _dst1(ex, inst)
    if inst.name.endswith("_bf16_fp4"):
        halves = [_exact_bf16(ex, inst, w, v) for v in vals]
    else:
        halves = [_exact(ex, inst, w, v, np.float16).view(np.uint16) for v in vals]
    ex.set_v(dst, w, halves[0].astype(np.uint32) | (halves[1].astype(np.uint32) << np.uint32(16)),
             ex.exec_bits(w), hazards.VALU)


def _exact(ex, inst, w, v: np.ndarray, dtype) -> np.ndarray:
    """v (exact float64) as `dtype`; a value that overflows, is inexact (below the
    format's subnormal resolution) or is a denormal the MODE would flush is rejected:
    those results are unverified. NaN converts to the format's quiet NaN."""
    with np.errstate(over="ignore", under="ignore"):
        r = v.astype(dtype)
    active = ex.exec_bits(w) & ~np.isnan(v)     # NaN stays NaN (payload unverified, as above)
    if ((r.astype(np.float64) != v) & active).any():
        raise UnsupportedInstruction(f"{inst.name}: the scaled value is not exact in {np.dtype(dtype).name}; "
                                     f"overflow/rounding is unverified ({ex.where()})")
    flush = not (ex.denorm_f16 if dtype == np.float16 else ex.denorm_f32)
    tiny = (r != 0) & (np.abs(r) < np.finfo(dtype).tiny)
    if flush and (tiny & active).any():
        raise UnsupportedInstruction(f"{inst.name}: the result is a denormal while the denormal mode "
                                     f"flushes; the hardware behaviour is unverified ({ex.where()})")
    return r


def _exact_bf16(ex, inst, w, v: np.ndarray) -> np.ndarray:
    """bf16 bits of v, which must be exact in bf16 (the f32 checks, then bf16's shorter
    subnormal resolution)."""
    bits = numerics.f32_to_bf16_rne(_exact(ex, inst, w, v, np.float32))
    if ((numerics.bf16_to_f32(bits).astype(np.float64) != v) & ex.exec_bits(w) & ~np.isnan(v)).any():
        raise UnsupportedInstruction(f"{inst.name}: the scaled value is not exact in bf16; its rounding "
                                     f"is unverified ({ex.where()})")
    return bits


# ------------------------------------------------------------------ fp8/bf8 <-> 16-bit scaled
# Select bits checked with llc-22 (llvm.amdgcn.cvt.scalef32.{pk.fp8.f16, f16.fp8, pk.f16.fp8};
# the half-select write op_sel[3] carries the dst-sel writer code like the other high-half writes):
#   v_cvt_scalef32_pk_{fp8,bf8}_{f16,bf16} d, s, scale   word op_sel[3] of d = {fp8(lo/2^s),
#                                                        fp8(hi/2^s)}; the other word kept
#   v_cvt_scalef32_f16_{fp8,bf8} d, s, scale             half op_sel[3] of d = byte
#                                                        op_sel[0] + 2*op_sel[1] of s, times 2^s
#   v_cvt_scalef32_pk_{f16,bf16}_{fp8,bf8} d, s, scale   the two bytes of word op_sel[0] of s
# A 16-bit result must be exact (fp8 has fewer significant bits): overflow, rounding below
# the 16-bit subnormal range, and denormals under a flushing MODE are rejected (_exact).
_PK8_FROM16 = [f"v_cvt_scalef32_pk_{f}_{t}" for f in ("fp8", "bf8") for t in ("f16", "bf16")]
_ONE16_FROM8 = ["v_cvt_scalef32_f16_fp8", "v_cvt_scalef32_f16_bf8"]     # no bf16 form (llvm-mc 22)
_PK16_FROM8 = [f"v_cvt_scalef32_pk_{t}_{f}" for f in ("fp8", "bf8") for t in ("f16", "bf16")]


def _fp8_fmt(name: str) -> str:
    return "bf8" if name.endswith("bf8") or "_bf8_" in name else "fp8"


@handles(*_PK8_FROM16, klass="valu")
def cvt_scalef32_pk_fp8_16bit(ex, inst, w):
    sel = _select_bits(ex, inst, (0, 1, 2))
    dst, src, s_op = inst.ops
    _dst1(ex, inst)
    scale = _scale(ex, inst, w, s_op)
    fmt = _fp8_fmt(inst.name)
    lo, hi = (_encode(ex, inst, w, fmt, numerics.scale_down(x, scale)).astype(np.uint32)
              for x in _half_sources(ex, inst, w, src))
    _write_word(ex, inst, w, dst, bool(sel[3]), lo | (hi << np.uint32(8)))


def _to_16bit(ex, inst, w, v):
    """16-bit bits (uint32) of exact float64 v in the instruction's destination format."""
    if "_bf16_" in inst.name:
        return _exact_bf16(ex, inst, w, v).astype(np.uint32)
    return _exact(ex, inst, w, v, np.float16).view(np.uint16).astype(np.uint32)


def _scaled_bytes(ex, inst, w, src, s_op, shifts):
    if src.neg or src.abs:
        raise UnsupportedInstruction(f"{inst.name}: source modifiers are not modelled ({ex.where()})")
    bits = ex.v32(src, w)
    scale = _scale(ex, inst, w, s_op)
    fmt = _fp8_fmt(inst.name)
    return [numerics.scale_up(_decode(fmt, (bits >> np.uint32(s)) & np.uint32(0xFF)).astype(np.float64), scale)
            for s in shifts]


@handles(*_ONE16_FROM8, klass="valu")
def cvt_scalef32_16bit_fp8(ex, inst, w):
    sel = _select_bits(ex, inst, (2,))
    dst, src, s_op = inst.ops
    _dst1(ex, inst)
    (v,) = _scaled_bytes(ex, inst, w, src, s_op, [8 * (sel[0] + 2 * sel[1])])
    _write_word(ex, inst, w, dst, bool(sel[3]), _to_16bit(ex, inst, w, v))


@handles(*_PK16_FROM8, klass="valu")
def cvt_scalef32_pk_16bit_fp8(ex, inst, w):
    sel = _select_bits(ex, inst, (1, 2, 3))
    dst, src, s_op = inst.ops
    _dst1(ex, inst)
    lo, hi = (_to_16bit(ex, inst, w, v) for v in _scaled_bytes(ex, inst, w, src, s_op,
                                                                 [16 * sel[0], 16 * sel[0] + 8]))
    ex.set_v(dst, w, lo | (hi << np.uint32(16)), ex.exec_bits(w), hazards.VALU)

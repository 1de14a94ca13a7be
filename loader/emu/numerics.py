"""Vectorized number-format helpers for the gfx950 emulator.

Everything here works on whole numpy arrays: raw bit patterns (uint32 for
f32 words, uint16 for f16/bf16, uint8 for fp8/e8m0) and float32/float64 values.
There are no Python loops over elements.

Rounding is done once, from an exact value.  Every f32 (and every f32 times a
power of two in the range the hardware can produce) is exact in float64, so
the encoders take a float array, widen it to float64 and round that value to
the target format with round-to-nearest-even.  That is the IEEE definition of
the conversion, so no double rounding can occur.

Hardware behaviour and where it comes from
------------------------------------------
[ISA] AMD "CDNA4 Instruction Set Architecture" reference guide (5-Aug-2025),
read through the unofficial Markdown conversion in
github.com/kuhar/amdgpu-isa-manuals, cdna4/README.md:

* Sec. 3.5, MODE register: FP16_OVFL is bit 23: "If set, an overflowed FP16
  result is clamped to +/- MAX_FP16, regardless of round mode, while still
  preserving true INF values."
* Sec. 7.3, "CVT_*FP8_F32 and CVT*_BF8_F32 FP16_OVFL rule": "The FP16_OVFL flag
  is applied to data conversions from F32 to FP8/BF8 formats."

      source       FP8, OVFL=1  FP8, OVFL=0  BF8, OVFL=1  BF8, OVFL=0
      NaN          NaN          NaN          NaN          NaN
      +-Inf        +-max_E4M3   NaN          +-max_E5M2   +-Inf
      > max FP8    +-max_E4M3   NaN          +-max_E5M2   +-Inf

  (The "> max FP8" row appears in one revision of the Markdown conversion and
  was lost from a later one; the prose above the table covers it anyway.)
* Sec. 7.3, "Converts with Scale": "Conversion to F4/F6 does not support
  FP16_OVFL, while to F8 does", "Conversion from F32 supports MODE-based
  denormal control; F4/F6/F8 allows denorms regardless of MODE", "The scale is
  an E8M0 exponent with a bias of 127", taken from the exponent field of an f32
  operand.  Pseudocode: ``scale = 32'U(exponent(S2.f32))``,
  ``tmp0 = f32_to_fp8_scale(S0.f32, scale.u8)``.
* Table 31: V_CVT_PK_FP8_F32 / V_CVT_PK_BF8_F32 are RNE and ignore clamp and
  omod.  The V_CVT_PK_BF16_F32 pseudocode forces ROUND_NEAREST_EVEN.
* Sec. 7.2: block scales are E8M0, "valid values in: -127, 127 (0xFF is NaN)".

So ``saturate`` below is the wave's MODE.FP16_OVFL bit, for both
v_cvt_pk_{fp8,bf8}_f32 and v_cvt_scalef32_pk_{fp8,bf8}_*.  It starts as
COMPUTE_PGM_RSRC1 bit 26 of the kernel descriptor (assembler directive
``.amdhsa_fp16_overflow``, default 0; checked with llvm-mc 22: the directive
set to 1 gives rsrc1 0x04ac0040 instead of 0x00ac0040) and can be changed with
``s_setreg ... hwreg(HW_REG_MODE, 23, 1)``.

Corroboration: triton-lang/triton PR #7337 ("on mi350 ... v_cvt_scalef32_pk_fp8_f32
... according to ISA, is in non-saturation mode"; fixed by enabling FP16_OVFL
in MODE); ROCm/rocm-systems issue #9556 (measured on gfx950: an f16 sum
448 + 18 packed with v_cvt_scalef32_pk_fp8_f16 gives 0x7f, NaN, and bf8
57344 + 4096 gives +Inf); rocm-systems PR #9030 (rocjitsu models FP16_OVFL as
"finite overflow behavior for f32->f8"); hip's amd_hip_fp8.h clamps with
fmed3 in software before v_cvt_pk_fp8_f32 when it wants saturation.

Overflow is decided after rounding (IEEE), so 464 (the tie between 448 and
480) still gives E4M3 448 and 61440 gives E5M2 Inf.  A public gfx950-on-gfx942
lowering (C++ namespace COMGR::hotswap, seen in the code index; repository not
identified) uses exactly these thresholds.  That "after rounding" is what the
silicon does is inferred, not measured.

The fp8/bf8 NaN byte (docs/fp8-conversion-evidence.md has the sources in full):
that a NaN source, and an FP8 overflow without FP16_OVFL, give a NaN is settled
(the ISA table above; on gfx950 hardware, composable_kernel's test_mx_fp8 device test
gets NaN from v_cvt_scalef32_pk_fp8_f32 for a NaN, an Inf/2, 256/0.5 and -256/0.5;
rocm-systems issue #9556 measured 0x7F for a positive overflow). The byte itself is
not measured beyond that positive case. The emulator writes what AMD's own software
model of these gfx950 conversions writes: ROCm/clr hipamd amd_hip_ocp_host.hpp
(namespace fcbx, the host side of the __amd_cvt_* API whose device side is the gfx950
builtin) makes an E4M3 NaN sign | 0x7F and an E5M2 NaN sign | 0x7E, the sign of the
source kept (nan_encoding "amd_host", GFX950_FP8_NAN below). rocjitsu (AMD's
emulator, PR #8800, for gfx1250) also keeps the sign for E4M3; a gfx950-on-gfx942
lowering (C++ namespace COMGR::hotswap, repository not identified) writes 0x7F / 0x7E
without it. So the SIGN BIT of a negative NaN result is the one unmeasured part: both
codes are NaN to every consumer (v_cvt_f32_fp8, the MFMAs, torch), and the emulator's
f32 NaN signs are x86's anyway (vop.py), but a kernel that stores such a byte shows it.
The fp8 encoders take ``nan_encoding``: "reject" (default of the functions here,
raises UnverifiedNumericsError when any output would be NaN), "amd_host" (the model
above), "signed" (sign | 0x7F in both formats) or "unsigned" (0x7F E4M3, 0x7E E5M2).
Also unverified: NaN payload bits of f16/bf16 results (we return a quiet NaN keeping
the sign and the top payload bits), and the f32 NaN produced by decoding an fp8 NaN
(we return sign | 0x7FC00000, which is also what amd_hip_ocp_host.hpp's to_float
returns).

Scaled up-conversion to f32 (v_cvt_scalef32_{pk_,}f32_{fp8,bf8}): the ISA pseudocode of
both goes through one helper, fp8_to_f32_scale(src, scale.u8). On gfx950 hardware,
composable_kernel's test_mx_fp8 / test_mx_bf8 DeviceScaledConvert run
v_cvt_scalef32_f32_fp8 / _bf8 on all 256 x 256 (E8M0, fp8) pairs: scale 0xFF gives NaN
for every code (the OCP MX rule), an fp8 NaN gives NaN, a bf8 Inf stays Inf, and every
other pair is within 4 ulp (gtest ASSERT_FLOAT_EQ) of the f32 product 2^(e-127) * x --
which is +-Inf where it overflows, so the hardware gives +-Inf or a value within 4 ulp
of FLT_MAX there (NaN and exponent wrap-around are ruled out), and f32 denormals where
the product is tiny (flushing to 0 is ruled out, under HIP's default denormal mode).
amd_hip_ocp_host.hpp's to_float says which: "Overflow: return infinity (gfx950 HW
behavior)". So: overflow -> +-Inf, scale 0xFF -> NaN (the fp8 code's sign |
0x7FC00000, as to_float), modelled in families/cvt.py; these tests ran with
FP16_OVFL = 0, so an overflow with FP16_OVFL set stays rejected there, as does a
denormal result under a flushing MODE. ``scale_up`` / ``scale_down`` themselves still
take ``nan_scale``: 'reject' (default) or 'nan'. A 0xFF scale on the DOWN-conversions
(f32/f16/bf16 -> fp8/bf8/fp4) has no hardware data and stays rejected in cvt.py.

MFMA block scaling
------------------
``e8m0_to_f32(0)`` is 2**-127, an f32 *denormal*: exact as a value, but any
flush-to-zero path would turn it into 0, and the product of two scales can be
as small as 2**-254, below the f32 range.  Apply MFMA scales as exponent
arithmetic: ``np.ldexp(block_dot_f64, sa + sb - 254)`` in float64 (exact for
every finite scale pair), or use ``mfma_scale_factor(sa, sb)`` which returns
that float64 power of two (NaN when either byte is 0xFF).  Per the ISA the
scales multiply the 32-element block dot product before it is added to C.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import UnsupportedInstruction

__all__ = [
    "UnverifiedNumericsError",
    "as_f32", "as_u32", "as_f16", "as_u16",
    "flush_f32_denorms", "flush_f32_denorm_bits", "flush_f16_denorm_bits",
    "f32_to_bf16_rne", "f32_to_bf16_trunc", "bf16_to_f32",
    "f32_to_f16_rne", "f16_to_f32",
    "fp8_e4m3_to_f32", "fp8_e5m2_to_f32", "f32_to_fp8_e4m3", "f32_to_fp8_e5m2",
    "e8m0_to_f32", "e8m0_to_f64", "mfma_scale_factor",
    "scale_exponent_from_f32_bits", "scale_down", "scale_up",
    "fp4_e2m1_to_f32", "f32_to_fp4_e2m1",
    "E4M3_MAX", "E5M2_MAX", "E2M1_MAX", "GFX950_FP8_NAN",
]

E4M3_MAX = 448.0
E5M2_MAX = 57344.0

NAN_ENCODINGS = ("reject", "amd_host", "signed", "unsigned")
# The NaN byte the emulator's fp8/bf8 down-conversions write (module docstring): AMD's
# host model of the gfx950 conversions, ROCm/clr amd_hip_ocp_host.hpp fcbx::nan().
GFX950_FP8_NAN = "amd_host"


class UnverifiedNumericsError(UnsupportedInstruction):
    """Raised where the result depends on hardware behaviour nobody has confirmed: the
    emulator cannot model it, like an unimplemented instruction form."""


# ---------------------------------------------------------------------------
# input checking and bit reinterpretation
# ---------------------------------------------------------------------------

def _bits(x, dtype) -> np.ndarray:
    """Integer bit patterns as `dtype`.  Floats are refused: converting a value
    to bits numerically is always a bug here."""
    a = np.asarray(x)
    if a.dtype.kind not in "ui":
        raise TypeError(f"expected integer bit patterns, got dtype {a.dtype}")
    if a.dtype != dtype and a.size:
        width = np.dtype(dtype).itemsize * 8
        lo, hi = int(a.min()), int(a.max())
        # Negative values are accepted as two's complement of the same width.
        if lo < -(1 << (width - 1)) or hi >= (1 << width):
            raise ValueError(f"bit pattern out of range for {width} bits")
    return a.astype(dtype)


def _values(x) -> np.ndarray:
    """Float values, widened exactly to float64.  Integers are refused because
    they are usually bit patterns passed by mistake."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"expected floating-point values, got dtype {a.dtype}")
    with np.errstate(invalid="ignore"):   # a signaling NaN input warns on the cast
        return a.astype(np.float64)


def _exact_f32(x) -> np.ndarray:
    """float32 array; a wider float input must already hold f32 values."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise TypeError(f"expected floating-point values, got dtype {a.dtype}")
    f = a.astype(np.float32)
    if a.dtype != np.float32 and not np.array_equal(
            f.astype(a.dtype), a, equal_nan=True):
        raise ValueError("input is not exactly representable as float32")
    return f


def as_f32(u32) -> np.ndarray:
    """uint32 bits -> float32 (a view when the input is already uint32)."""
    return _bits(u32, np.uint32).view(np.float32)


def as_u32(f32) -> np.ndarray:
    """float32 -> uint32 bits."""
    return _exact_f32(f32).view(np.uint32)


def as_f16(u16) -> np.ndarray:
    """uint16 bits -> float16."""
    return _bits(u16, np.uint16).view(np.float16)


def as_u16(f16) -> np.ndarray:
    """float16 -> uint16 bits."""
    a = np.asarray(f16)
    if a.dtype != np.float16:
        raise TypeError(f"expected float16, got dtype {a.dtype}")
    return a.view(np.uint16)


# ---------------------------------------------------------------------------
# denormal flushing (MODE.FP_DENORM / FLOAT_DENORM_MODE_* = flush)
# ---------------------------------------------------------------------------

def flush_f32_denorm_bits(u32) -> np.ndarray:
    """Replace f32 denormal bit patterns with the zero of the same sign."""
    u = _bits(u32, np.uint32)
    denorm = ((u & 0x7F800000) == 0) & ((u & 0x007FFFFF) != 0)
    return np.where(denorm, u & np.uint32(0x80000000), u).astype(np.uint32)


def flush_f32_denorms(x_f32) -> np.ndarray:
    """f32 denormals -> signed zero; every other value (NaN bits too) unchanged.

    For FLOAT_DENORM_MODE_32 == 0 apply it to the f32 sources and to the f32
    result of an instruction.  Done on bits so -0.0 and NaN payloads survive.
    """
    return flush_f32_denorm_bits(_exact_f32(x_f32).view(np.uint32)).view(np.float32)


def flush_f16_denorm_bits(u16) -> np.ndarray:
    """f16 denormal bit patterns -> signed zero (FLOAT_DENORM_MODE_16_64 flush).
    f16 only: a bf16 word has the f32 exponent layout instead."""
    u = _bits(u16, np.uint16)
    denorm = ((u & 0x7C00) == 0) & ((u & 0x03FF) != 0)
    return np.where(denorm, u & np.uint16(0x8000), u).astype(np.uint16)


# ---------------------------------------------------------------------------
# the one rounding routine
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Fmt:
    ebits: int
    mbits: int
    bias: int
    max_code: int        # magnitude code of the largest finite value

    @property
    def emin(self) -> int:   # exponent of the smallest normal
        return 1 - self.bias

    @property
    def sign_bit(self) -> int:
        return 1 << (self.ebits + self.mbits)

    @property
    def inf_code(self) -> int:  # IEEE-shaped formats: all-ones exponent, mantissa 0
        return ((1 << self.ebits) - 1) << self.mbits


_BF16 = _Fmt(8, 7, 127, 0x7F7F)
_F16 = _Fmt(5, 10, 15, 0x7BFF)
_E4M3 = _Fmt(4, 3, 7, 0x7E)       # 0x7F is the only NaN magnitude, no Inf
_E5M2 = _Fmt(5, 2, 15, 0x7B)


def _round_magnitude(a: np.ndarray, fmt: _Fmt) -> np.ndarray:
    """RNE-round finite magnitudes a >= 0 (float64, exact) to magnitude codes.

    With e = max(floor(log2 a), emin), n = rint(a / 2**(e - mbits)) counts
    quanta of the binade (np.rint is round-half-to-even, and the scaling by a
    power of two is exact).  The code is then (e - emin) * 2**mbits + n for
    normals and subnormals alike, and a mantissa that rounds up to 2**(mbits+1)
    carries into the next binade by itself.  Codes above fmt.max_code mean
    overflow; the caller decides what that becomes.
    """
    _, e2 = np.frexp(a)                       # a = m * 2**e2, m in [0.5, 1)
    # frexp(0) gives e2 = 0, which would put zero in a normal binade.
    e = np.where(a == 0, fmt.emin, np.maximum(e2.astype(np.int64) - 1, fmt.emin))
    n = np.rint(np.ldexp(a, fmt.mbits - e)).astype(np.int64)
    return (e - fmt.emin) * (1 << fmt.mbits) + n


def _split(x):
    v = _values(x)
    sign = np.signbit(v)
    nan = np.isnan(v)
    inf = np.isinf(v)
    a = np.where(nan | inf, 0.0, np.abs(v))
    return v, sign, nan, inf, a


def _quiet_nan_payload(v: np.ndarray, fmt: _Fmt) -> np.ndarray:
    """Quiet NaN magnitude keeping the top payload bits of an f32/f64 NaN.
    UNVERIFIED payload; the sign is handled by the caller."""
    top = (np.asarray(v, np.float32).view(np.uint32) & 0x007FFFFF) >> (23 - fmt.mbits)
    quiet = 1 << (fmt.mbits - 1)
    return fmt.inf_code | quiet | top.astype(np.int64)


def _encode_ieee(x, fmt: _Fmt, saturate_finite: bool) -> np.ndarray:
    """bf16/f16: IEEE formats with Inf; NaN -> quiet NaN, Inf stays Inf."""
    v, sign, nan, inf, a = _split(x)
    mag = _round_magnitude(a, fmt)
    over = mag > fmt.max_code
    mag = np.where(over, fmt.max_code if saturate_finite else fmt.inf_code, mag)
    mag = np.where(inf, fmt.inf_code, mag)
    if nan.any():
        mag = np.where(nan, _quiet_nan_payload(np.where(nan, v, np.nan), fmt), mag)
    return mag | np.where(sign, fmt.sign_bit, 0)


# ---------------------------------------------------------------------------
# bf16 / f16
# ---------------------------------------------------------------------------

def f32_to_bf16_rne(x_f32) -> np.ndarray:
    """f32 -> bf16 bits (uint16), round to nearest even (v_cvt_pk_bf16_f32).

    Overflow rounds to +-Inf, Inf stays Inf, bf16 denormals are produced
    (flush the source first if the wave's f32 denormal mode says so).  NaN
    becomes a quiet NaN keeping sign and top 6 payload bits (payload UNVERIFIED).
    """
    return _encode_ieee(x_f32, _BF16, False).astype(np.uint16)


def f32_to_bf16_trunc(x_f32) -> np.ndarray:
    """f32 -> bf16 bits by dropping the low 16 bits (round toward zero).

    A NaN whose payload sits only in the dropped bits would turn into Inf, so
    NaNs get the quiet bit set to stay NaN (payload UNVERIFIED).
    """
    u = _exact_f32(x_f32).view(np.uint32)
    hi = (u >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, hi | np.uint16(0x0040), hi).astype(np.uint16)


def bf16_to_f32(u16) -> np.ndarray:
    """bf16 bits -> float32.  Exact: bf16 is the top half of an f32 word."""
    return (_bits(u16, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_f16_rne(x_f32, *, ovfl_saturate: bool = False) -> np.ndarray:
    """f32 -> f16 bits (uint16), round to nearest even.

    ovfl_saturate is MODE.FP16_OVFL: finite overflow gives +-65504 instead of
    +-Inf while "preserving true INF values" [ISA 3.5].  Default False is the
    reset value of the bit (.amdhsa_fp16_overflow 0).  NaN -> quiet NaN with
    sign and top 9 payload bits (payload UNVERIFIED).
    """
    return _encode_ieee(x_f32, _F16, ovfl_saturate).astype(np.uint16)


def f16_to_f32(u16) -> np.ndarray:
    """f16 bits -> float32 (exact widening, denormals become normals)."""
    return as_f16(u16).astype(np.float32)


# ---------------------------------------------------------------------------
# OCP FP8
# ---------------------------------------------------------------------------

def _fp8_nan(sign: np.ndarray, fmt: _Fmt, nan_encoding: str, where: np.ndarray,
             what: str) -> np.ndarray:
    if nan_encoding not in NAN_ENCODINGS:
        raise ValueError(f"nan_encoding must be one of {NAN_ENCODINGS}")
    if nan_encoding == "reject":
        if where.any():
            raise UnverifiedNumericsError(
                f"{what}: result is an fp8 NaN whose exact byte (sign, payload) "
                "is unverified on gfx950; pass nan_encoding='amd_host', "
                "'signed' or 'unsigned' to choose one")
        return np.zeros(sign.shape, np.int64)
    if nan_encoding == "amd_host":        # fcbx::nan: sign kept, E4M3 0x7F, E5M2 0x7E
        return np.where(sign, 0x80, 0) | (0x7F if fmt is _E4M3 else 0x7E)
    if nan_encoding == "signed":
        return np.where(sign, 0xFF, 0x7F)
    return np.full(sign.shape, 0x7F if fmt is _E4M3 else 0x7E)


def _encode_fp8(x, fmt: _Fmt, saturate: bool, nan_encoding: str,
                what: str) -> np.ndarray:
    if not isinstance(saturate, (bool, np.bool_)):
        raise TypeError("saturate must be a bool (the wave's MODE.FP16_OVFL bit)")
    v, sign, nan, inf, a = _split(x)
    mag = _round_magnitude(a, fmt)
    big = (mag > fmt.max_code) | inf          # overflow after rounding, or Inf
    out = mag | np.where(sign, 0x80, 0)
    if saturate:                              # FP16_OVFL=1: +-max for Inf too
        out = np.where(big, fmt.max_code | np.where(sign, 0x80, 0), out)
        nan_out = nan
    elif fmt is _E5M2:                        # FP16_OVFL=0, BF8: +-Inf
        out = np.where(big, fmt.inf_code | np.where(sign, 0x80, 0), out)
        nan_out = nan
    else:                                     # FP16_OVFL=0, FP8: NaN
        nan_out = nan | big
    out = np.where(nan_out, _fp8_nan(sign, fmt, nan_encoding, nan_out, what), out)
    return out.astype(np.uint8)


def f32_to_fp8_e4m3(x, saturate: bool, *, nan_encoding: str = "reject") -> np.ndarray:
    """f32 (or exact float64) -> OCP E4M3FN byte, round to nearest even.

    saturate = MODE.FP16_OVFL.  True: overflow and +-Inf give +-448 (0x7E/0xFE).
    False: they give NaN.  NaN input gives NaN.  See the module docstring for
    the sources and for nan_encoding (the byte's sign is unmeasured).
    """
    return _encode_fp8(x, _E4M3, saturate, nan_encoding, "f32_to_fp8_e4m3")


def f32_to_fp8_e5m2(x, saturate: bool, *, nan_encoding: str = "reject") -> np.ndarray:
    """f32 (or exact float64) -> OCP E5M2 byte, round to nearest even.

    saturate = MODE.FP16_OVFL.  True: overflow and +-Inf give +-57344
    (0x7B/0xFB).  False: they give +-Inf (0x7C/0xFC).  NaN input gives NaN
    (byte chosen by nan_encoding; its sign is unmeasured, see the module docstring).
    """
    return _encode_fp8(x, _E5M2, saturate, nan_encoding, "f32_to_fp8_e5m2")


_F32_QNAN = 0x7FC00000  # NaN returned by the decoders (UNVERIFIED bits)


def _decode(codes: np.ndarray, fmt: _Fmt, is_nan: np.ndarray,
            is_inf: np.ndarray) -> np.ndarray:
    c = codes.astype(np.int64)
    sign = (c >> (fmt.ebits + fmt.mbits)) & 1
    exp = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    man = c & ((1 << fmt.mbits) - 1)
    # normal: (2**mbits + man) * 2**(exp - bias - mbits); subnormal: exp field 0
    # has the exponent of exp field 1 and no implicit bit.  All exact in f32.
    sig = np.where(exp == 0, man, man + (1 << fmt.mbits))
    mag = np.ldexp(sig.astype(np.float64), np.maximum(exp, 1) - fmt.bias - fmt.mbits)
    val = np.where(sign == 1, -mag, mag).astype(np.float32)
    val = np.where(is_inf, np.where(sign == 1, -np.inf, np.inf), val).astype(np.float32)
    nan_bits = (np.uint32(_F32_QNAN) | (sign.astype(np.uint32) << 31)).view(np.float32)
    return np.where(is_nan, nan_bits, val).astype(np.float32)


def fp8_e4m3_to_f32(u8) -> np.ndarray:
    """OCP E4M3FN byte -> float32.  S.1111.111 is NaN (sign | 0x7FC00000, bits
    UNVERIFIED); there is no Inf; exp field 1111 still encodes 256..448."""
    c = _bits(u8, np.uint8)
    return _decode(c, _E4M3, (c & 0x7F) == 0x7F, np.zeros(c.shape, bool))


def fp8_e5m2_to_f32(u8) -> np.ndarray:
    """OCP E5M2 byte -> float32.  S.11111.00 is +-Inf, S.11111.{01,10,11} NaN."""
    c = _bits(u8, np.uint8)
    m = c & 0x7F
    return _decode(c, _E5M2, m > 0x7C, m == 0x7C)


# ---------------------------------------------------------------------------
# OCP MX FP4 (E2M1)
# ---------------------------------------------------------------------------
# OCP Microscaling Formats (MX) v1.0, §5.3.3: E2M1 has bias 1, no Inf and no NaN;
# magnitudes 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6.

_E2M1 = _Fmt(2, 1, 1, 0x7)
E2M1_MAX = 6.0


def fp4_e2m1_to_f32(u4) -> np.ndarray:
    """FP4 E2M1 code (0..15, in any integer array) -> float32; exact."""
    c = _bits(u4, np.uint8)
    if c.size and int(c.max()) > 0xF:
        raise ValueError("FP4 codes must be 0..15")
    none = np.zeros(c.shape, bool)
    return _decode(c, _E2M1, none, none)


def f32_to_fp4_e2m1(x) -> np.ndarray:
    """f32 (or exact float64) -> FP4 E2M1 code (uint8 0..15), round to nearest even.

    A finite magnitude above 6 after rounding saturates to +-6: E2M1 has no Inf or NaN
    to overflow to, and the CDNA4 ISA says conversions to F4/F6 do not support
    FP16_OVFL (numerics docstring) — saturation is the only encodable result; that the
    silicon saturates rather than e.g. wrapping is inferred, not measured. NaN and
    +-Inf inputs raise UnverifiedNumericsError (no documented result)."""
    v, sign, nan, inf, a = _split(x)
    if (nan | inf).any():
        raise UnverifiedNumericsError("f32_to_fp4_e2m1: NaN or Inf input; the FP4 result on "
                                      "gfx950 is unverified")
    mag = np.minimum(_round_magnitude(a, _E2M1), _E2M1.max_code)
    return (mag | np.where(sign, _E2M1.sign_bit, 0)).astype(np.uint8)


# ---------------------------------------------------------------------------
# E8M0 scales and the v_cvt_scalef32_* arithmetic
# ---------------------------------------------------------------------------

def e8m0_to_f64(u8) -> np.ndarray:
    """E8M0 byte -> float64 2**(e-127), exact; 0xFF -> NaN."""
    e = _bits(u8, np.uint8).astype(np.int64)
    return np.where(e == 0xFF, np.nan, np.ldexp(1.0, e - 127))


def e8m0_to_f32(u8) -> np.ndarray:
    """E8M0 byte -> float32 2**(e-127); 0xFF -> NaN.

    Exact, but e == 0 gives 2**-127 = 0x00400000, an f32 DENORMAL: do not push
    it through a flush-to-zero path, and prefer e8m0_to_f64 / exponent
    arithmetic (mfma_scale_factor) for products of scales.
    """
    e = _bits(u8, np.uint8).astype(np.uint32)
    bits = np.where(e == 0, np.uint32(0x00400000), e << 23)
    bits = np.where(e == 0xFF, np.uint32(_F32_QNAN), bits).astype(np.uint32)
    return bits.view(np.float32)


def mfma_scale_factor(sa_u8, sb_u8) -> np.ndarray:
    """float64 2**(sa-127) * 2**(sb-127) for v_mfma_scale_*; NaN if either
    byte is 0xFF.  Exact down to 2**-254.  Multiply the float64 block dot
    product by it (or np.ldexp it by sa + sb - 254) before adding C."""
    sa = _bits(sa_u8, np.uint8).astype(np.int64)
    sb = _bits(sb_u8, np.uint8).astype(np.int64)
    return np.where((sa == 0xFF) | (sb == 0xFF), np.nan, np.ldexp(1.0, sa + sb - 254))


def scale_exponent_from_f32_bits(u32) -> np.ndarray:
    """The E8M0 scale of v_cvt_scalef32_*: the exponent field (bits 30:23) of
    the scale operand; sign and mantissa are ignored [ISA: exponent(S2.f32)]."""
    return ((_bits(u32, np.uint32) >> 23) & 0xFF).astype(np.uint8)


def _scale_exp(scale_u8, nan_scale: str, what: str):
    s = _bits(scale_u8, np.uint8).astype(np.int64)
    ff = s == 0xFF
    if nan_scale == "reject":
        if ff.any():
            raise UnverifiedNumericsError(
                f"{what}: scale exponent 0xFF (Inf/NaN scale operand); gfx950 "
                "behaviour unverified, pass nan_scale='nan' to treat it as NaN")
    elif nan_scale != "nan":
        raise ValueError("nan_scale must be 'reject' or 'nan'")
    return s - 127, ff


def scale_down(x, scale_u8, *, nan_scale: str = "reject") -> np.ndarray:
    """x / 2**(scale-127) as exact float64, the first step of
    v_cvt_scalef32_{pk,sr}_{fp8,bf8,fp4,...}_*: feed the result to the
    f32_to_* encoders, which round once.

    x should already have had MODE denormal control applied when it is f32
    ("Conversion from F32 supports MODE-based denormal control"): with a
    scale of 2**-127 an f32 denormal source becomes a normal fp8 value.
    nan_scale: what a scale byte of 0xFF means (UNVERIFIED): 'reject' raises,
    'nan' makes the element NaN.
    """
    e, ff = _scale_exp(scale_u8, nan_scale, "scale_down")
    v = _values(x)
    return np.where(ff, np.nan, np.ldexp(v, -e))


def scale_up(x, scale_u8, *, nan_scale: str = "reject") -> np.ndarray:
    """x * 2**(scale-127) as exact float64, for v_cvt_scalef32_*_f32_{fp8,bf8}
    etc.: decode the small format first, then round this to the destination
    (``.astype(np.float32)`` is exact here unless it overflows to Inf, which is what
    gfx950 gives with FP16_OVFL = 0, module docstring; whether it flushes f32 denormal
    results under a flushing MODE is UNVERIFIED)."""
    e, ff = _scale_exp(scale_u8, nan_scale, "scale_up")
    v = _values(x)
    return np.where(ff, np.nan, np.ldexp(v, e))

"""Known-answer tests for loader/emu/numerics.py.

Expected values come from the format definitions (a small independent decoder
and a brute-force nearest-value search below) or from torch's own conversions,
never from the functions under test.
"""

import numpy as np
import pytest
import torch

from gfxasm.emu import numerics as nm

RNG = np.random.default_rng(20250901)


# ---------------------------------------------------------------------------
# independent reference, straight from sign/exponent/mantissa fields
# ---------------------------------------------------------------------------

def field_value(code, ebits, mbits, bias):
    """Magnitude of a code of a binary float format, ignoring special values.
    Plain Python arithmetic, one code at a time."""
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    if e == 0:
        return m * 2.0 ** (1 - bias - mbits)
    return (2 ** mbits + m) * 2.0 ** (e - bias - mbits)


def ref_decode_fp8(code, fmt):
    """fp8 byte -> Python float, from the OCP definitions."""
    sign = -1.0 if code & 0x80 else 1.0
    mag = code & 0x7F
    if fmt == "e4m3":
        if mag == 0x7F:
            return float("nan")
        return sign * field_value(mag, 4, 3, 7)
    if mag == 0x7C:
        return sign * float("inf")
    if mag > 0x7C:
        return float("nan")
    return sign * field_value(mag, 5, 2, 15)


class RefRound:
    """Round-to-nearest-even by brute force over all finite codes.

    The table holds every finite magnitude plus one virtual code past the
    largest, the value the format would have with an unbounded exponent.
    A result equal to that virtual code means 'overflow'.
    """

    def __init__(self, ebits, mbits, bias, max_code):
        self.max_code = max_code
        self.table = np.array([field_value(c, ebits, mbits, bias)
                               for c in range(max_code + 2)])

    def mag_code(self, x):
        a = np.abs(np.asarray(x, np.float64))
        t = self.table
        hi = np.clip(np.searchsorted(t, a), 1, len(t) - 1)
        lo = hi - 1
        dlo, dhi = a - t[lo], t[hi] - a
        pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
        code = np.where(pick_hi, hi, lo)
        # beyond the virtual code: certainly overflow
        return np.where(a > t[-1], self.max_code + 1, code)


REF_E4M3 = RefRound(4, 3, 7, 0x7E)
REF_E5M2 = RefRound(5, 2, 15, 0x7B)
REF_F16 = RefRound(5, 10, 15, 0x7BFF)


def signbit(x):
    return np.signbit(np.asarray(x, np.float64))


def random_f32_near(lo_exp, hi_exp, n):
    """Random float32 of both signs with exponents spread over [lo_exp, hi_exp)."""
    e = RNG.uniform(lo_exp, hi_exp, n)
    s = RNG.choice([-1.0, 1.0], n)
    return (s * np.exp2(e)).astype(np.float32)


def random_f32_bits(n, finite_only=True):
    u = RNG.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    x = u.view(np.float32)
    if finite_only:
        x = x[np.isfinite(x)]
    return x


# ---------------------------------------------------------------------------
# FP8 decode: all 256 codes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,fn,tdt", [
    ("e4m3", nm.fp8_e4m3_to_f32, torch.float8_e4m3fn),
    ("e5m2", nm.fp8_e5m2_to_f32, torch.float8_e5m2),
])
def test_fp8_decode_all_codes(fmt, fn, tdt):
    codes = np.arange(256, dtype=np.uint8)
    got = fn(codes)
    assert got.dtype == np.float32 and got.shape == (256,)
    want = np.array([ref_decode_fp8(int(c), fmt) for c in codes], np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    # bitwise, so -0.0 is checked too
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
    via_torch = torch.from_numpy(codes).view(tdt).float().numpy()
    assert np.array_equal(np.isnan(got), np.isnan(via_torch))
    assert np.array_equal(got[ok].view(np.uint32), via_torch[ok].view(np.uint32))


def test_fp8_decode_special_values():
    e4 = nm.fp8_e4m3_to_f32(np.array([0x7E, 0xFE, 0x01, 0x08, 0x80, 0x7F, 0xFF], np.uint8))
    assert e4[0] == 448 and e4[1] == -448
    assert e4[2] == 2.0 ** -9 and e4[3] == 2.0 ** -6
    assert e4[4] == 0 and np.signbit(e4[4])
    # decoded NaN is a quiet f32 NaN keeping the byte's sign
    assert e4[5:].view(np.uint32).tolist() == [0x7FC00000, 0xFFC00000]
    e5 = nm.fp8_e5m2_to_f32(np.array([0x7B, 0x7C, 0xFC, 0x7D, 0x01], np.uint8))
    assert e5[0] == 57344 and e5[1] == np.inf and e5[2] == -np.inf
    assert np.isnan(e5[3]) and e5[4] == 2.0 ** -16


# ---------------------------------------------------------------------------
# FP8 encode
# ---------------------------------------------------------------------------

def test_fp8_round_trip_every_code():
    for fmt, dec, enc, nan_mag in [
            ("e4m3", nm.fp8_e4m3_to_f32, nm.f32_to_fp8_e4m3, [0x7F]),
            ("e5m2", nm.fp8_e5m2_to_f32, nm.f32_to_fp8_e5m2, [0x7D, 0x7E, 0x7F])]:
        codes = np.array([c for c in range(256) if (c & 0x7F) not in nan_mag], np.uint8)
        for sat in (False, True):
            back = enc(dec(codes), sat)
            want = codes.copy()
            if fmt == "e5m2" and sat:   # FP16_OVFL=1 turns Inf into +-max
                want = np.where((codes & 0x7F) == 0x7C, (codes & 0x80) | 0x7B, codes)
            assert np.array_equal(back, want), (fmt, sat)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_random_against_bruteforce(fmt):
    ref, enc, top = ((REF_E4M3, nm.f32_to_fp8_e4m3, 9) if fmt == "e4m3"
                     else (REF_E5M2, nm.f32_to_fp8_e5m2, 16))
    x = np.concatenate([random_f32_near(-20, top + 2, 200_000),
                        random_f32_bits(50_000)])
    mag = ref.mag_code(x)
    sign = np.where(signbit(x), 0x80, 0)
    over = mag > ref.max_code
    for sat in (False, True):
        if fmt == "e4m3" and not sat:
            xs, m, s = x[~over], mag[~over], sign[~over]     # overflow is NaN
        else:
            xs, s = x, sign
            m = np.where(over, ref.max_code if sat else 0x7C, mag)
        assert np.array_equal(enc(xs, sat), (m | s).astype(np.uint8)), sat


def test_fp8_random_against_torch():
    # torch 2.13 CPU: e4m3fn conversion saturates (Inf too) = FP16_OVFL=1;
    # e5m2 conversion overflows to Inf = FP16_OVFL=0.
    x = np.concatenate([random_f32_near(-20, 18, 200_000), random_f32_bits(50_000),
                        np.float32([np.inf, -np.inf, 0.0, -0.0])])
    t = torch.from_numpy(x)
    e4 = t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(nm.f32_to_fp8_e4m3(x, True), e4)
    e5 = t.to(torch.float8_e5m2).view(torch.uint8).numpy()
    assert np.array_equal(nm.f32_to_fp8_e5m2(x, False), e5)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_exact_ties_round_to_even(fmt):
    ref, enc = (REF_E4M3, nm.f32_to_fp8_e4m3) if fmt == "e4m3" else (REF_E5M2, nm.f32_to_fp8_e5m2)
    t = ref.table
    k = np.arange(ref.max_code)              # ties between finite codes k and k+1
    mid = ((t[k] + t[k + 1]) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (t[k] + t[k + 1]) / 2)  # exact
    even = np.where(k % 2 == 0, k, k + 1)
    for sat in (False, True):
        assert np.array_equal(enc(mid, sat), even.astype(np.uint8))
        assert np.array_equal(enc(-mid, sat), (even | 0x80).astype(np.uint8))
        # one f32 ulp either side of the tie decides by distance
        assert np.array_equal(enc(np.nextafter(mid, np.float32(0)), sat), k.astype(np.uint8))
        assert np.array_equal(enc(np.nextafter(mid, np.float32(np.inf)), sat),
                              (k + 1).astype(np.uint8))


def test_fp8_tie_examples_by_hand():
    e4 = nm.f32_to_fp8_e4m3
    # 1 + 1/16 lies halfway between 1.0 (0x38, even) and 1.125 (0x39): -> 0x38
    assert e4(np.float32(1.0625), False) == 0x38
    # 1.1875 halfway between 1.125 (0x39, odd) and 1.25 (0x3A, even): -> 0x3A
    assert e4(np.float32(1.1875), False) == 0x3A
    # subnormal step 2**-9: 1.5 * 2**-9 between 0x01 and 0x02 -> 0x02; 0.5 * 2**-9 -> 0
    assert e4(np.float32(1.5 * 2 ** -9), False) == 0x02
    assert e4(np.float32(0.5 * 2 ** -9), False) == 0x00
    assert e4(np.float32(-0.5 * 2 ** -9), False) == 0x80
    # largest subnormal 7 * 2**-9 and smallest normal 2**-6: tie 7.5 * 2**-9 -> 0x08
    assert e4(np.float32(7.5 * 2 ** -9), False) == 0x08
    e5 = nm.f32_to_fp8_e5m2
    assert e5(np.float32(1.125), False) == 0x3C     # between 0x3C (1.0) and 0x3D
    assert e5(np.float32(1.375), False) == 0x3E     # between 0x3D and 0x3E
    assert e5(np.float32(0.5 * 2 ** -16), False) == 0x00
    assert e5(np.float32(1.5 * 2 ** -16), False) == 0x02


def test_fp8_saturation_and_overflow():
    e4 = nm.f32_to_fp8_e4m3
    x = np.float32([448, 449, 463.99, 464, 464.01, 480, 1e30, np.inf])
    # FP16_OVFL=1: everything here is 448; 464 is a tie that rounds to 448 anyway
    assert e4(x, True).tolist() == [0x7E] * 8
    assert e4(-x, True).tolist() == [0xFE] * 8
    # FP16_OVFL=0: values that round past 448, and Inf, become NaN
    got = e4(x, False, nan_encoding="signed")
    assert got.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0x7F]
    assert e4(-x, False, nan_encoding="signed").tolist() == [0xFE] * 4 + [0xFF] * 4
    with pytest.raises(nm.UnverifiedNumericsError):
        e4(x, False)                       # default refuses to pick a NaN byte
    assert e4(x[:4], False).tolist() == [0x7E] * 4   # no NaN produced -> fine

    e5 = nm.f32_to_fp8_e5m2
    y = np.float32([57344, 61439, 61440, 65536, 1e30, np.inf])
    assert e5(y, True).tolist() == [0x7B] * 6
    assert e5(-y, True).tolist() == [0xFB] * 6
    # 61440 is the tie between 57344 (odd mantissa) and 65536: rounds to Inf
    assert e5(y, False).tolist() == [0x7B, 0x7B, 0x7C, 0x7C, 0x7C, 0x7C]
    assert e5(-y, False).tolist() == [0xFB, 0xFB, 0xFC, 0xFC, 0xFC, 0xFC]


def test_fp8_nan_input():
    x = np.float32([np.nan, -np.nan, 1.0])
    for enc in (nm.f32_to_fp8_e4m3, nm.f32_to_fp8_e5m2):
        for sat in (False, True):
            with pytest.raises(nm.UnverifiedNumericsError):
                enc(x, sat)
            assert enc(x, sat, nan_encoding="signed")[:2].tolist() == [0x7F, 0xFF]
    assert nm.f32_to_fp8_e4m3(x, True, nan_encoding="unsigned")[:2].tolist() == [0x7F, 0x7F]
    assert nm.f32_to_fp8_e5m2(x, True, nan_encoding="unsigned")[:2].tolist() == [0x7E, 0x7E]
    # whatever the choice, the byte decodes as NaN
    for enc, dec in ((nm.f32_to_fp8_e4m3, nm.fp8_e4m3_to_f32),
                     (nm.f32_to_fp8_e5m2, nm.fp8_e5m2_to_f32)):
        for pol in ("signed", "unsigned"):
            assert np.isnan(dec(enc(x[:2], False, nan_encoding=pol))).all()
    with pytest.raises(ValueError):
        nm.f32_to_fp8_e4m3(x, True, nan_encoding="quiet")


def test_fp8_saturate_must_be_given_as_bool():
    with pytest.raises(TypeError):
        nm.f32_to_fp8_e4m3(np.float32([1.0]))          # no default
    with pytest.raises(TypeError):
        nm.f32_to_fp8_e4m3(np.float32([1.0]), 1)


def test_fp8_f32_denormal_inputs_underflow_to_signed_zero():
    d = np.array([0x00000001, 0x807FFFFF, 0x00400000], np.uint32).view(np.float32)
    assert nm.f32_to_fp8_e4m3(d, False).tolist() == [0x00, 0x80, 0x00]
    assert nm.f32_to_fp8_e5m2(d, False).tolist() == [0x00, 0x80, 0x00]


def test_shapes_are_kept():
    x = random_f32_near(-8, 8, 24).reshape(2, 3, 4)
    assert nm.f32_to_fp8_e4m3(x, True).shape == (2, 3, 4)
    assert nm.fp8_e5m2_to_f32(np.zeros((3, 5), np.uint8)).shape == (3, 5)
    assert nm.f32_to_bf16_rne(x).shape == (2, 3, 4)
    assert nm.f32_to_fp8_e4m3(np.float32(2.0), True) == 0x40     # 0-d works


# ---------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------

def test_bf16_rne_against_torch():
    x = np.concatenate([random_f32_bits(300_000),
                        random_f32_near(-140, -120, 20_000),   # bf16 denormals
                        np.float32([np.inf, -np.inf, 0, -0.0, 3.4028235e38])])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(nm.f32_to_bf16_rne(x), want)


def test_bf16_rne_ties_and_overflow_by_hand():
    u = np.array([
        0x3F808000,   # halfway, upper 0x3F80 even -> 0x3F80
        0x3F818000,   # halfway, upper 0x3F81 odd -> 0x3F82
        0x3F808001,   # just above halfway -> 0x3F81
        0xBF818000,   # negative odd tie -> 0xBF82
        0x7F7F7FFF,   # just below max + half ulp -> max 0x7F7F
        0x7F7F8000,   # max + half ulp, max odd -> Inf
        0x00008000,   # f32 denormal tie, 0x0000 even -> +0
        0x00018000,   # f32 denormal tie, 0x0001 odd -> 0x0002
    ], np.uint32)
    got = nm.f32_to_bf16_rne(u.view(np.float32))
    assert got.tolist() == [0x3F80, 0x3F82, 0x3F81, 0xBF82, 0x7F7F, 0x7F80, 0x0000, 0x0002]


def test_bf16_nan_stays_quiet_nan():
    u = np.array([0x7FC00000, 0xFF800001, 0x7F800001, 0x7FA5A5A5], np.uint32)
    got = nm.f32_to_bf16_rne(u.view(np.float32))
    assert ((got & 0x7F80) == 0x7F80).all() and ((got & 0x0040) != 0).all()
    assert (got >> 15).tolist() == [0, 1, 0, 0]
    t = nm.f32_to_bf16_trunc(u.view(np.float32))
    assert ((t & 0x7F80) == 0x7F80).all() and ((t & 0x007F) != 0).all()


def test_bf16_trunc_and_widen():
    u = np.array([0x3F80FFFF, 0xBF81FFFF, 0x7F7FFFFF, 0x00000001, 0x7F800000], np.uint32)
    assert nm.f32_to_bf16_trunc(u.view(np.float32)).tolist() == [
        0x3F80, 0xBF81, 0x7F7F, 0x0000, 0x7F80]
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = nm.bf16_to_f32(codes)
    want = torch.from_numpy(codes.view(np.int16)).view(torch.bfloat16).float().numpy()
    fin = ~np.isnan(want)
    assert np.array_equal(np.isnan(got), ~fin)
    assert np.array_equal(got[fin].view(np.uint32), want[fin].view(np.uint32))


# ---------------------------------------------------------------------------
# f16
# ---------------------------------------------------------------------------

def test_f16_rne_against_torch_and_bruteforce():
    x = np.concatenate([random_f32_bits(200_000), random_f32_near(-26, 17, 200_000),
                        np.float32([np.inf, -np.inf, 0, -0.0, 65504, 65519.99, 65520])])
    want = torch.from_numpy(x).to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    got = nm.f32_to_f16_rne(x)
    assert np.array_equal(got, want)
    fin = np.isfinite(x)
    mag = REF_F16.mag_code(x[fin])
    mag = np.where(mag > REF_F16.max_code, 0x7C00, mag)
    assert np.array_equal(got[fin], (mag | np.where(signbit(x[fin]), 0x8000, 0)).astype(np.uint16))


def test_f16_ties():
    t = REF_F16.table
    k = np.arange(0, REF_F16.max_code, 7)
    mid = ((t[k] + t[k + 1]) / 2).astype(np.float32)
    even = np.where(k % 2 == 0, k, k + 1)
    assert np.array_equal(nm.f32_to_f16_rne(mid), even.astype(np.uint16))


def test_f16_fp16_ovfl_saturates_finite_but_keeps_inf():
    x = np.float32([65504, 65519.99, 65520, 1e10, np.inf, -1e10, -np.inf])
    assert nm.f32_to_f16_rne(x).tolist() == [
        0x7BFF, 0x7BFF, 0x7C00, 0x7C00, 0x7C00, 0xFC00, 0xFC00]
    assert nm.f32_to_f16_rne(x, ovfl_saturate=True).tolist() == [
        0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF, 0x7C00, 0xFBFF, 0xFC00]


def test_f16_nan_and_widen():
    got = nm.f32_to_f16_rne(np.array([0x7FC00000, 0xFF800001], np.uint32).view(np.float32))
    assert ((got & 0x7C00) == 0x7C00).all() and ((got & 0x0200) != 0).all()
    assert (got >> 15).tolist() == [0, 1]
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    w = nm.f16_to_f32(codes)
    ref = torch.from_numpy(codes.view(np.int16)).view(torch.float16).float().numpy()
    fin = ~np.isnan(ref)
    assert np.array_equal(np.isnan(w), ~fin)
    assert np.array_equal(w[fin].view(np.uint32), ref[fin].view(np.uint32))


# ---------------------------------------------------------------------------
# f32 denormal flush
# ---------------------------------------------------------------------------

def test_flush_f32_denorms():
    u = np.array([0x00000001, 0x807FFFFF, 0x00800000, 0x80800000, 0x00000000,
                  0x80000000, 0x7FC00001, 0x3F800000], np.uint32)
    want = [0x00000000, 0x80000000, 0x00800000, 0x80800000, 0x00000000,
            0x80000000, 0x7FC00001, 0x3F800000]
    assert nm.flush_f32_denorm_bits(u).tolist() == want
    got = nm.flush_f32_denorms(u.view(np.float32))
    assert got.dtype == np.float32 and got.view(np.uint32).tolist() == want
    x = random_f32_bits(100_000, finite_only=False)
    f = nm.flush_f32_denorms(x)
    tiny = np.abs(x) < np.finfo(np.float32).tiny
    assert (f[tiny] == 0).all() and np.array_equal(np.signbit(f[tiny]), np.signbit(x[tiny]))
    keep = ~tiny
    assert np.array_equal(f[keep].view(np.uint32), x[keep].view(np.uint32))


def test_flush_f16_denorm_bits():
    u = np.array([0x0001, 0x83FF, 0x0400, 0x8000, 0x7E00], np.uint16)
    assert nm.flush_f16_denorm_bits(u).tolist() == [0x0000, 0x8000, 0x0400, 0x8000, 0x7E00]


# ---------------------------------------------------------------------------
# E8M0 and scaling
# ---------------------------------------------------------------------------

def test_e8m0_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    f32 = nm.e8m0_to_f32(codes)
    ref = torch.from_numpy(codes).view(torch.float8_e8m0fnu).float().numpy()
    assert np.isnan(f32[255]) and np.isnan(ref[255])
    assert np.array_equal(f32[:255].view(np.uint32), ref[:255].view(np.uint32))
    assert f32[0].view(np.uint32) == 0x00400000            # 2**-127 is an f32 denormal
    f64 = nm.e8m0_to_f64(codes)
    assert np.isnan(f64[255])
    assert f64[:255].tolist() == [2.0 ** (e - 127) for e in range(255)]


def test_mfma_scale_factor():
    sa = np.array([0, 127, 254, 130, 255, 3], np.uint8)
    sb = np.array([0, 127, 254, 120, 1, 255], np.uint8)
    got = nm.mfma_scale_factor(sa, sb)
    assert got[:4].tolist() == [2.0 ** -254, 1.0, 2.0 ** 254, 2.0 ** -4]
    assert np.isnan(got[4:]).all()


def test_scale_exponent_from_f32_bits():
    s = np.float32([1.0, 1.5, -0.75, 2.0 ** -126, 2.0 ** 127, np.inf, 0.0])
    got = nm.scale_exponent_from_f32_bits(s.view(np.uint32))
    assert got.tolist() == [127, 127, 126, 1, 254, 255, 0]


def test_scaled_fp8_conversion():
    x = random_f32_near(-30, 30, 50_000)
    s = RNG.integers(100, 155, x.size).astype(np.uint8)
    v = nm.scale_down(x, s)
    # the same value, computed independently with Python exponent arithmetic
    want_v = x.astype(np.float64) * np.exp2(127.0 - s)
    assert np.array_equal(v, want_v)
    mag = REF_E4M3.mag_code(want_v)
    want = np.where(mag > REF_E4M3.max_code, REF_E4M3.max_code, mag) | np.where(signbit(x), 0x80, 0)
    assert np.array_equal(nm.f32_to_fp8_e4m3(v, True), want.astype(np.uint8))
    # exactness where a float32 division would not be: f32 denormal source, scale 2**-127
    d = np.array([0x00600000], np.uint32).view(np.float32)          # 1.5 * 2**-127
    assert nm.f32_to_fp8_e4m3(nm.scale_down(d, np.uint8([0])), False) == 0x3C   # 1.5
    assert nm.f32_to_fp8_e4m3(nm.scale_down(nm.flush_f32_denorms(d), np.uint8([0])), False) == 0
    # 1000 / 2**3 = 125 -> RNE to 128 (0x70); scale 2**10: 1000/1024 -> 0.9765625 -> 1.0
    assert nm.f32_to_fp8_e4m3(nm.scale_down(np.float32([1000, 1000]), np.uint8([130, 137])),
                              True).tolist() == [0x70, 0x38]


def test_scaled_up_conversion():
    codes = np.arange(256, dtype=np.uint8)
    for dec, fmt in ((nm.fp8_e4m3_to_f32, "e4m3"), (nm.fp8_e5m2_to_f32, "e5m2")):
        for s in (0, 1, 100, 127, 140, 254):
            got = nm.scale_up(dec(codes), np.full(256, s, np.uint8))
            want = np.array([ref_decode_fp8(int(c), fmt) * 2.0 ** (s - 127) for c in codes])
            assert np.array_equal(got, want, equal_nan=True)
            with np.errstate(over="ignore"):
                f = got.astype(np.float32)
            fin = np.isfinite(want) & (np.abs(want) <= np.finfo(np.float32).max)
            assert np.array_equal(f[fin].astype(np.float64), want[fin])   # exact in f32


def test_scale_ff_is_explicit():
    with pytest.raises(nm.UnverifiedNumericsError):
        nm.scale_down(np.float32([1.0]), np.uint8([255]))
    with pytest.raises(nm.UnverifiedNumericsError):
        nm.scale_up(np.float32([1.0]), np.uint8([255]))
    assert np.isnan(nm.scale_down(np.float32([1.0]), np.uint8([255]), nan_scale="nan")).all()
    with pytest.raises(ValueError):
        nm.scale_down(np.float32([1.0]), np.uint8([1]), nan_scale="inf")


# ---------------------------------------------------------------------------
# reinterpretation and input checking
# ---------------------------------------------------------------------------

def test_reinterpret_helpers():
    assert nm.as_f32(np.uint32(0x3F800000)) == 1.0
    assert nm.as_f32(np.int32(-1)).view(np.uint32) == 0xFFFFFFFF
    assert nm.as_u32(np.float32(-2.0)) == 0xC0000000
    assert nm.as_f16(np.uint16(0x3C00)) == 1.0
    assert nm.as_u16(np.float16(-2.0)) == 0xC000
    with pytest.raises(TypeError):
        nm.as_f32(np.float32(1.0))            # values are not bits
    with pytest.raises(TypeError):
        nm.f32_to_fp8_e4m3(np.uint32([0x3F800000]), True)   # bits are not values
    with pytest.raises(ValueError):
        nm.fp8_e4m3_to_f32(np.array([256]))
    with pytest.raises(ValueError):
        nm.f32_to_bf16_trunc(np.float64([0.1]))   # not an f32 value

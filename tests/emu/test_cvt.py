"""Known-answer tests for the conversions (loader/emu/families/cvt.py).

References come from torch's own dtype conversions (bfloat16, float16,
float8_e4m3fn, float8_e5m2, all round-to-nearest-even) or from brute-force searches
over every value of the small format — never from the emulator or from numerics.py.
Most tests are exhaustive over the small format's codes.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from gfxasm.emu.errors import HazardError, UnsupportedInstruction
from asm_harness import run_snippet
from mfma_batch import run_batch


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


FP8_DTYPE = {"fp8": torch.float8_e4m3fn, "bf8": torch.float8_e5m2}


def t_decode_fp8(codes, fmt):
    return torch.from_numpy(np.ascontiguousarray(codes, np.uint8)).view(FP8_DTYPE[fmt]).float().numpy()


def t_encode_fp8(x, fmt):
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(FP8_DTYPE[fmt]).view(torch.uint8).numpy()


def lanes(values: np.ndarray) -> np.ndarray:
    """Split a flat uint32 array into [G, 1, 64] per-wave inputs."""
    values = np.asarray(values, np.uint32)
    pad = (-len(values)) % 64
    return np.concatenate([values, np.zeros(pad, np.uint32)]).reshape(-1, 1, 64)


def run1(body, values, *, outputs=(("v", 10),), **kw):
    """One input register v0 (values spread over as many waves as needed)."""
    data = lanes(values)
    out = run_batch(body, [("v", 0)], data, list(outputs), **kw)
    return [out[:, k, :].reshape(-1)[:len(values)] for k in range(len(outputs))]


def random_f32_bits(rng, n):
    """Every class: random bit patterns plus zeros, denormals, Infs, NaNs, extremes."""
    special = np.array([0, 0x80000000, 1, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                        0xFF800000, 0x7FC00000, 0xFFC00001, 0x3F800000, 0x477FE000, 0x477FF000,
                        0x477FEFFF, 0x33800000, 0x33000000], np.uint32)
    return np.concatenate([special, rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)])


# ---------------------------------------------------------------------------- bf16 / f16
def flush(bits):
    bits = np.asarray(bits, np.uint32)
    den = ((bits & 0x7F800000) == 0) & ((bits & 0x7FFFFF) != 0)
    return np.where(den, bits & 0x80000000, bits).astype(np.uint32)


@pytest.mark.parametrize("denorm", [3, 0])
def test_cvt_pk_bf16_f32(denorm):
    rng = np.random.default_rng(seed("bf16", denorm))
    x = random_f32_bits(rng, 4000)
    y = np.roll(x, 7)
    data = np.stack([lanes(x)[:, 0], lanes(y)[:, 0]], axis=1)
    out = run_batch("  v_cvt_pk_bf16_f32 v10, v0, -v1", [("v", 0), ("v", 1)], data, [("v", 10)],
                    denorm=denorm)[:, 0].reshape(-1)[:len(x)]
    src_a, src_b = (flush(x), flush(y)) if denorm == 0 else (x, y)
    want_a = torch.from_numpy(src_a.view(np.float32).copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    want_b = torch.from_numpy(-(src_b.view(np.float32))).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    for got, want in ((out & 0xFFFF, want_a), (out >> 16, want_b)):
        got = got.astype(np.uint16)
        nan = (want & 0x7FFF) > 0x7F80
        assert np.array_equal((got & 0x7FFF) > 0x7F80, nan)
        np.testing.assert_array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("ovfl", [0, 1])
def test_cvt_pk_f16_f32(ovfl):
    rng = np.random.default_rng(seed("f16", ovfl))
    x = random_f32_bits(rng, 3000)
    out = run1("  v_cvt_pk_f16_f32 v10, v0, |v0|", x, fp16_ovfl=ovfl)[0]
    xf = x.view(np.float32)
    for got, src in ((out & 0xFFFF, xf), (out >> 16, np.abs(xf))):
        want = torch.from_numpy(src.copy()).to(torch.float16).numpy().view(np.uint16)
        if ovfl:   # MODE.FP16_OVFL: finite overflow clamps to +-65504, true Infs stay
            over = np.isfinite(src) & ((want & 0x7FFF) == 0x7C00)
            want = np.where(over, (want & 0x8000) | 0x7BFF, want).astype(np.uint16)
        got = got.astype(np.uint16)
        nan = np.isnan(src)
        assert np.array_equal((got & 0x7FFF) > 0x7C00, nan)
        np.testing.assert_array_equal(got[~nan], want[~nan])


def test_cvt_pkrtz_f16_f32():
    """Round toward zero: the largest-magnitude f16 not above |x| (brute force over all f16)."""
    rng = np.random.default_rng(seed("rtz"))
    x = random_f32_bits(rng, 3000)
    x = x[~np.isnan(x.view(np.float32))]
    out = run1("  v_cvt_pkrtz_f16_f32 v10, v0, -v0", x)[0]
    mags = np.arange(0x7C01, dtype=np.uint16)                 # +0 .. +Inf, increasing
    mag_vals = mags.view(np.float16).astype(np.float64)
    xf = x.view(np.float32).astype(np.float64)
    for got, src in ((out & 0xFFFF, xf), (out >> 16, -xf)):
        a = np.abs(src)
        idx = np.searchsorted(mag_vals, a, side="right") - 1   # largest |f16| <= |x|
        idx = np.where(np.isinf(a), 0x7C00, np.minimum(idx, 0x7BFF))
        want = (mags[idx] | np.where(np.signbit(src), 0x8000, 0)).astype(np.uint16)
        np.testing.assert_array_equal(got.astype(np.uint16), want)


def test_cvt_f32_bf16_exhaustive():
    codes = np.arange(1 << 16, dtype=np.uint32)
    words = codes << 16 | ((codes * 7919) & 0xFFFF)           # high half: the codes; low: junk
    body = ("  v_lshrrev_b32 v1, 16, v0\n  s_nop 1\n  v_cvt_f32_bf16 v10, v1\n"
            "  v_cvt_f32_bf16_sdwa v11, v0 src0_sel:WORD_1\n  v_cvt_f32_bf16_e64 v12, -v1")
    out_lo, out_hi, out_neg = run1(body, words, outputs=[("v", 10), ("v", 11), ("v", 12)])
    want = torch.from_numpy(codes.astype(np.uint16).view(np.int16)).view(torch.bfloat16).float().numpy()
    for got, sign in ((out_lo, 1), (out_hi, 1), (out_neg, -1)):
        g = got.view(np.float32)
        with np.errstate(invalid="ignore"):
            w = want * sign
        assert np.array_equal(np.isnan(g), np.isnan(w))
        ok = ~np.isnan(w)
        np.testing.assert_array_equal(g[ok].view(np.uint32), w[ok].view(np.uint32))


# ---------------------------------------------------------------------------- fp8 -> f32
@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_f32_fp8_every_code_and_byte_select(fmt):
    codes = np.arange(256, dtype=np.uint32)
    words = (codes << 24) | (((codes + 85) & 0xFF) << 16) | (((codes + 170) & 0xFF) << 8) | ((codes + 3) & 0xFF)
    sels = ["e32", "BYTE_1", "BYTE_2", "BYTE_3", "WORD_1"]
    lines = [f"  v_cvt_f32_{fmt}_e32 v10, v0"]
    lines += [f"  v_cvt_f32_{fmt}_sdwa v{10 + n}, v0 src0_sel:{s}" for n, s in enumerate(sels) if n]
    outs = run1("\n".join(lines), words, outputs=[("v", 10 + n) for n in range(len(sels))])
    byte_of = {"e32": 0, "BYTE_1": 1, "BYTE_2": 2, "BYTE_3": 3, "WORD_1": 2}
    for sel, got in zip(sels, outs):
        src = (words >> (8 * byte_of[sel])) & 0xFF
        want = t_decode_fp8(src, fmt)
        g = got.view(np.float32)
        assert np.array_equal(np.isnan(g), np.isnan(want)), sel
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(g[ok].view(np.uint32), want[ok].view(np.uint32), err_msg=sel)


def test_cvt_f32_fp8_dpp():
    codes = np.arange(64, dtype=np.uint32) * 3 + 0x20
    regs = {0: codes}
    out = run_snippet("  v_cvt_f32_fp8_dpp v10, v0 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf",
                      vgprs=regs, outputs=["v10"])
    want = t_decode_fp8(codes[np.arange(64) ^ 1], "fp8")
    np.testing.assert_array_equal(out["v10"].view(np.float32), want)


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_pk_f32_fp8_word_select(fmt):
    rng = np.random.default_rng(seed("pkf32", fmt))
    words = rng.integers(0, 2**32, 640, dtype=np.uint64).astype(np.uint32)
    body = (f"  v_cvt_pk_f32_{fmt} v[10:11], v0\n"
            f"  v_cvt_pk_f32_{fmt}_sdwa v[12:13], v0 src0_sel:WORD_1")
    outs = run1(body, words, outputs=[("v", r) for r in (10, 11, 12, 13)])
    for got, byte in zip(outs, (0, 1, 2, 3)):
        want = t_decode_fp8((words >> (8 * byte)) & 0xFF, fmt)
        g = got.view(np.float32)
        assert np.array_equal(np.isnan(g), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(g[ok].view(np.uint32), want[ok].view(np.uint32))


# ---------------------------------------------------------------------------- f32 -> fp8
def representable_f32(rng, n, fmt):
    """f32 values whose fp8 rounding stays finite: |x| up to the format's max, including
    fp8 denormals and exact ties, plus f32 denormals (flushed or kept per MODE)."""
    top = 448.0 if fmt == "fp8" else 57344.0
    mags = np.concatenate([
        np.exp2(rng.uniform(-22, np.log2(top), n)),                         # any magnitude
        t_decode_fp8(np.arange(0x7F if fmt == "fp8" else 0x7C), fmt).astype(np.float64),  # exact codes
    ])
    codes = np.arange(0x7E if fmt == "fp8" else 0x7B)
    lo, hi = t_decode_fp8(codes, fmt), t_decode_fp8(codes + 1, fmt)
    mags = np.concatenate([mags, (lo.astype(np.float64) + hi) / 2, [1e-40, 0.0]])  # ties, f32 denormal
    x = (mags * rng.choice([-1.0, 1.0], len(mags))).astype(np.float32)
    return x


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
@pytest.mark.parametrize("denorm", [3, 0])
def test_cvt_pk_fp8_f32(fmt, denorm):
    rng = np.random.default_rng(seed("pkfp8", fmt, denorm))
    x = representable_f32(rng, 1500, fmt)
    y = np.roll(x, 11)
    old = rng.integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(x.view(np.uint32))[:, 0], lanes(y.view(np.uint32))[:, 0], lanes(old)[:, 0],
                     lanes(old)[:, 0]], axis=1)
    body = (f"  v_cvt_pk_{fmt}_f32 v10, v0, v1\n"
            f"  v_cvt_pk_{fmt}_f32 v11, v0, -v1 op_sel:[0,0,1]")
    out = run_batch(body, [("v", 0), ("v", 1), ("v", 10), ("v", 11)], data, [("v", 10), ("v", 11)],
                    denorm=denorm)
    lo_word, hi_word = (out[:, k].reshape(-1)[:len(x)] for k in (0, 1))
    src_x = x if denorm else flush(x.view(np.uint32)).view(np.float32)
    src_y = y if denorm else flush(y.view(np.uint32)).view(np.float32)
    ex, ey = t_encode_fp8(src_x, fmt).astype(np.uint32), t_encode_fp8(src_y, fmt).astype(np.uint32)
    eny = t_encode_fp8(-src_y, fmt).astype(np.uint32)
    np.testing.assert_array_equal(lo_word, (old & 0xFFFF0000) | ex | (ey << 8))
    np.testing.assert_array_equal(hi_word, (old & 0xFFFF) | ((ex | (eny << 8)) << 16))


@pytest.mark.parametrize("fmt,ovfl,value,want", [
    ("fp8", 1, 1000.0, 0x7E), ("fp8", 1, -np.inf, 0xFE), ("fp8", 1, 464.0, 0x7E),
    ("fp8", 0, 464.0, 0x7E),                      # RNE tie to 448 (even): not an overflow
    ("bf8", 1, 1e6, 0x7B), ("bf8", 0, 1e6, 0x7C), ("bf8", 0, -np.inf, 0xFC), ("bf8", 1, np.inf, 0x7B),
    ("bf8", 0, 61440.0, 0x7C),                    # tie between 57344 and Inf rounds to even (Inf)
])
def test_cvt_pk_fp8_f32_overflow_follows_fp16_ovfl(fmt, ovfl, value, want):
    """ISA §7.3 FP16_OVFL table (numerics.py docstring): FP8 saturates only with FP16_OVFL,
    BF8 overflows to Inf without it."""
    x = np.full(64, value, np.float32).view(np.uint32)
    out = run1(f"  v_cvt_pk_{fmt}_f32 v10, v0, v0", x, fp16_ovfl=ovfl)[0]
    assert (out & 0xFF == want).all() and ((out >> 8) & 0xFF == want).all()


def special_f32(rng, n):
    """Finite values on both sides of the fp8/bf8 ranges (incl. the E4M3 464/480 and E5M2
    61440 boundaries), +-Inf, and NaNs of both signs with random payloads."""
    fin = np.concatenate([rng.uniform(-600, 600, n), np.exp2(rng.uniform(-20, 20, n)),
                          [464.0, 480.0, 479.9, 448.0, 61440.0, 61439.0, 57344.0, 1e30, 0.0]])
    fin = fin * rng.choice([-1.0, 1.0], len(fin))
    nan_bits = (rng.integers(0, 2, n).astype(np.uint32) << 31) | 0x7F800000 | rng.integers(1, 1 << 23, n).astype(np.uint32)
    return np.concatenate([fin.astype(np.float32).view(np.uint32), nan_bits,
                           np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000], np.uint32)])


def ref_fp8_nan_model(bits, fmt, ovfl):
    """Independent reference, the rule written out: torch's RNE byte where the rounded
    value is in range; past it (E4M3: |x| > 464, the 448/480 tie going to the even 448;
    E5M2: |x| >= 61440, the tie going to the even 2^16) and for +-Inf the ISA 7.3
    FP16_OVFL table (E4M3: NaN, or +-448 with the bit; E5M2: +-Inf, or +-57344); a NaN
    source gives NaN. NaN bytes as AMD's host model writes them (amd_hip_ocp_host.hpp):
    sign | 0x7F (E4M3), sign | 0x7E (E5M2). (torch's own e4m3fn cast saturates, so it
    serves only inside the range.)"""
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore"):           # signalling NaNs among the inputs
        a = np.abs(x.astype(np.float64))
    sign = (bits >> 31).astype(np.uint32) << 7
    nan = np.isnan(x)
    with np.errstate(invalid="ignore"):
        want = t_encode_fp8(np.where(nan, 0, x).astype(np.float32), fmt).astype(np.uint32)
        big = ~nan & ((a > 464.0) if fmt == "fp8" else (a >= 61440.0))
    nan_byte = 0x7F if fmt == "fp8" else 0x7E
    if ovfl:
        past = sign | (0x7E if fmt == "fp8" else 0x7B)
    else:
        past = sign | (0x7F if fmt == "fp8" else 0x7C)
    want = np.where(big, past, want)
    return np.where(nan, sign | nan_byte, want).astype(np.uint32)


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
@pytest.mark.parametrize("ovfl", [0, 1])
def test_cvt_pk_fp8_f32_nan_and_overflow_bytes(fmt, ovfl):
    """NaN sources, +-Inf and overflow: ISA 7.3 FP16_OVFL table for which value, AMD's
    host model (sign | 0x7F E4M3, sign | 0x7E E5M2; numerics.GFX950_FP8_NAN) for the
    NaN byte. Both halves of both words, random old contents kept."""
    rng = np.random.default_rng(seed("fp8 nan", fmt, ovfl))
    x = special_f32(rng, 600)
    y = np.roll(x, 13)
    old = rng.integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(x)[:, 0], lanes(y)[:, 0], lanes(old)[:, 0]], axis=1)
    body = f"  v_cvt_pk_{fmt}_f32 v10, v0, v1 op_sel:[0,0,1]"
    out = run_batch(body, [("v", 0), ("v", 1), ("v", 10)], data, [("v", 10)], fp16_ovfl=ovfl)[:, 0]
    got = out.reshape(-1)[:len(x)]
    want = ref_fp8_nan_model(x, fmt, ovfl) | (ref_fp8_nan_model(y, fmt, ovfl) << 8)
    np.testing.assert_array_equal(got, (old & 0xFFFF) | (want << 16))


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_pk_fp8_f32_nan_and_overflow_bytes(fmt):
    """The scaled down-conversion: x / 2^s through the same rule (its NaN cases were tested
    on gfx950 by composable_kernel's test_mx_fp8: NaN, Inf/2, +-256/0.5 all give NaN)."""
    rng = np.random.default_rng(seed("fp8 nan scaled", fmt))
    x = special_f32(rng, 400)
    s_bits, e = scale_operands(rng, len(x), 120, 135)
    with np.errstate(invalid="ignore"):
        xs = x.view(np.float32).astype(np.float64) * np.exp2(e - 127.0)
    keep = ~np.isfinite(xs) | (np.abs(xs) < 3e38) & ((xs == 0) | (np.abs(xs) > 1e-37))   # x = xs / 2^s exactly
    x, xs, s_bits = x[keep], xs[keep].astype(np.float32), s_bits[keep]
    data = np.stack([lanes(xs.view(np.uint32))[:, 0], lanes(s_bits)[:, 0]], axis=1)
    out = run_batch(f"  v_cvt_scalef32_pk_{fmt}_f32 v10, v0, v0, v1", [("v", 0), ("v", 1)], data, [("v", 10)])
    got = out[:, 0].reshape(-1)[:len(x)]
    want = ref_fp8_nan_model(x, fmt, 0)
    np.testing.assert_array_equal(got & 0xFFFF, want | (want << 8))


# ---------------------------------------------------------------------------- scalef32
def scale_operands(rng, n, lo=118, hi=137):
    """f32 scale operands: exponent field in [lo, hi), random sign and mantissa (ignored)."""
    e = rng.integers(lo, hi, n).astype(np.uint32)
    bits = (rng.integers(0, 2, n).astype(np.uint32) << 31) | (e << 23) | rng.integers(0, 1 << 23, n).astype(np.uint32)
    return bits, e


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_pk_fp8_f32(fmt):
    rng = np.random.default_rng(seed("scalepk", fmt))
    x = representable_f32(rng, 1200, fmt)
    x = x[np.abs(x) > 1e-30]                           # keep x / 2^s a normal f32
    y = np.roll(x, 5)
    s_bits, e = scale_operands(rng, len(x))
    old = rng.integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    factor = np.exp2(e.astype(np.float64) - 127)
    xs, ys = x * factor, y * factor                    # so that x_scaled / 2^s == x exactly
    ok = np.isfinite(xs.astype(np.float32)) & np.isfinite(ys.astype(np.float32))
    xs, ys, s_bits, old, x, y = (a[ok] for a in (xs.astype(np.float32), ys.astype(np.float32), s_bits, old, x, y))
    data = np.stack([lanes(xs.view(np.uint32))[:, 0], lanes(ys.view(np.uint32))[:, 0], lanes(s_bits)[:, 0],
                     lanes(old)[:, 0], lanes(old)[:, 0]], axis=1)
    body = (f"  v_cvt_scalef32_pk_{fmt}_f32 v10, v0, v1, v2\n"
            f"  v_cvt_scalef32_pk_{fmt}_f32 v11, v0, v1, v2 op_sel:[0,0,0,1]")
    out = run_batch(body, [("v", 0), ("v", 1), ("v", 2), ("v", 10), ("v", 11)], data,
                    [("v", 10), ("v", 11)])
    lo_word, hi_word = (out[:, k].reshape(-1)[:len(x)] for k in (0, 1))
    bytes_ = t_encode_fp8(x, fmt).astype(np.uint32) | (t_encode_fp8(y, fmt).astype(np.uint32) << 8)
    np.testing.assert_array_equal(lo_word, (old & 0xFFFF0000) | bytes_)
    np.testing.assert_array_equal(hi_word, (old & 0xFFFF) | (bytes_ << 16))


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_f32_fp8_every_code_and_byte(fmt):
    rng = np.random.default_rng(seed("scaleup", fmt))
    codes = np.tile(np.arange(256, dtype=np.uint32), 4)
    junk = rng.integers(0, 2**32, len(codes), dtype=np.uint64).astype(np.uint32)
    s_bits, e = scale_operands(rng, len(codes), 100, 150)
    byte = np.repeat(np.arange(4), 256)
    # Each wave tests one byte position: place the code there, junk elsewhere.
    words = (junk & ~(np.uint32(0xFF) << (8 * byte).astype(np.uint32))) | (codes << (8 * byte).astype(np.uint32))
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]], axis=1)
    body = "\n".join(f"  v_cvt_scalef32_f32_{fmt} v{10 + b}, v0, v1 op_sel:[{b & 1},{b >> 1},0]"
                     for b in range(4))
    out = run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10 + b) for b in range(4)])
    got = np.stack([out[:, b].reshape(-1) for b in range(4)])[byte, np.arange(len(codes))].view(np.float32)
    want = (t_decode_fp8(codes, fmt).astype(np.float64) * np.exp2(e.astype(np.float64) - 127)).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_pk_f32_fp8(fmt):
    rng = np.random.default_rng(seed("scaleuppk", fmt))
    words = rng.integers(0, 2**32, 640, dtype=np.uint64).astype(np.uint32)
    s_bits, e = scale_operands(rng, len(words))
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]], axis=1)
    body = (f"  v_cvt_scalef32_pk_f32_{fmt} v[10:11], v0, v1\n"
            f"  v_cvt_scalef32_pk_f32_{fmt} v[12:13], v0, v1 op_sel:[1,0,0]")
    out = run_batch(body, [("v", 0), ("v", 1)], data, [("v", r) for r in (10, 11, 12, 13)])
    for k, byte in enumerate((0, 1, 2, 3)):
        got = out[:, k].reshape(-1).view(np.float32)
        want = (t_decode_fp8((words >> (8 * byte)) & 0xFF, fmt).astype(np.float64)
                * np.exp2(e.astype(np.float64) - 127)).astype(np.float32)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


@pytest.mark.parametrize("body,inputs", [
    ("  v_cvt_scalef32_pk_fp8_f32 v10, v0, v0, v1", {0: 0x3F800000, 1: 0x7F800000}),   # Inf scale, down
    ("  v_cvt_scalef32_pk_fp4_f32 v10, v0, v0, v1", {0: 0x3F800000, 1: 0x7FC00000}),   # NaN scale, FP4
    ("  v_cvt_scalef32_pk_f32_fp4 v[10:11], v0, v1", {0: 0x22, 1: 0x7F800000}),         # NaN scale, from FP4
    ("  v_cvt_scalef32_f16_fp8 v10, v0, v1", {0: 0x38, 1: 0x7F800000}),                 # NaN scale, to f16
    ("  v_cvt_sr_fp8_f32 v10, v0, v1", {0: 0x3F800000, 1: 0}),                          # stochastic
    ("  v_cvt_f32_fp8_e64 v10, v0 clamp", {0: 0x38}),
])
def test_unverified_conversions_are_rejected(body, inputs):
    with pytest.raises(UnsupportedInstruction):
        run_snippet(body, vgprs={r: np.full(64, v, np.uint32) for r, v in inputs.items()})


E8M0_ALL = np.arange(256, dtype=np.uint32)


def scaled_up_reference(codes, scale_bytes, fmt):
    """float64 OCP MX value of (code, E8M0 byte) as the f32 bits gfx950 gives: the exact
    product 2^(s-127) * x rounded to f32 (+-Inf past its range, which is also f32 IEEE
    multiplication's answer -- what composable_kernel's device test compares with); NaN
    for a NaN code or the 0xFF byte, as sign(code) | 0x7FC00000."""
    x = t_decode_fp8(codes, fmt).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.ldexp(x, scale_bytes.astype(np.int64) - 127).astype(np.float32).view(np.uint32)
    nan = np.isnan(x) | (scale_bytes == 255)
    return np.where(nan, ((codes >> 7) << 31) | 0x7FC00000, v).astype(np.uint32)


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_f32_fp8_every_code_times_every_scale_byte(fmt):
    """All 256 x 256 (code, E8M0) pairs -- the sweep composable_kernel's test_mx_fp8/bf8 runs
    on gfx950 -- including 0xFF (NaN), 254 (the products past f32: +-Inf), 0 (denormal
    products, kept under denorm mode 3), through v_cvt_scalef32_f32_* and both words of
    v_cvt_scalef32_pk_f32_*, bit for bit. The scale operand is the f32 whose exponent
    field is the byte (mantissa and sign random: ignored)."""
    rng = np.random.default_rng(seed("scale sweep", fmt))
    codes = np.tile(np.arange(256, dtype=np.uint32), 256)
    sbyte = np.repeat(E8M0_ALL, 256)
    s_bits = (rng.integers(0, 2, len(codes)).astype(np.uint32) << 31) | (sbyte << 23) \
        | rng.integers(0, 1 << 23, len(codes)).astype(np.uint32)
    partner = np.roll(codes, 77)
    words = codes | (partner << 8) | (np.roll(codes, 5) << 16) | (codes << 24)
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]], axis=1)
    body = (f"  v_cvt_scalef32_f32_{fmt} v10, v0, v1 op_sel:[1,1,0]\n"          # byte 3
            f"  v_cvt_scalef32_pk_f32_{fmt} v[12:13], v0, v1\n"                  # bytes 0, 1
            f"  v_cvt_scalef32_pk_f32_{fmt} v[14:15], v0, v1 op_sel:[1,0,0]")     # bytes 2, 3
    out = run_batch(body, [("v", 0), ("v", 1)], data, [("v", r) for r in (10, 12, 13, 14, 15)])
    got = [out[:, k].reshape(-1) for k in range(5)]
    for k, byte_codes in enumerate([codes, codes, partner, np.roll(codes, 5), codes]):
        np.testing.assert_array_equal(got[k], scaled_up_reference(byte_codes, sbyte, fmt), err_msg=f"output {k}")
    # the sweep does reach the cases it is about
    assert np.isinf(got[0].view(np.float32)).any() and np.isnan(got[0].view(np.float32)).sum() >= 256


def test_scaled_f32_overflow_with_fp16_ovfl_is_rejected():
    """The hardware data for +-Inf (numerics docstring) are from FP16_OVFL = 0 only."""
    data = np.array([[np.full(64, 0x7E, np.uint32), np.full(64, 0x7F000000, np.uint32)]])   # 448 * 2^127
    body = "  v_cvt_scalef32_f32_fp8 v10, v0, v1"
    got = run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10)], fp16_ovfl=0)[0, 0]
    assert (got == 0x7F800000).all()
    with pytest.raises(UnsupportedInstruction, match="FP16_OVFL"):
        run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10)], fp16_ovfl=1)


def test_scaled_f32_denormal_result_under_flush_mode_is_rejected():
    data = np.array([[np.full(64, 0x08, np.uint32), np.full(64, 0x00800000, np.uint32)]])  # 2^-6 * 2^-126
    body = "  v_cvt_scalef32_f32_fp8 v10, v0, v1"
    kept = run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10)], denorm=3)[0, 0]
    assert (kept.view(np.float32) == np.float32(2.0 ** -132)).all()
    with pytest.raises(UnsupportedInstruction, match="denormal"):
        run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10)], denorm=0)


@pytest.mark.parametrize("mnemonic,want", [
    ("v_cvt_scalef32_pk_fp8_f32 v10, v0, v0, v1 op_sel:[0,0,0,1]", 0x38380000),   # high half
    ("v_cvt_scalef32_pk_fp4_f32 v10, v0, v0, v1 op_sel:[0,0,1,0]", 0x2200),       # byte 1
])
def test_cvt_scale_shifted_write_forwarding_hazard(mnemonic, want):
    """v_cvt_scalef32_* writing at a shifted position (op_sel[3] high half; FP4 byte != 0)
    -> a read of that VGPR needs 1 wait state (fact sheet §4, LLVM CvtScaleForwarding;
    llc-22 inserts s_nop 0 after both). 1.0 is fp8 0x38 and E2M1 code 2."""
    regs = {0: np.full(64, 0x3F800000, np.uint32), 1: np.full(64, 0x3F800000, np.uint32),
            10: np.zeros(64, np.uint32)}
    body = f"  {mnemonic}\n{{nop}}  v_mov_b32 v11, v10"
    with pytest.raises(HazardError):
        run_snippet(body.format(nop=""), vgprs=regs)
    out = run_snippet(body.format(nop="  s_nop 0\n"), vgprs=regs, outputs=["v11"])
    assert (out["v11"] == want).all()


def test_cvt_scalef32_pk_fp4_byte0_write_needs_no_wait():
    regs = {0: np.full(64, 0x3F800000, np.uint32), 1: np.full(64, 0x3F800000, np.uint32),
            10: np.zeros(64, np.uint32)}
    out = run_snippet("  v_cvt_scalef32_pk_fp4_f32 v10, v0, v0, v1\n  v_mov_b32 v11, v10", vgprs=regs,
                      outputs=["v11"])
    assert (out["v11"] == 0x22).all()


def test_scaled_up_conversion_checks_only_lanes_exec_enables():
    """Regression: v_cvt_scalef32_pk_f32_fp8 raised UnsupportedInstruction for an Inf scale
    operand (and an overflowing product) in lanes EXEC had switched off, whose results the
    hardware never computes. A GEMV's partial last chunk leaves exactly such lanes. (Both
    are modelled now, NaN and +Inf; a refusal that stays -- a 0xFF scale on an FP4
    up-conversion -- must likewise come only from enabled lanes.)"""
    lane = np.arange(64)
    src = np.full(64, 0x7E7E, np.uint32)                                  # two e4m3 448s
    scale = np.where(lane < 32, 0x3F800000, 0x7F800000).astype(np.uint32)  # 2^0 | Inf (exponent 0xFF)
    big = np.where(lane < 32, 0x3F800000, 0x7F000000).astype(np.uint32)    # 2^0 | 2^127: 448*2^127 overflows
    for s_bits in (scale, big):
        out = run_snippet("  v_cvt_scalef32_pk_f32_fp8 v[10:11], v0, v1",
                          vgprs={0: src, 1: s_bits, 10: np.zeros(64, np.uint32), 11: np.zeros(64, np.uint32)},
                          outputs=["v10", "v11"], exec_mask=0xFFFFFFFF)
        for name in ("v10", "v11"):
            got = out[name].view(np.float32)
            assert (got[:32] == 448.0).all() and (got[32:] == 0).all()
    out = run_snippet("  v_cvt_scalef32_pk_f32_fp8 v[10:11], v0, v1", vgprs={0: src, 1: scale},
                      outputs=["v10"], exec_mask=0x1FFFFFFFF)         # lane 32 enabled: NaN there
    assert out["v10"][32] == 0x7FC00000 and (out["v10"][:32].view(np.float32) == 448.0).all()
    fp4 = {0: np.full(64, 0x22, np.uint32), 1: scale, 10: np.zeros(64, np.uint32), 11: np.zeros(64, np.uint32)}
    out = run_snippet("  v_cvt_scalef32_pk_f32_fp4 v[10:11], v0, v1", vgprs=fp4, outputs=["v10"],
                      exec_mask=0xFFFFFFFF)
    assert (out["v10"][:32].view(np.float32) == 1.0).all()
    with pytest.raises(UnsupportedInstruction, match="0xFF"):          # an enabled lane still raises
        run_snippet("  v_cvt_scalef32_pk_f32_fp4 v[10:11], v0, v1", vgprs=fp4, outputs=["v10"],
                    exec_mask=0x1FFFFFFFF)


def test_fp8_down_convert_ignores_inf_scale_in_lanes_exec_disables():
    # Regression (first found with a NaN source, modelled since): a lane EXEC switches off
    # was converted, and a refusal raised for it, although that lane writes nothing. An
    # Inf scale operand on the down-conversion is still refused in an enabled lane.
    x = np.random.default_rng(71).uniform(-4, 4, 64).astype(np.float32)
    scale = np.full(64, 0x3F800000, np.uint32)
    scale[63] = 0x7F800000
    regs = {0: x.view(np.uint32), 1: scale}
    out = run_snippet("v_cvt_scalef32_pk_fp8_f32 v2, v0, v0, v1", vgprs=regs, outputs=["v2"],
                      exec_mask=(1 << 63) - 1)
    want = torch.from_numpy(x[:63]).to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.uint32)
    np.testing.assert_array_equal(out["v2"][:63] & 0xFFFF, want | (want << 8))
    with pytest.raises(UnsupportedInstruction, match="0xFF"):
        run_snippet("v_cvt_scalef32_pk_fp8_f32 v2, v0, v0, v1", vgprs=regs, outputs=["v2"])


# ---------------------------------------------------------------------------- FP4 (E2M1)
# OCP MX v1.0 E2M1 magnitudes by code 0..7 (bit 3 is the sign), from the spec's table.
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def ref_fp4(x: np.ndarray) -> np.ndarray:
    """Brute-force RNE onto the E2M1 table: nearest magnitude, a tie to the even code; a
    value that would round past 6 (to the next binade's 8) saturates to 6."""
    mags = np.append(E2M1, 8.0)
    a = np.abs(x)[:, None]
    dist = np.abs(a - mags[None, :])
    best = dist.min(axis=1, keepdims=True)
    cands = np.where(dist == best, np.arange(9)[None, :], 99)
    even = np.where(cands % 2 == 0, cands, 99).min(axis=1)
    code = np.where(even < 99, even, cands.min(axis=1))
    code = np.minimum(code, 7)
    return (code | (np.signbit(x) << 3)).astype(np.uint32)


def fp4_inputs(rng, n):
    """f32 values around the E2M1 range: table values, exact midpoints, random, overflow."""
    mids = np.concatenate([E2M1, (E2M1[1:] + E2M1[:-1]) / 2, [6.5, 7.0, 7.5, 100.0, 0.25, 0.2]])
    vals = np.concatenate([mids, rng.uniform(0, 8, n)])
    vals = vals * rng.choice([-1.0, 1.0], len(vals))
    return vals.astype(np.float32)


def test_cvt_scalef32_pk_fp4_f32_every_byte():
    rng = np.random.default_rng(seed("fp4 pk"))
    x = fp4_inputs(rng, 300)
    y = np.roll(x, 7)
    s_bits, e = scale_operands(rng, len(x), 120, 134)
    factor = np.exp2(e.astype(np.float64) - 127)
    xs, ys = (x * factor).astype(np.float32), (y * factor).astype(np.float32)   # exact: x = xs / 2^s
    old = rng.integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(v)[:, 0] for v in (xs.view(np.uint32), ys.view(np.uint32), s_bits)]
                    + [lanes(old)[:, 0]] * 4, axis=1)
    body = "\n".join(f"  v_cvt_scalef32_pk_fp4_f32 v{10 + b}, v0, v1, v2 op_sel:[0,0,{b & 1},{b >> 1}]"
                     for b in range(4)) + "\n  s_nop 0"
    out = run_batch(body, [("v", 0), ("v", 1), ("v", 2)] + [("v", 10 + b) for b in range(4)], data,
                    [("v", 10 + b) for b in range(4)])
    packed = ref_fp4(x) | (ref_fp4(y) << 4)
    for b in range(4):
        got = out[:, b].reshape(-1)[:len(x)]
        want = (old & ~np.uint32(0xFF << (8 * b))) | (packed << np.uint32(8 * b))
        np.testing.assert_array_equal(got, want, err_msg=f"byte {b}")


@pytest.mark.parametrize("src", ["f16", "bf16"])
def test_cvt_scalef32_pk_fp4_16bit(src):
    rng = np.random.default_rng(seed("fp4 pk16", src))
    x = fp4_inputs(rng, 200)
    y = np.roll(x, 3)
    s_bits, e = scale_operands(rng, len(x), 124, 131)
    factor = np.exp2(e.astype(np.float64) - 127)
    dt = torch.float16 if src == "f16" else torch.bfloat16
    def half(v):       # 16-bit bits of v * 2^s; the reference uses the value actually stored
        t = torch.from_numpy((v * factor).astype(np.float32)).to(dt)
        return t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32), t.double().numpy() / factor
    (hx, vx), (hy, vy) = half(x), half(y)
    old = rng.integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(hx | (hy << 16))[:, 0], lanes(s_bits)[:, 0], lanes(old)[:, 0]], axis=1)
    body = f"  v_cvt_scalef32_pk_fp4_{src} v10, v0, v1 op_sel:[0,0,1,1]\n  s_nop 0"
    got = run_batch(body, [("v", 0), ("v", 1), ("v", 10)], data, [("v", 10)])[:, 0].reshape(-1)[:len(x)]
    want = (old & 0x00FFFFFF) | ((ref_fp4(vx) | (ref_fp4(vy) << 4)) << 24)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dst", ["f32", "f16", "bf16"])
def test_cvt_scalef32_pk_from_fp4_every_code_and_byte(dst):
    """Every FP4 pair (256 bytes) in every byte position, times 2^(e - 127)."""
    rng = np.random.default_rng(seed("fp4 up", dst))
    codes = np.tile(np.arange(256, dtype=np.uint32), 4)
    byte = np.repeat(np.arange(4), 256)
    junk = rng.integers(0, 2**32, len(codes), dtype=np.uint64).astype(np.uint32)
    words = (junk & ~(np.uint32(0xFF) << (8 * byte).astype(np.uint32))) | (codes << (8 * byte).astype(np.uint32))
    s_bits, e = scale_operands(rng, len(codes), 120, 135)
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]], axis=1)
    regs = "v[{0}:{1}]" if dst == "f32" else "v{0}"
    step = 2 if dst == "f32" else 1
    body = "\n".join(f"  v_cvt_scalef32_pk_{dst}_fp4 {regs.format(10 + step * b, 11 + step * b)}, v0, v1 "
                     f"op_sel:[{b & 1},{b >> 1},0]" for b in range(4))
    out = run_batch(body, [("v", 0), ("v", 1)], data, [("v", 10 + r) for r in range(4 * step)])
    sign = np.where(codes & 0x8, -1.0, 1.0), np.where(codes & 0x80, -1.0, 1.0)
    lo = sign[0] * E2M1[codes & 7] * np.exp2(e - 127.0)
    hi = sign[1] * E2M1[(codes >> 4) & 7] * np.exp2(e - 127.0)
    n = np.arange(len(codes))
    if dst == "f32":
        got = out.reshape(-1, 4, 2, 64).transpose(1, 2, 0, 3).reshape(4, 2, -1)[byte, :, n]
        np.testing.assert_array_equal(got[:, 0].view(np.float32), lo.astype(np.float32))
        np.testing.assert_array_equal(got[:, 1].view(np.float32), hi.astype(np.float32))
        return
    got = out.transpose(1, 0, 2).reshape(4, -1)[byte, n]
    dt = torch.float16 if dst == "f16" else torch.bfloat16
    enc = lambda v: torch.from_numpy(v).to(dt).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    np.testing.assert_array_equal(got, enc(lo) | (enc(hi) << 16))


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_fp4_nan_or_inf_source_is_rejected(value):
    bits = np.array([value], np.float32).view(np.uint32)[0]
    with pytest.raises(UnsupportedInstruction, match="NaN or Inf"):
        run_snippet("  v_cvt_scalef32_pk_fp4_f32 v10, v0, v0, v1",
                    vgprs={0: np.full(64, bits, np.uint32), 1: np.full(64, 0x3F800000, np.uint32)})


# ---------------------------------------------------------------------------- fp8 <-> 16-bit, scaled
def fp8_codes(rng, n, fmt):
    """Random non-NaN codes; bf8 exponents kept within 2^-7..2^7 so that every value times a
    scale in 2^-3..2^3 is exact and finite in f16 as well as bf16."""
    if fmt == "fp8":
        c = rng.integers(0, 256, n)
        return np.where((c & 0x7F) == 0x7F, c ^ 1, c).astype(np.uint32)
    return ((rng.integers(0, 2, n) << 7) | (rng.integers(8, 23, n) << 2) | rng.integers(0, 4, n)).astype(np.uint32)


def to16(v: np.ndarray, dst: str) -> np.ndarray:
    dt = torch.float16 if dst == "f16" else torch.bfloat16
    return torch.from_numpy(np.asarray(v, np.float32)).to(dt).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
@pytest.mark.parametrize("src", ["f16", "bf16"])
def test_cvt_scalef32_pk_fp8_from_16bit(fmt, src):
    """Halves holding code values times 2^s convert back to those codes, into the word
    op_sel[3] selects (the other word kept)."""
    rng = np.random.default_rng(seed("pk fp8 16", fmt, src))
    lo, hi = fp8_codes(rng, 320, fmt), fp8_codes(rng, 320, fmt)
    s_bits, e = scale_operands(rng, len(lo), 124, 131)
    factor = np.exp2(e - 127.0)
    words = to16(t_decode_fp8(lo, fmt) * factor, src) | (to16(t_decode_fp8(hi, fmt) * factor, src) << 16)
    old = rng.integers(0, 2**32, len(lo), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0], lanes(old)[:, 0], lanes(old)[:, 0]], axis=1)
    name = f"v_cvt_scalef32_pk_{fmt}_{src}"
    body = f"  {name} v10, v0, v1\n  {name} v11, v0, v1 op_sel:[0,0,1]\n  s_nop 0"
    out = run_batch(body, [("v", 0), ("v", 1), ("v", 10), ("v", 11)], data, [("v", 10), ("v", 11)])
    pair = lo | (hi << 8)
    np.testing.assert_array_equal(out[:, 0].reshape(-1)[:len(lo)], (old & 0xFFFF0000) | pair)
    np.testing.assert_array_equal(out[:, 1].reshape(-1)[:len(lo)], (old & 0xFFFF) | (pair << 16))


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
def test_cvt_scalef32_f16_fp8_byte_and_half_select(fmt):
    """Every byte select (op_sel[0:1]) into either half (op_sel[3]); the other half kept."""
    rng = np.random.default_rng(seed("f16 fp8", fmt))
    b = [fp8_codes(rng, 512, fmt) for _ in range(4)]
    words = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)
    s_bits, e = scale_operands(rng, len(words), 124, 131)
    old = rng.integers(0, 2**32, len(words), dtype=np.uint64).astype(np.uint32)
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]] + [lanes(old)[:, 0]] * 8, axis=1)
    body = "\n".join(f"  v_cvt_scalef32_f16_{fmt} v{10 + 2 * k + h}, v0, v1 op_sel:[{k & 1},{k >> 1},{h}]"
                     for k in range(4) for h in (0, 1)) + "\n  s_nop 0"
    out = run_batch(body, [("v", 0), ("v", 1)] + [("v", 10 + r) for r in range(8)], data,
                    [("v", 10 + r) for r in range(8)])
    for k in range(4):
        want = to16(t_decode_fp8(b[k], fmt) * np.exp2(e - 127.0), "f16")
        np.testing.assert_array_equal(out[:, 2 * k].reshape(-1), (old & 0xFFFF0000) | want)
        np.testing.assert_array_equal(out[:, 2 * k + 1].reshape(-1), (old & 0xFFFF) | (want << 16))


@pytest.mark.parametrize("fmt", ["fp8", "bf8"])
@pytest.mark.parametrize("dst", ["f16", "bf16"])
def test_cvt_scalef32_pk_16bit_from_fp8(fmt, dst):
    rng = np.random.default_rng(seed("pk16 fp8", fmt, dst))
    b = [fp8_codes(rng, 384, fmt) for _ in range(4)]
    words = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)
    s_bits, e = scale_operands(rng, len(words), 124, 131)
    data = np.stack([lanes(words)[:, 0], lanes(s_bits)[:, 0]], axis=1)
    name = f"v_cvt_scalef32_pk_{dst}_{fmt}"
    out = run_batch(f"  {name} v10, v0, v1\n  {name} v11, v0, v1 op_sel:[1,0,0]", [("v", 0), ("v", 1)], data,
                    [("v", 10), ("v", 11)])
    f = np.exp2(e - 127.0)
    for k in (0, 1):
        want = to16(t_decode_fp8(b[2 * k], fmt) * f, dst) | (to16(t_decode_fp8(b[2 * k + 1], fmt) * f, dst) << 16)
        np.testing.assert_array_equal(out[:, k].reshape(-1)[:len(words)], want)

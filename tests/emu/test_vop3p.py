"""Known-answer tests for VOP3P packed math, v_fma_mix* and v_dot2* (families/vop3p.py).

References are computed here, never by the emulator: exact rational arithmetic
(fractions.Fraction) with a nearest-value search for fused operations, torch for plain
f32/f16 add/mul (whose f32/f16 results are correctly rounded), numpy for integers.
Operand selection follows the VOP3P definition (module docstring of vop3p.py, LLVM).
"""
from __future__ import annotations

import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch

from gfxasm.emu.errors import UnsupportedInstruction
from asm_harness import run_snippet
from mfma_batch import run_batch


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


# ----------------------------------------------------------------------------- references
def nearest(x: Fraction, dtype) -> np.floating:
    """x rounded to nearest-even in float32/float16 (x finite and in range)."""
    guess = dtype(float(x))
    cands = {guess, np.nextafter(guess, dtype(np.inf)), np.nextafter(guess, dtype(-np.inf))}
    cands = [c for c in cands if np.isfinite(c)]
    ubits = np.uint32 if dtype == np.float32 else np.uint16

    def key(c):
        return (abs(Fraction(float(c)) - x), int(np.array(c, dtype).view(ubits)) & 1)
    return min(cands, key=key)


def frac(v) -> Fraction:
    return Fraction(float(v))


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def rand_f32(rng, n=64, lo=-8, hi=8):
    """Random f32 values with full 24-bit significands and exponents in [lo, hi)."""
    mant = rng.integers(1 << 23, 1 << 24, n).astype(np.float64)
    exp = rng.integers(lo, hi, n)
    sign = rng.choice([-1.0, 1.0], n)
    return (sign * mant * np.exp2(exp - 23)).astype(np.float32)


def rand_f16_bits(rng, n=64):
    """Random finite normal f16 values with exponents in [-6, 6]."""
    exp = rng.integers(15 - 6, 15 + 6, n)
    return ((rng.integers(0, 2, n) << 15) | (exp << 10) | rng.integers(0, 1024, n)).astype(np.uint16)


def h2f(bits):
    return np.asarray(bits, np.uint16).view(np.float16).astype(np.float64)


def pack(lo, hi):
    return (np.asarray(lo, np.uint32) & 0xFFFF) | (np.asarray(hi, np.uint32) << 16)


# ----------------------------------------------------------------------------- packed f32
def test_pk_fma_f32_is_fused_single_rounding():
    """a*b = 1 + 2^-11 + 2^-24 exactly; adding c = +-2^-70 decides a tie that a float64
    intermediate would lose (double rounding)."""
    a = np.full(64, 1 + 2.0 ** -12, np.float32)
    c = np.where(np.arange(64) % 2 == 0, 2.0 ** -70, -(2.0 ** -70)).astype(np.float32)
    out = run_snippet("v_pk_fma_f32 v[10:11], v[0:1], v[0:1], v[4:5]",
                      vgprs={0: a.view(np.uint32), 1: a.view(np.uint32), 4: c.view(np.uint32),
                             5: c.view(np.uint32)}, outputs=["v10", "v11"])
    up, down = np.float32(1 + 2.0 ** -11 + 2.0 ** -23), np.float32(1 + 2.0 ** -11)
    want = np.where(np.arange(64) % 2 == 0, up, down)
    np.testing.assert_array_equal(f32(out["v10"]), want)
    np.testing.assert_array_equal(f32(out["v11"]), want)


def _pk_f32_selection_body(combos):
    lines = []
    for n, (op_sel, op_sel_hi, neg_lo, neg_hi) in enumerate(combos):
        lines.append(f"  v_pk_fma_f32 v[{40 + 2 * n}:{41 + 2 * n}], v[0:1], v[2:3], v[4:5] "
                     f"op_sel:[{','.join(map(str, op_sel))}] op_sel_hi:[{','.join(map(str, op_sel_hi))}] "
                     f"neg_lo:[{','.join(map(str, neg_lo))}] neg_hi:[{','.join(map(str, neg_hi))}]")
    return "\n".join(lines)


def test_pk_fma_f32_operand_selection_and_negation():
    rng = np.random.default_rng(seed("pkfma-sel"))
    combos = [tuple(tuple(int(b) for b in rng.integers(0, 2, 3)) for _ in range(4)) for _ in range(12)]
    regs = [rand_f32(rng) for _ in range(6)]          # v0..v5 = pairs (v0,v1) (v2,v3) (v4,v5)
    outputs = [("v", 40 + k) for k in range(2 * len(combos))]
    out = run_batch(_pk_f32_selection_body(combos), [("v", r) for r in range(6)],
                    np.stack([np.stack([r.view(np.uint32) for r in regs])]), outputs)[0]
    for n, (op_sel, op_sel_hi, neg_lo, neg_hi) in enumerate(combos):
        for half, sel, neg in ((0, op_sel, neg_lo), (1, op_sel_hi, neg_hi)):
            got = f32(out[2 * n + half])
            for lane in range(0, 64, 7):
                x = [regs[2 * i + sel[i]][lane] for i in range(3)]
                x = [-v if neg[i] else v for i, v in enumerate(x)]
                want = nearest(frac(x[0]) * frac(x[1]) + frac(x[2]), np.float32)
                assert got[lane] == want, (n, half, lane)


@pytest.mark.parametrize("name,op", [("v_pk_mul_f32", torch.mul), ("v_pk_add_f32", torch.add)])
def test_pk_mul_add_f32(name, op):
    rng = np.random.default_rng(seed(name))
    regs = [rand_f32(rng, lo=-40, hi=40) for _ in range(4)]
    body = (f"  {name} v[10:11], v[0:1], v[2:3]\n"
            f"  {name} v[12:13], v[0:1], v[2:3] op_sel:[1,0] op_sel_hi:[0,1] neg_lo:[0,1] neg_hi:[1,1]")
    out = run_snippet(body, vgprs={r: regs[r].view(np.uint32) for r in range(4)},
                      outputs=["v10", "v11", "v12", "v13"])
    t = [torch.from_numpy(r) for r in regs]
    np.testing.assert_array_equal(f32(out["v10"]), op(t[0], t[2]).numpy())
    np.testing.assert_array_equal(f32(out["v11"]), op(t[1], t[3]).numpy())
    np.testing.assert_array_equal(f32(out["v12"]), op(t[1], -t[2]).numpy())
    np.testing.assert_array_equal(f32(out["v13"]), op(-t[0], -t[3]).numpy())


def test_pk_f32_sgpr_pair_and_inline_constant():
    rng = np.random.default_rng(seed("sgpr"))
    a, b = rand_f32(rng), rand_f32(rng)
    body = ("  v_pk_mul_f32 v[10:11], v[0:1], s[4:5] op_sel_hi:[1,0]\n"      # hi reads s4 too
            "  v_pk_mul_f32 v[12:13], v[0:1], 2.0 op_sel_hi:[1,0]\n"
            "  v_pk_add_f32 v[14:15], v[0:1], -4.0 op_sel_hi:[1,0]")
    out = run_snippet(body, vgprs={0: a.view(np.uint32), 1: b.view(np.uint32)},
                      sgprs={4: np.float32(3.0).view(np.uint32), 5: np.float32(-5.0).view(np.uint32)},
                      outputs=["v10", "v11", "v12", "v13", "v14", "v15"])
    np.testing.assert_array_equal(f32(out["v10"]), a * np.float32(3))
    np.testing.assert_array_equal(f32(out["v11"]), b * np.float32(3))
    np.testing.assert_array_equal(f32(out["v12"]), a * np.float32(2))
    np.testing.assert_array_equal(f32(out["v13"]), b * np.float32(2))
    np.testing.assert_array_equal(f32(out["v14"]), a - np.float32(4))
    np.testing.assert_array_equal(f32(out["v15"]), b - np.float32(4))


def test_pk_f32_constant_with_select_bit_is_rejected():
    with pytest.raises(UnsupportedInstruction, match="unverified"):
        run_snippet("  v_pk_mul_f32 v[10:11], v[0:1], 2.0",
                    vgprs={0: np.ones(64, np.uint32), 1: np.ones(64, np.uint32)})


def test_pk_mov_b32():
    rng = np.random.default_rng(seed("mov"))
    regs = {r: rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32) for r in range(4)}
    body = "\n".join(f"  v_pk_mov_b32 v[{10 + 2 * n}:{11 + 2 * n}], v[0:1], v[2:3] op_sel:[{a},{b}]"
                     for n, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]))
    body += "\n  v_pk_mov_b32 v[20:21], s[6:7], v[2:3] op_sel:[1,1]"
    out = run_snippet(body, vgprs=regs, sgprs={6: 0x11111111, 7: 0x22222222},
                      outputs=[f"v{r}" for r in range(10, 22)])
    for n, (a, b) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        np.testing.assert_array_equal(out[f"v{10 + 2 * n}"], regs[a])
        np.testing.assert_array_equal(out[f"v{11 + 2 * n}"], regs[2 + b])
    assert (out["v20"] == 0x22222222).all()
    np.testing.assert_array_equal(out["v21"], regs[3])


def test_pk_f32_denormals_follow_mode():
    tiny = np.full(64, 1e-39, np.float32)                # f32 denormal
    one = np.ones(64, np.float32)
    data = np.stack([np.stack([tiny.view(np.uint32), tiny.view(np.uint32), one.view(np.uint32),
                               one.view(np.uint32)])])
    inputs = [("v", 0), ("v", 1), ("v", 2), ("v", 3)]
    body = "  v_pk_mul_f32 v[10:11], v[0:1], v[2:3]"
    kept = run_batch(body, inputs, data, [("v", 10)], denorm=3)[0, 0]
    flushed = run_batch(body, inputs, data, [("v", 10)], denorm=0)[0, 0]
    np.testing.assert_array_equal(f32(kept), tiny)
    np.testing.assert_array_equal(f32(flushed), np.zeros(64, np.float32))


def test_pk_fma_f32_clamp():
    a = np.linspace(-2, 2, 64).astype(np.float32)
    one = np.ones(64, np.float32)
    zero = np.zeros(64, np.float32)
    regs = {0: a, 1: a, 2: one, 3: one, 4: zero, 5: zero}
    out = run_snippet("  v_pk_fma_f32 v[10:11], v[0:1], v[2:3], v[4:5] clamp",
                      vgprs={k: v.view(np.uint32) for k, v in regs.items()}, outputs=["v10", "v11"])
    np.testing.assert_array_equal(f32(out["v10"]), np.clip(a, 0, 1))
    np.testing.assert_array_equal(f32(out["v11"]), np.clip(a, 0, 1))


# ----------------------------------------------------------------------------- packed f16
F16_BINARY = {"v_pk_add_f16": torch.add, "v_pk_mul_f16": torch.mul,
              "v_pk_max_f16": torch.fmax, "v_pk_min_f16": torch.fmin}


@pytest.mark.parametrize("name", sorted(F16_BINARY))
def test_pk_f16_binary(name):
    rng = np.random.default_rng(seed(name))
    a0, a1, b0, b1 = (rand_f16_bits(rng) for _ in range(4))
    body = (f"  {name} v10, v0, v1\n"
            f"  {name} v11, v0, v1 op_sel:[1,0] op_sel_hi:[0,1] neg_lo:[0,1] neg_hi:[1,0]")
    out = run_snippet(body, vgprs={0: pack(a0, a1), 1: pack(b0, b1)}, outputs=["v10", "v11"])
    op = F16_BINARY[name]
    t = lambda bits: torch.from_numpy(np.asarray(bits, np.uint16).view(np.float16).copy())
    want_lo, want_hi = op(t(a0), t(b0)), op(t(a1), t(b1))
    np.testing.assert_array_equal(out["v10"] & 0xFFFF, want_lo.numpy().view(np.uint16))
    np.testing.assert_array_equal(out["v10"] >> 16, want_hi.numpy().view(np.uint16))
    want_lo, want_hi = op(t(a1), -t(b0)), op(-t(a0), t(b1))
    np.testing.assert_array_equal(out["v11"] & 0xFFFF, want_lo.numpy().view(np.uint16))
    np.testing.assert_array_equal(out["v11"] >> 16, want_hi.numpy().view(np.uint16))


def test_pk_fma_f16_is_fused():
    rng = np.random.default_rng(seed("fma16"))
    a, b, c = (rand_f16_bits(rng, 128) for _ in range(3))
    out = run_snippet("  v_pk_fma_f16 v10, v0, v1, v2",
                      vgprs={0: pack(a[:64], a[64:]), 1: pack(b[:64], b[64:]), 2: pack(c[:64], c[64:])},
                      outputs=["v10"])
    got = np.concatenate([out["v10"] & 0xFFFF, out["v10"] >> 16]).astype(np.uint16)
    for i in range(128):
        want = nearest(frac(h2f(a[i])) * frac(h2f(b[i])) + frac(h2f(c[i])), np.float16)
        assert got[i] == np.array(want, np.float16).view(np.uint16), i


def test_pk_f16_inline_constants():
    """`1.0` is <1.0, 0.0>; `1.0 op_sel_hi:[1,0]` splats it (LLVM pk_max_f16_literal.ll)."""
    x = np.full(64, 0x40003C00, np.uint32)                     # <1.0, 2.0>
    out = run_snippet("  v_pk_add_f16 v10, v0, 1.0\n  v_pk_add_f16 v11, v0, 1.0 op_sel_hi:[1,0]\n"
                      "  v_pk_mul_f16 v12, v0, -2.0 op_sel:[0,1] op_sel_hi:[1,0]",
                      vgprs={0: x}, outputs=["v10", "v11", "v12"])
    assert (out["v10"] == 0x40004000).all()                    # <2.0, 2.0 + 0.0>
    assert (out["v11"] == 0x42004000).all()                    # <2.0, 3.0>
    assert (out["v12"] == 0xC4000000).all()                    # <1.0 * +0.0, 2.0 * -2.0>


def test_pk_f16_overflow_follows_fp16_ovfl():
    big = np.full((1, 1, 64), 0x7A007A00, np.uint32)            # <49152, 49152>
    body = "  v_pk_add_f16 v10, v0, v0"
    inf = run_batch(body, [("v", 0)], big, [("v", 10)], fp16_ovfl=0)[0, 0]
    sat = run_batch(body, [("v", 0)], big, [("v", 10)], fp16_ovfl=1)[0, 0]
    assert (inf == 0x7C007C00).all()
    assert (sat == 0x7BFF7BFF).all()


def _ieee_maximum(x, y):
    """IEEE 754-2019 maximum (LLVM lowers llvm.maximum to v_pk_maximum3_f16): NaN wins,
    -0 < +0."""
    if np.isnan(x) or np.isnan(y):
        return np.float16(np.nan)
    if x == y == 0:
        return np.float16(-0.0) if (np.signbit(x) and np.signbit(y)) else np.float16(0.0)
    return max(x, y)


def _ieee_minimum(x, y):
    if np.isnan(x) or np.isnan(y):
        return np.float16(np.nan)
    if x == y == 0:
        return np.float16(-0.0) if (np.signbit(x) or np.signbit(y)) else np.float16(0.0)
    return min(x, y)


def test_pk_maximum3_minimum3_f16():
    vals = np.array([0.0, -0.0, 1.5, -2.0, np.nan, 3.0], np.float16).view(np.uint16)
    rng = np.random.default_rng(seed("max3"))
    a, b, c = (vals[rng.integers(0, len(vals), 128)] for _ in range(3))
    regs = {0: pack(a[:64], a[64:]), 1: pack(b[:64], b[64:]), 2: pack(c[:64], c[64:])}
    out = run_snippet("  v_pk_maximum3_f16 v10, v0, v1, v2\n  v_pk_minimum3_f16 v11, v0, v1, v2",
                      vgprs=regs, outputs=["v10", "v11"])
    x, y, z = (np.asarray(v, np.uint16).view(np.float16) for v in (a, b, c))
    for got, fn in ((out["v10"], _ieee_maximum), (out["v11"], _ieee_minimum)):
        g = np.concatenate([got & 0xFFFF, got >> 16]).astype(np.uint16).view(np.float16)
        for i in range(128):
            want = np.float16(fn(fn(x[i], y[i]), z[i]))
            if np.isnan(want):
                assert np.isnan(g[i]), i
            else:
                assert g[i].view(np.uint16) == want.view(np.uint16), i


# ----------------------------------------------------------------------------- packed int16
INT_OPS = {
    "v_pk_add_u16": lambda a, b: a + b, "v_pk_sub_u16": lambda a, b: a - b,
    "v_pk_add_i16": lambda a, b: a + b, "v_pk_sub_i16": lambda a, b: a - b,
    "v_pk_mul_lo_u16": lambda a, b: a * b,
    "v_pk_lshlrev_b16": lambda a, b: b << (a & 15), "v_pk_lshrrev_b16": lambda a, b: b >> (a & 15),
    "v_pk_ashrrev_i16": lambda a, b: b.astype(np.int16) >> (a & 15),
    "v_pk_max_u16": np.maximum, "v_pk_min_u16": np.minimum,
    "v_pk_max_i16": lambda a, b: np.maximum(a.astype(np.int16), b.astype(np.int16)),
    "v_pk_min_i16": lambda a, b: np.minimum(a.astype(np.int16), b.astype(np.int16)),
}


@pytest.mark.parametrize("name", sorted(INT_OPS))
def test_pk_int16(name):
    rng = np.random.default_rng(seed(name))
    a = rng.integers(0, 1 << 16, (2, 64)).astype(np.uint16)
    b = rng.integers(0, 1 << 16, (2, 64)).astype(np.uint16)
    out = run_snippet(f"  {name} v10, v0, v1 op_sel:[0,1] op_sel_hi:[1,0]",
                      vgprs={0: pack(a[0], a[1]), 1: pack(b[0], b[1])}, outputs=["v10"])
    fn = INT_OPS[name]
    with np.errstate(over="ignore"):
        lo = np.asarray(fn(a[0], b[1])).astype(np.uint16)
        hi = np.asarray(fn(a[1], b[0])).astype(np.uint16)
    np.testing.assert_array_equal(out["v10"] & 0xFFFF, lo)
    np.testing.assert_array_equal(out["v10"] >> 16, hi)


def test_pk_mad_u16_and_integer_constants():
    """Integer constants are the 32-bit sign-extended value: -1 = <-1, -1>, 32 = <32, 0>
    (LLVM add.v2i16.ll: <i16 -1, i16 -1> is emitted as `-1`)."""
    rng = np.random.default_rng(seed("mad"))
    a, b, c = (rng.integers(0, 1 << 16, (2, 64)).astype(np.uint16) for _ in range(3))
    out = run_snippet("  v_pk_mad_u16 v10, v0, v1, v2\n  v_pk_add_u16 v11, v0, -1\n"
                      "  v_pk_add_u16 v12, v0, 32",
                      vgprs={0: pack(*a), 1: pack(*b), 2: pack(*c)}, outputs=["v10", "v11", "v12"])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out["v10"], pack(a[0] * b[0] + c[0], a[1] * b[1] + c[1]))
        np.testing.assert_array_equal(out["v11"], pack(a[0] - np.uint16(1), a[1] - np.uint16(1)))
        np.testing.assert_array_equal(out["v12"], pack(a[0] + np.uint16(32), a[1]))


@pytest.mark.parametrize("body", ["  v_pk_add_u16 v10, v0, v1 clamp",
                                  "  v_pk_add_u16 v10, v0, v1 neg_lo:[1,0]",
                                  "  v_pk_add_u16 v10, v0, 1.0"])
def test_pk_int16_unmodelled_forms(body):
    with pytest.raises(UnsupportedInstruction):
        run_snippet(body, vgprs={0: np.ones(64, np.uint32), 1: np.ones(64, np.uint32)})


# ----------------------------------------------------------------------------- mix
def test_fma_mix_f32_selection_abs_neg():
    rng = np.random.default_rng(seed("mix"))
    h = [pack(rand_f16_bits(rng), rand_f16_bits(rng)) for _ in range(3)]   # v0..v2: f16 pairs
    f = [rand_f32(rng) for _ in range(3)]                                  # v3..v5: f32
    regs = {0: h[0], 1: h[1], 2: h[2], 3: f[0].view(np.uint32), 4: f[1].view(np.uint32),
            5: f[2].view(np.uint32)}
    cases = [  # (operands, op_sel, op_sel_hi, text modifiers)
        (("v0", "v1", "v5"), (1, 0, 0), (1, 1, 0), ""),
        (("v3", "v1", "v2"), (0, 1, 1), (0, 1, 1), ""),
        (("|v0|", "-v4", "-|v2|"), (0, 0, 1), (1, 0, 1), ""),
        (("v3", "v4", "v5"), (0, 0, 0), (0, 0, 0), ""),
    ]
    lines = []
    for n, (ops, sel, sel_hi, _) in enumerate(cases):
        lines.append(f"  v_fma_mix_f32 v{10 + n}, {', '.join(ops)} op_sel:[{','.join(map(str, sel))}] "
                     f"op_sel_hi:[{','.join(map(str, sel_hi))}]")
    out = run_snippet("\n".join(lines), vgprs=regs, outputs=[f"v{10 + n}" for n in range(len(cases))])
    for n, (ops, sel, sel_hi, _) in enumerate(cases):
        got = f32(out[f"v{10 + n}"])
        for lane in range(0, 64, 5):
            xs = []
            for i, text in enumerate(ops):
                reg = int(text.strip("-|")[1:])
                word = int(regs[reg][lane])
                if sel_hi[i]:
                    x = frac(h2f(np.uint16((word >> (16 * sel[i])) & 0xFFFF)))
                else:
                    x = frac(np.uint32(word).view(np.float32))
                if "|" in text:
                    x = abs(x)
                if text.startswith("-"):
                    x = -x
                xs.append(x)
            assert got[lane] == nearest(xs[0] * xs[1] + xs[2], np.float32), (n, lane)


def test_fma_mixlo_mixhi_keep_the_other_half():
    rng = np.random.default_rng(seed("mixlo"))
    a, b, c = (rand_f16_bits(rng) for _ in range(3))
    dst = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    regs = {0: pack(a, a), 1: pack(b, b), 2: pack(c, c), 10: dst, 11: dst}
    out = run_snippet("  v_fma_mixlo_f16 v10, v0, v1, v2 op_sel_hi:[1,1,1]\n"
                      "  v_fma_mixhi_f16 v11, v0, v1, v2 op_sel_hi:[1,1,1]",
                      vgprs=regs, outputs=["v10", "v11"])
    want = np.array([np.array(nearest(frac(h2f(a[i])) * frac(h2f(b[i])) + frac(h2f(c[i])), np.float16),
                              np.float16).view(np.uint16) for i in range(64)], np.uint32)
    np.testing.assert_array_equal(out["v10"], (dst & 0xFFFF0000) | want)
    np.testing.assert_array_equal(out["v11"], (dst & 0xFFFF) | (want << 16))


# ----------------------------------------------------------------------------- dot products
@pytest.mark.parametrize("name", ["v_dot2_f32_f16", "v_dot2_f32_bf16", "v_dot2c_f32_f16",
                                  "v_dot2c_f32_bf16"])
def test_dot2(name):
    rng = np.random.default_rng(seed(name))
    bf16 = name.endswith("bf16")
    if bf16:
        def gen():
            v = rand_f32(rng, lo=-30, hi=30)
            return (v.view(np.uint32) >> 16).astype(np.uint16)
        dec = lambda bits: float((np.uint32(bits) << np.uint32(16)).view(np.float32))
    else:
        gen = lambda: rand_f16_bits(rng)
        dec = lambda bits: float(h2f(np.uint16(bits)))
    a0, a1, b0, b1 = gen(), gen(), gen(), gen()
    c = rand_f32(rng, lo=-20, hi=20)
    regs = {0: pack(a0, a1), 1: pack(b0, b1), 2: c.view(np.uint32)}
    if name.startswith("v_dot2c"):
        body = f"  v_mov_b32 v10, v2\n  s_nop 1\n  {name} v10, v0, v1"
        negs = (0, 0, 0, 0, 0)
    elif bf16:
        body, negs = f"  {name} v10, v0, v1, v2 neg_lo:[0,0,1]", (0, 0, 0, 0, 1)
    else:
        body, negs = f"  {name} v10, v0, v1, v2 neg_lo:[1,0,1] neg_hi:[0,1,0]", (1, 0, 0, 1, 1)
    out = run_snippet(body, vgprs=regs, outputs=["v10"])
    got = f32(out["v10"])
    sgn = [(-1) ** n for n in negs]
    for lane in range(64):
        exact = (sgn[0] * Fraction(dec(a0[lane])) * sgn[2] * Fraction(dec(b0[lane]))
                 + sgn[1] * Fraction(dec(a1[lane])) * sgn[3] * Fraction(dec(b1[lane]))
                 + sgn[4] * frac(c[lane]))
        assert got[lane] == nearest(exact, np.float32), lane

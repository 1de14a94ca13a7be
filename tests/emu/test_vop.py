"""Known-answer tests for the vector ALU (families/vop.py): f32 arithmetic with neg/abs/
clamp/omod and denormal flushing, integer ops, v_perm_b32, v_cndmask, carry ops, compares
(VCC, SGPR pairs, v_cmpx writing EXEC), lane access (readlane/readfirstlane/writelane) and
v_mbcnt.

References are independent: f32 results are rounded here from exact rationals
(round-to-nearest-even, with the f32 denormal mode applied to inputs and outputs as the
ISA's MODE.FP_DENORM describes); integer results are Python integer arithmetic
transcribed from the ISA's operation descriptions. Inputs are seeded random values.
"""
from fractions import Fraction

import numpy as np
import pytest

import asm_harness
from asm_harness import run_snippet
from gfxasm.emu.errors import HazardError, UnsupportedInstruction

M32 = 0xFFFFFFFF
TINY = 2.0 ** -126


def u32(x):
    return np.asarray(x, np.float32).view(np.uint32)


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def rand_u32(r, n=64):
    return r.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def rand_f32(r, n=64, spread=8):
    return (r.standard_normal(n) * 2.0 ** r.integers(-spread, spread, n)).astype(np.float32)


def sx(x, bits=32):
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def Q(x):
    """Exact rational value of a finite float."""
    return Fraction(float(x))


def round_f32(q: Fraction) -> np.float32:
    """Exact round-to-nearest-even of a rational to f32 (finite, normal-range inputs)."""
    if q == 0:
        return np.float32(0.0)
    approx = np.float32(float(q))
    best = None
    for c in (np.nextafter(approx, np.float32(-np.inf)), approx, np.nextafter(approx, np.float32(np.inf))):
        if not np.isfinite(c):
            continue
        key = (abs(Q(c) - q), int(u32(c)) & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


def flush(x, denorm):
    x = np.float32(x)
    if not denorm and x != 0 and abs(x) < TINY:
        return np.copysign(np.float32(0.0), x)
    return x


# ------------------------------------------------------------- f32 arithmetic
F32_OPS = [
    # asm (v3 = result; v1, v2, v4 = a, b, c), reference on exact rationals / floats
    ("v_add_f32 v{d}, v1, v2", lambda a, b, c: Q(a) + Q(b)),
    ("v_sub_f32 v{d}, v1, v2", lambda a, b, c: Q(a) - Q(b)),
    ("v_subrev_f32 v{d}, v1, v2", lambda a, b, c: Q(b) - Q(a)),
    ("v_mul_f32 v{d}, v1, v2", lambda a, b, c: Q(a) * Q(b)),
    ("v_fma_f32 v{d}, v1, v2, v4", lambda a, b, c: Q(a) * Q(b) + Q(c)),
    ("v_add_f32_e64 v{d}, -v1, |v2|", lambda a, b, c: -Q(a) + abs(Q(b))),
    ("v_mul_f32_e64 v{d}, -|v1|, -v2", lambda a, b, c: -abs(Q(a)) * -Q(b)),
    ("v_fma_f32 v{d}, v1, -v2, -|v4|", lambda a, b, c: -Q(a) * Q(b) - abs(Q(c))),
    ("v_mul_f32_e64 v{d}, v1, v2 mul:2", lambda a, b, c: Q(a) * Q(b) * 2),
    ("v_add_f32_e64 v{d}, v1, v2 mul:4", lambda a, b, c: (Q(a) + Q(b)) * 4),
    ("v_add_f32_e64 v{d}, v1, v2 div:2", lambda a, b, c: (Q(a) + Q(b)) / 2),
    ("v_add_f32_e64 v{d}, v1, v2 clamp", lambda a, b, c: min(max(Q(a) + Q(b), 0), 1)),
    ("v_mul_f32_e64 v{d}, v1, v2 clamp mul:2", lambda a, b, c: min(max(Q(a) * Q(b) * 2, 0), 1)),
    ("v_min_f32 v{d}, v1, v2", lambda a, b, c: min(Q(a), Q(b))),
    ("v_max_f32 v{d}, v1, v2", lambda a, b, c: max(Q(a), Q(b))),
    ("v_min3_f32 v{d}, v1, v2, v4", lambda a, b, c: min(Q(a), Q(b), Q(c))),
    ("v_max3_f32 v{d}, v1, v2, v4", lambda a, b, c: max(Q(a), Q(b), Q(c))),
    ("v_med3_f32 v{d}, v1, v2, v4", lambda a, b, c: sorted([Q(a), Q(b), Q(c)])[1]),
    # IEEE roundToIntegral (signed zeros included): numpy's float32 functions are exact
    ("v_floor_f32 v{d}, v1", lambda a, b, c: np.floor(a)),
    ("v_ceil_f32 v{d}, v1", lambda a, b, c: np.ceil(a)),
    ("v_trunc_f32 v{d}, v1", lambda a, b, c: np.trunc(a)),
    ("v_rndne_f32 v{d}, v1", lambda a, b, c: np.rint(a)),                 # ties to even
    ("v_fract_f32 v{d}, v1", lambda a, b, c: Q(a) - Fraction(int(np.floor(a)))),
    ("v_ldexp_f32 v{d}, v1, v5", lambda a, b, c: Q(a) * Fraction(2) ** LDEXP_SHIFT),
]
LDEXP_SHIFT = -5


def _f32_kernel():
    return "\n".join("  " + asm.format(d=10 + k) for k, (asm, _) in enumerate(F32_OPS)) + "\n"


@pytest.mark.parametrize("seed", [1, 2])
def test_f32_arithmetic_and_modifiers(seed):
    r = np.random.default_rng(1000 + seed)
    a, b, c = rand_f32(r), rand_f32(r), rand_f32(r)
    a[:4] = [0.5, -2.5, 1.5, 3.5]           # rounding ties for rndne
    out = run_snippet(_f32_kernel(), vgprs={1: u32(a), 2: u32(b), 4: u32(c),
                                            5: np.full(64, LDEXP_SHIFT & M32, np.uint32)},
                      outputs=[f"v{10 + k}" for k in range(len(F32_OPS))])
    for k, (asm, ref) in enumerate(F32_OPS):
        for lane in range(64):
            q = ref(a[lane], b[lane], c[lane])
            want = q if isinstance(q, np.floating) else round_f32(q)
            if "fract" in asm:
                want = min(want, np.float32(np.nextafter(np.float32(1), np.float32(0))))
            got = f32(out[f"v{10 + k}"][lane])
            assert u32(got) == u32(want), (asm, lane, a[lane], b[lane], c[lane], got, want)


def test_fract_of_tiny_negative_is_below_one():
    """Regression: v_fract_f32(-tiny) returned 1.0; the instruction clamps to 0x3f7fffff
    (LLVM's constant folding of llvm.amdgcn.fract: fmin(x - floor(x), 0x1.fffffep-1))."""
    x = np.full(64, -1e-10, np.float32)
    x[1], x[2] = -3.0, 7.25
    out = run_snippet("  v_fract_f32 v2, v1\n", vgprs={1: u32(x)}, outputs=["v2"])
    assert out["v2"][0] == 0x3F7FFFFF
    assert f32(out["v2"][1]) == 0.0 and f32(out["v2"][2]) == 0.25


@pytest.mark.parametrize("denorm", [0, 3])
def test_f32_denormal_mode(denorm):
    """MODE.FP_DENORM for f32: 0 flushes denormal inputs and results to (signed) zero, 3 keeps
    them; v_mov_b32 moves bits untouched either way."""
    r = np.random.default_rng(1100 + denorm)
    tiny = (r.uniform(0.1, 0.9, 64) * TINY * np.where(r.random(64) < 0.5, -1, 1)).astype(np.float32)
    small = (r.uniform(1.0, 2.0, 64) * 2.0 ** -70).astype(np.float32)
    body = ("  v_add_f32 v10, v1, v3\n  v_mul_f32 v11, v2, v2\n  v_mov_b32 v12, v1\n"
            "  v_fma_f32 v13, v1, 1.0, v3\n  v_max_f32 v14, v1, v1\n")
    zero = np.zeros(64, np.float32)
    out = run_snippet(body, vgprs={1: u32(tiny), 2: u32(small), 3: u32(zero)},
                      outputs=["v10", "v11", "v12", "v13", "v14"], denorm=denorm)
    keep = denorm == 3
    for lane in range(64):
        t = flush(tiny[lane], keep)                  # the input as the ALU sees it
        assert out["v10"][lane] == u32(t + np.float32(0.0)), lane       # t + (+0): exact
        assert out["v13"][lane] == u32(t + np.float32(0.0)), lane       # fma(t, 1, +0)
        assert out["v14"][lane] == u32(t), lane
        # small^2 ~ 2^-140 is a denormal: kept (one RNE rounding of the exact product) or flushed
        sq = np.float32(float(Q(small[lane]) ** 2)) if keep else np.float32(0.0)
        assert out["v11"][lane] == u32(sq), lane
        assert out["v12"][lane] == u32(tiny[lane]), lane                # v_mov moves bits


# ------------------------------------------------------------- integer ops
def perm_byte(a, b, sel):
    data = (a << 32) | b
    if sel >= 13:
        return 0xFF
    if sel == 12:
        return 0
    if sel >= 8:
        return 0xFF if (data >> (16 * (sel - 8) + 15)) & 1 else 0
    return (data >> (8 * sel)) & 0xFF


def perm(a, b, s):
    return sum(perm_byte(a, b, (s >> (8 * i)) & 0xFF) << (8 * i) for i in range(4))


def bfe(x, off, width, signed):
    off, width = off & 31, width & 31
    v = (x >> off) & ((1 << width) - 1)
    return sx(v, width) if signed and width else v


def u24(x):
    return x & 0xFFFFFF


INT_OPS = [
    ("v_add_u32 v{d}, v1, v2", lambda a, b, c: a + b),
    ("v_sub_u32 v{d}, v1, v2", lambda a, b, c: a - b),
    ("v_subrev_u32 v{d}, v1, v2", lambda a, b, c: b - a),
    ("v_add3_u32 v{d}, v1, v2, v3", lambda a, b, c: a + b + c),
    ("v_mul_lo_u32 v{d}, v1, v2", lambda a, b, c: a * b),
    ("v_mul_hi_u32 v{d}, v1, v2", lambda a, b, c: (a * b) >> 32),
    ("v_mul_hi_i32 v{d}, v1, v2", lambda a, b, c: (sx(a) * sx(b)) >> 32),
    ("v_mul_u32_u24 v{d}, v1, v2", lambda a, b, c: u24(a) * u24(b)),
    ("v_mul_hi_u32_u24 v{d}, v1, v2", lambda a, b, c: (u24(a) * u24(b)) >> 32),
    ("v_mul_i32_i24 v{d}, v1, v2", lambda a, b, c: sx(a, 24) * sx(b, 24)),
    ("v_mul_hi_i32_i24 v{d}, v1, v2", lambda a, b, c: (sx(a, 24) * sx(b, 24)) >> 32),
    ("v_mad_u32_u24 v{d}, v1, v2, v3", lambda a, b, c: u24(a) * u24(b) + c),
    ("v_lshlrev_b32 v{d}, v1, v2", lambda a, b, c: b << (a & 31)),
    ("v_lshrrev_b32 v{d}, v1, v2", lambda a, b, c: b >> (a & 31)),
    ("v_ashrrev_i32 v{d}, v1, v2", lambda a, b, c: sx(b) >> (a & 31)),
    ("v_lshl_add_u32 v{d}, v2, v1, v3", lambda a, b, c: (b << (a & 31)) + c),
    ("v_lshl_or_b32 v{d}, v2, v1, v3", lambda a, b, c: ((b << (a & 31)) & M32) | c),
    ("v_add_lshl_u32 v{d}, v2, v3, v1", lambda a, b, c: ((b + c) & M32) << (a & 31)),
    ("v_and_or_b32 v{d}, v1, v2, v3", lambda a, b, c: (a & b) | c),
    ("v_or3_b32 v{d}, v1, v2, v3", lambda a, b, c: a | b | c),
    ("v_xad_u32 v{d}, v1, v2, v3", lambda a, b, c: (a ^ b) + c),
    ("v_not_b32 v{d}, v1", lambda a, b, c: ~a),
    ("v_bfe_u32 v{d}, v1, v2, v3", lambda a, b, c: bfe(a, b, c, False)),
    ("v_bfe_i32 v{d}, v1, v2, v3", lambda a, b, c: bfe(a, b, c, True)),
    ("v_bfi_b32 v{d}, v1, v2, v3", lambda a, b, c: (a & b) | (~a & c)),
    ("v_bfm_b32 v{d}, v1, v2", lambda a, b, c: ((1 << (a & 31)) - 1) << (b & 31)),
    ("v_alignbit_b32 v{d}, v1, v2, v3", lambda a, b, c: ((a << 32 | b) >> (c & 31))),
    ("v_alignbyte_b32 v{d}, v1, v2, v3", lambda a, b, c: ((a << 32 | b) >> (8 * (c & 3)))),
    ("v_perm_b32 v{d}, v1, v2, v4", None),
    ("v_min_i32 v{d}, v1, v2", lambda a, b, c: min(sx(a), sx(b))),
    ("v_max_u32 v{d}, v1, v2", lambda a, b, c: max(a, b)),
    ("v_min3_u32 v{d}, v1, v2, v3", lambda a, b, c: min(a, b, c)),
    ("v_max3_i32 v{d}, v1, v2, v3", lambda a, b, c: max(sx(a), sx(b), sx(c))),
    ("v_med3_i32 v{d}, v1, v2, v3", lambda a, b, c: sorted([sx(a), sx(b), sx(c)])[1]),
    ("v_med3_u32 v{d}, v1, v2, v3", lambda a, b, c: sorted([a, b, c])[1]),
    ("v_bcnt_u32_b32 v{d}, v1, v2", lambda a, b, c: bin(a).count("1") + b),
    ("v_cvt_f32_u32 v{d}, v1", lambda a, b, c: int(u32(round_f32(Q(a))))),
    ("v_cvt_f32_i32 v{d}, v1", lambda a, b, c: int(u32(round_f32(Fraction(sx(a)))))),
    ("v_cvt_f32_ubyte2 v{d}, v1", lambda a, b, c: int(u32(np.float32((a >> 16) & 0xFF)))),
]


@pytest.mark.parametrize("seed", [1, 2])
def test_integer_ops(seed):
    r = np.random.default_rng(1200 + seed)
    a, b, c = rand_u32(r), rand_u32(r), rand_u32(r)
    a[:3] = [0, M32, 0x80000000]
    sel = np.array([int.from_bytes(bytes(r.integers(0, 16, 4).astype(np.uint8)), "little") for _ in range(64)],
                   np.uint32)
    body = "\n".join("  " + asm.format(d=10 + k) for k, (asm, _) in enumerate(INT_OPS)) + "\n"
    out = run_snippet(body, vgprs={1: a, 2: b, 3: c, 4: sel}, outputs=[f"v{10 + k}" for k in range(len(INT_OPS))])
    for k, (asm, ref) in enumerate(INT_OPS):
        for lane in range(64):
            x, y, z = int(a[lane]), int(b[lane]), int(c[lane])
            want = perm(x, y, int(sel[lane])) if ref is None else ref(x, y, z)
            assert int(out[f"v{10 + k}"][lane]) == want & M32, (asm, lane, hex(x), hex(y), hex(z))


def test_cvt_f32_to_int_saturates():
    vals = np.array([1.5, -1.5, 3e9, 5e9, -3e9, np.nan, np.inf, -np.inf, 2.9999, -0.9] * 7, np.float32)[:64]
    out = run_snippet("  v_cvt_u32_f32 v2, v1\n  v_cvt_i32_f32 v3, v1\n", vgprs={1: u32(vals)}, outputs=["v2", "v3"])
    for lane, x in enumerate(vals):
        t = 0 if np.isnan(x) else (np.sign(x) * np.inf if np.isinf(x) else int(x))
        assert int(out["v2"][lane]) == int(min(max(t, 0), M32)), (lane, x)
        assert int(out["v3"][lane]) == int(min(max(t, -2**31), 2**31 - 1)) & M32, (lane, x)


def test_exec_limits_writes():
    r = np.random.default_rng(1300)
    a, old = rand_u32(r), rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    out = run_snippet("  s_mov_b64 exec, s[10:11]\n  v_xor_b32 v2, v1, v2\n  s_mov_b64 exec, -1\n",
                      vgprs={1: a, 2: old}, sgprs={10: mask & M32, 11: mask >> 32}, outputs=["v2"])
    for lane in range(64):
        want = int(a[lane]) ^ int(old[lane]) if (mask >> lane) & 1 else int(old[lane])
        assert int(out["v2"][lane]) == want


# ------------------------------------------------------ carries and cndmask
CARRY_BODY = """
  v_add_co_u32 v10, vcc, v1, v2
  v_addc_co_u32 v11, vcc, v3, v4, vcc
  s_mov_b64 s[40:41], vcc
  v_sub_co_u32_e64 v12, s[30:31], v1, v2
  v_subb_co_u32_e64 v13, s[32:33], v3, v4, s[30:31]
  v_subrev_co_u32_e64 v14, s[34:35], v1, v2
  v_subbrev_co_u32_e64 v15, s[36:37], v3, v4, s[34:35]
  v_add_co_u32_e64 v16, s[38:39], v1, v2
  s_nop 1
  v_cndmask_b32 v17, v1, v2, vcc
  v_cndmask_b32_e64 v18, v1, v2, s[38:39]
  v_cndmask_b32_e64 v19, -v1, |v2|, s[32:33]
"""


def test_carry_ops_and_cndmask():
    r = np.random.default_rng(1400)
    a, b, c, d = (rand_u32(r) for _ in range(4))
    b[:4] = [0, M32, int(a[2]), 1]
    mask = int(r.integers(0, 2**64, dtype=np.uint64)) | 0xF
    outs = [f"v{k}" for k in range(10, 20)] + [f"s{k}" for k in range(30, 42)]
    body = "  s_mov_b64 exec, s[20:21]\n" + CARRY_BODY + "  s_mov_b64 exec, -1\n"
    zero = np.zeros(64, np.uint32)
    out = run_snippet(body, vgprs={1: a, 2: b, 3: c, 4: d, **{k: zero for k in range(10, 20)}},
                      sgprs={20: mask & M32, 21: mask >> 32}, outputs=outs)
    bits = {k: 0 for k in ("c0", "c1", "s0", "s1", "r0", "r1", "a2")}
    for lane in range(64):
        x, y, z, w = int(a[lane]), int(b[lane]), int(c[lane]), int(d[lane])
        if not (mask >> lane) & 1:
            assert all(out[f"v{k}"][lane] == 0 for k in range(10, 20))
            continue
        s0 = x + y
        s1 = z + w + (s0 >> 32)
        d0 = x - y
        d1 = z - w - int(d0 < 0)
        r0 = y - x
        r1 = w - z - int(r0 < 0)
        got = [int(out[f"v{k}"][lane]) for k in range(10, 17)]
        assert got == [s0 & M32, s1 & M32, d0 & M32, d1 & M32, r0 & M32, r1 & M32, s0 & M32], lane
        for key, cond in (("c0", s0 >> 32), ("c1", s1 >> 32), ("s0", d0 < 0), ("s1", d1 < 0), ("r0", r0 < 0),
                          ("r1", r1 < 0), ("a2", s0 >> 32)):
            bits[key] |= int(bool(cond)) << lane
        assert int(out["v17"][lane]) == (y if (s1 >> 32) else x)
        assert int(out["v18"][lane]) == (y if (s0 >> 32) else x)
        want19 = u32(abs(f32(y))) if d1 < 0 else u32(-f32(x))
        assert int(out["v19"][lane]) == int(want19), lane

    def pair(k):
        return int(out[f"s{k}"]) | int(out[f"s{k + 1}"]) << 32
    assert pair(40) == bits["c1"]                   # vcc after v_addc_co_u32
    assert pair(30) == bits["s0"] and pair(32) == bits["s1"]
    assert pair(34) == bits["r0"] and pair(36) == bits["r1"]
    assert pair(38) == bits["a2"]


# ---------------------------------------------------------------- compares
CMP_F = {"lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "le": lambda a, b: a <= b,
         "gt": lambda a, b: a > b, "lg": lambda a, b: a < b or a > b, "ge": lambda a, b: a >= b,
         "o": lambda a, b: not (np.isnan(a) or np.isnan(b)), "u": lambda a, b: np.isnan(a) or np.isnan(b),
         "nge": lambda a, b: not a >= b, "nlg": lambda a, b: not (a < b or a > b), "ngt": lambda a, b: not a > b,
         "nle": lambda a, b: not a <= b, "neq": lambda a, b: not a == b, "nlt": lambda a, b: not a < b}
CMP_I = {"lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "le": lambda a, b: a <= b,
         "gt": lambda a, b: a > b, "ne": lambda a, b: a != b, "ge": lambda a, b: a >= b}


def test_compares_write_vcc_and_sgpr_pairs():
    r = np.random.default_rng(1500)
    fa, fb = rand_f32(r, spread=2), rand_f32(r, spread=2)
    fb[:8] = fa[:8]
    fa[8:12] = np.nan
    fb[14] = np.nan
    ia, ib = rand_u32(r), rand_u32(r)
    ib[:6] = ia[:6]
    ia[6:10] = [0x80000000, 0x7FFFFFFF, 0, M32]
    lines, checks = [], []
    reg = 30
    for cond, f in CMP_F.items():
        lines.append(f"  v_cmp_{cond}_f32_e64 s[{reg}:{reg + 1}], v1, v2")
        checks.append((reg, lambda l, f=f: f(fa[l], fb[l])))
        reg += 2
    for cond, f in CMP_I.items():
        lines.append(f"  v_cmp_{cond}_i32_e64 s[{reg}:{reg + 1}], v3, v4")
        checks.append((reg, lambda l, f=f: f(sx(int(ia[l])), sx(int(ib[l])))))
        lines.append(f"  v_cmp_{cond}_u32_e64 s[{reg + 2}:{reg + 3}], v3, v4")
        checks.append((reg + 2, lambda l, f=f: f(int(ia[l]), int(ib[l]))))
        reg += 4
    lines.append("  v_cmp_lt_u64_e64 s[%d:%d], v[6:7], v[8:9]" % (reg, reg + 1))
    checks.append((reg, lambda l: (int(ia[l]) | int(ib[l]) << 32) < (int(ib[l]) | int(ia[l]) << 32)))
    lines.append("  v_cmp_gt_i64_e64 s[%d:%d], v[6:7], v[8:9]" % (reg + 2, reg + 3))
    checks.append((reg + 2, lambda l: sx(int(ia[l]) | int(ib[l]) << 32, 64) > sx(int(ib[l]) | int(ia[l]) << 32, 64)))
    lines.append("  v_cmp_gt_f32 vcc, v1, v2\n  s_mov_b64 s[%d:%d], vcc" % (reg + 4, reg + 5))
    checks.append((reg + 4, lambda l: fa[l] > fb[l]))
    outs = [f"s{k}" for reg_, _ in checks for k in (reg_, reg_ + 1)]
    with np.errstate(invalid="ignore"):
        out = run_snippet("\n".join(lines) + "\n", vgprs={1: u32(fa), 2: u32(fb), 3: ia, 4: ib, 6: ia, 7: ib, 8: ib, 9: ia},
                          outputs=outs)
        for reg_, f in checks:
            want = sum(int(bool(f(l))) << l for l in range(64))
            assert int(out[f"s{reg_}"]) | int(out[f"s{reg_ + 1}"]) << 32 == want, reg_


def test_cmpx_writes_exec_and_sdst_and_inactive_lanes_read_zero():
    r = np.random.default_rng(1600)
    a, b, old = rand_u32(r), rand_u32(r), rand_u32(r)
    mask = int(r.integers(0, 2**64, dtype=np.uint64))
    body = ("  s_mov_b64 exec, s[10:11]\n  v_cmpx_gt_u32_e64 s[20:21], v1, v2\n  s_mov_b64 s[22:23], exec\n"
            "  s_nop 4\n  v_mov_b32 v3, v1\n  v_cmp_lt_u32 vcc, v1, v2\n  s_mov_b64 s[24:25], vcc\n"
            "  s_mov_b64 exec, -1\n")
    out = run_snippet(body, vgprs={1: a, 2: b, 3: old}, sgprs={10: mask & M32, 11: mask >> 32},
                      outputs=["s20", "s21", "s22", "s23", "s24", "s25", "v3"])
    gt = sum(int(int(a[l]) > int(b[l])) << l for l in range(64)) & mask
    lt = sum(int(int(a[l]) < int(b[l])) << l for l in range(64)) & gt      # only lanes still active
    assert int(out["s20"]) | int(out["s21"]) << 32 == gt
    assert int(out["s22"]) | int(out["s23"]) << 32 == gt
    assert int(out["s24"]) | int(out["s25"]) << 32 == lt
    for lane in range(64):
        assert out["v3"][lane] == (a[lane] if (gt >> lane) & 1 else old[lane])


def test_cmp_class_f32():
    vals = np.array([np.nan, -np.inf, -1.5, -1e-40, -0.0, 0.0, 1e-40, 2.5, np.inf] * 8, np.float32)[:64]
    bits = u32(vals).copy()
    bits[0] = 0x7F800001                         # signalling NaN (quiet bit clear)
    r = np.random.default_rng(1700)
    classes = r.integers(0, 1024, 64).astype(np.uint32)
    out = run_snippet("  v_cmp_class_f32_e64 s[20:21], v1, v2\n", vgprs={1: bits, 2: classes},
                      outputs=["s20", "s21"])
    names = ["snan", "qnan", "-inf", "-norm", "-den", "-0", "+0", "+den", "+norm", "+inf"]
    want = 0
    for l in range(64):
        x, b = f32(bits[l]), int(bits[l])
        if np.isnan(x):
            cls = "snan" if not (b >> 22) & 1 else "qnan"
        elif np.isinf(x):
            cls = "-inf" if x < 0 else "+inf"
        elif x == 0:
            cls = "-0" if b >> 31 else "+0"
        else:
            cls = ("-" if x < 0 else "+") + ("den" if abs(x) < TINY else "norm")
        want |= ((int(classes[l]) >> names.index(cls)) & 1) << l
    assert int(out["s20"]) | int(out["s21"]) << 32 == want


# ------------------------------------------------------------- lane access
def test_readlane_readfirstlane_writelane_mbcnt():
    r = np.random.default_rng(1800)
    a, old = rand_u32(r), rand_u32(r)
    lane_sel, value = int(r.integers(0, 64)), int(r.integers(0, 2**32))
    mask = int(r.integers(0, 2**64, dtype=np.uint64)) & ~0x7          # first active lane >= 3
    body = ("  s_mov_b64 exec, s[12:13]\n  v_readfirstlane_b32 s20, v1\n  v_readlane_b32 s21, v1, s10\n"
            "  v_writelane_b32 v2, s11, 37\n  v_mbcnt_lo_u32_b32 v3, s14, 5\n  v_mbcnt_hi_u32_b32 v4, s15, v3\n"
            "  s_mov_b64 exec, -1\n")
    m = int(r.integers(0, 2**64, dtype=np.uint64))
    out = run_snippet(body, vgprs={1: a, 2: old, 3: old, 4: old},
                      sgprs={10: lane_sel, 11: value, 12: mask & M32, 13: mask >> 32, 14: m & M32, 15: m >> 32},
                      outputs=["s20", "s21", "v2", "v3", "v4"])
    first = (mask & -mask).bit_length() - 1
    assert int(out["s20"]) == a[first]
    assert int(out["s21"]) == a[lane_sel]            # readlane ignores EXEC
    for l in range(64):
        assert int(out["v2"][l]) == (value if l == 37 else int(old[l]))   # writelane ignores EXEC
        below = m & ((1 << l) - 1)
        if (mask >> l) & 1:
            assert int(out["v3"][l]) == bin(below & M32).count("1") + 5, l
            assert int(out["v4"][l]) == bin(below).count("1") + 5, l
        else:
            assert out["v3"][l] == old[l] and out["v4"][l] == old[l]


def test_readlane_needs_a_wait_state_after_valu_write():
    body = "  v_mov_b32 v2, v1\n  {nop}\n  v_readfirstlane_b32 s20, v2\n"
    with pytest.raises(HazardError, match="1 are required"):
        run_snippet(body.format(nop=""), vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])
    run_snippet(body.format(nop="s_nop 0"), vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])


# ----------------------------------------------------------- strictness
@pytest.mark.parametrize("asm", ["v_mov_b32_sdwa v2, v1 dst_sel:WORD_1 dst_unused:UNUSED_PAD src0_sel:BYTE_0",
                                 "v_add_u32_sdwa v2, v1, v1 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:BYTE_1 "
                                 "src1_sel:DWORD",
                                 "v_add_u32_e64 v2, v1, v1 clamp"])
def test_unmodelled_forms_rejected(asm):
    """Regression: SDWA selects and integer clamp were silently ignored."""
    with pytest.raises(UnsupportedInstruction):
        run_snippet(f"  {asm}\n", vgprs={1: np.arange(64, dtype=np.uint32)}, outputs=[])


def test_trans_result_needs_a_wait_state():
    body = "  v_exp_f32 v2, v1\n  {nop}\n  v_add_f32 v3, v2, v2\n"
    with pytest.raises(HazardError, match="transcendental"):
        run_snippet(body.format(nop=""), vgprs={1: u32(np.ones(64, np.float32))}, outputs=[])
    run_snippet(body.format(nop="s_nop 0"), vgprs={1: u32(np.ones(64, np.float32))}, outputs=[])

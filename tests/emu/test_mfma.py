"""Known-answer tests for the MFMA family (loader/emu/families/mfma.py).

Expected results are computed here with numpy/torch from the lane layouts of the fact
sheet (../shared/docs/gfx950-isa-facts.md §2), restated independently below, and from
AMD's hardware probe dumps (tests/emu/data/ck_scale_mapping_*.txt) — never from the
emulator's own output. Inputs are fresh seeded random values (never all zeros).
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from gfxasm.emu.errors import HazardError, UnsupportedInstruction
from asm_harness import run_snippet
from mfma_batch import run_batch

DATA = Path(__file__).parent / "data"


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())

# ----------------------------------------------------------------------------------
# reference layouts (fact sheet §2), written out independently of the emulator
# ----------------------------------------------------------------------------------


def k_of(name: str, lane: int, e: int) -> int:
    """K index held by element e (16-bit half / 8-bit byte, in register order) of lane."""
    if "16x16x64" in name:                    # i8 (4 VGPRs): any K order shared by A and B
        return 16 * (lane // 16) + e          # gives the same exact integer sum
    if "32x32x32" in name:
        return 16 * (lane // 32) + e
    if "16x16x128" in name:
        return 16 * (lane // 16) + e % 16 + 64 * (e // 16)
    if "32x32x64" in name:
        return 16 * (lane // 32) + e % 16 + 32 * (e // 16)
    if "16x16x32" in name:                    # bf16/f16 and fp8/bf8 alike
        return 8 * (lane // 16) + e
    if "32x32x16" in name:
        return 8 * (lane // 32) + e
    if "16x16x16" in name:
        return 4 * (lane // 16) + e
    if "32x32x8" in name:
        return 4 * (lane // 32) + e
    raise ValueError(name)


def shape_of(name: str) -> tuple[int, int]:
    for m, k in ((16, 128), (32, 64), (16, 64), (32, 32), (16, 32), (32, 16), (16, 16), (32, 8)):
        if f"{m}x{m}x{k}" in name:
            return m, k
    raise ValueError(name)


def k_of_fp4(name: str, lane: int, t: int) -> int:
    """f8f6f4 with FP4 operands: nibble t of lane holds k = 32 * (lane / M) + t."""
    return 32 * (lane // shape_of(name)[0]) + t


def pack_operand(name: str, codes: np.ndarray, bits: int, k_fn=k_of) -> np.ndarray:
    """codes[M, K] (A; pass B transposed) -> uint32[R, 64] operand registers."""
    m, k = codes.shape
    per_reg = 32 // bits
    per_lane = (k * m) // 64
    regs = np.zeros((per_lane // per_reg, 64), np.uint64)
    for lane in range(64):
        for e in range(per_lane):
            code = int(codes[lane % m, k_fn(name, lane, e)])
            regs[e // per_reg, lane] |= np.uint64(code << (bits * (e % per_reg)))
    return regs.astype(np.uint32)


def d_position(m: int, r: int, lane: int) -> tuple[int, int]:
    if m == 16:
        return 4 * (lane // 16) + r, lane % 16
    return 8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32


def pack_c(c: np.ndarray, dtype=np.float32) -> np.ndarray:
    """C[M, M] as f32 (or i32: dtype np.int32) register bits [R, 64]."""
    m = c.shape[0]
    regs = np.zeros((4 if m == 16 else 16, 64), dtype)
    for r in range(regs.shape[0]):
        for lane in range(64):
            regs[r, lane] = c[d_position(m, r, lane)]
    return regs.view(np.uint32)


def unpack_d(regs: np.ndarray, dtype=np.float32) -> np.ndarray:
    """D[M, M] from f32 (or i32: dtype np.int32) register bits [R, 64]."""
    m = 16 if regs.shape[0] == 4 else 32
    d = np.full((m, m), np.nan, np.float32) if dtype == np.float32 else np.zeros((m, m), np.int64)
    f = regs.view(dtype)
    for r in range(regs.shape[0]):
        for lane in range(64):
            d[d_position(m, r, lane)] = f[r, lane]
    return d


# ----------------------------------------------------------------------------------
# random operands: codes plus their values, decoded with torch (not the emulator)
# ----------------------------------------------------------------------------------

def random_16bit(rng, shape, fmt):
    """Values (1 + m/128) * 2**e * sign, e in [-4, 3]: exactly representable in bf16 and
    f16, and every dot product of them is exact in float64."""
    mant = rng.integers(0, 128, shape)
    exp = rng.integers(-4, 4, shape)
    sign = rng.choice([-1.0, 1.0], shape)
    vals = (sign * (1 + mant / 128) * np.exp2(exp)).astype(np.float32)
    if fmt == "bf16":
        codes = (torch.from_numpy(vals).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    else:
        codes = vals.astype(np.float16).view(np.uint16)
    return codes, vals.astype(np.float64)


def decode_fp8(codes, fmt):
    dt = torch.float8_e4m3fn if fmt == "fp8" else torch.float8_e5m2
    return torch.from_numpy(np.ascontiguousarray(codes, np.uint8)).view(dt).to(torch.float64).numpy()


def random_fp8(rng, shape, fmt):
    """Random finite fp8/bf8 codes (all signs, exponents and mantissas; bf8 exponents kept
    within 2**-7..2**7 so that block sums stay exact in float64). No zeros-only blocks."""
    if fmt == "fp8":
        codes = rng.integers(0, 256, shape).astype(np.uint8)
        codes = np.where((codes & 0x7F) == 0x7F, codes ^ 0x01, codes).astype(np.uint8)  # no NaN
    else:
        exp = rng.integers(8, 23, shape)
        codes = ((rng.integers(0, 2, shape) << 7) | (exp << 2) | rng.integers(0, 4, shape)).astype(np.uint8)
    return codes, decode_fp8(codes, fmt)


def random_c(rng, m):
    return (rng.integers(-64, 64, (m, m)) / 8).astype(np.float32)


# ----------------------------------------------------------------------------------
# one case: registers in, expected D out
# ----------------------------------------------------------------------------------

class Case:
    """A, B, C of one MFMA, packed for given register placement."""

    def __init__(self, name, a_fmt, b_fmt, rng, c_zero=False):
        self.name = name
        m, k = shape_of(name)
        self.m, self.k = m, k
        gen = random_16bit if a_fmt in ("bf16", "f16") else random_fp8
        bits = 16 if a_fmt in ("bf16", "f16") else 8
        ac, self.a = gen(rng, (m, k), a_fmt)
        bc, self.b = gen(rng, (k, m), b_fmt)       # B[k][j]
        self.a_regs = pack_operand(name, ac, bits)
        self.b_regs = pack_operand(name, bc.T, bits)
        self.c = np.zeros((m, m), np.float32) if c_zero else random_c(rng, m)
        self.c_regs = pack_c(self.c)

    def expected(self, scale_a=None, scale_b=None):
        """D = C + sum over 32-blocks b of 2^(sa-127) 2^(sb-127) * block dot; float64, one rounding."""
        if scale_a is None:
            return (self.c.astype(np.float64) + self.a @ self.b).astype(np.float32)
        total = self.c.astype(np.float64)
        for blk in range(self.k // 32):
            ks = slice(32 * blk, 32 * blk + 32)
            fa = np.exp2(scale_a[:, blk].astype(np.float64) - 127)[:, None]
            fb = np.exp2(scale_b[:, blk].astype(np.float64) - 127)[None, :]
            total = total + fa * fb * (self.a[:, ks] @ self.b[ks, :])
        return total.astype(np.float32)


def place(kind: str, base: int, regs: np.ndarray):
    return [(kind, base + r) for r in range(regs.shape[0])], list(regs)


def reg_text(kind, base, count):
    return f"{kind}[{base}:{base + count - 1}]"


def run_cases(name, cases, *, a_kind="v", b_kind="v", cd_kind="v", c_zero=False, extra_mods="",
              scale_regs=None):
    """Run every case in its own wave; returns D matrices."""
    first = cases[0]
    na, nc = first.a_regs.shape[0], first.c_regs.shape[0]
    a_base, b_base, c_base, d_base = 0, 16, 32, 64
    inputs, data = [], [[] for _ in cases]
    for kind, base, attr in ((a_kind, a_base, "a_regs"), (b_kind, b_base, "b_regs")):
        inputs += [(kind, base + r) for r in range(na)]
        for n, c in enumerate(cases):
            data[n] += list(getattr(c, attr))
    if not c_zero:
        inputs += [(cd_kind, c_base + r) for r in range(nc)]
        for n, c in enumerate(cases):
            data[n] += list(c.c_regs)
    ops = f"{reg_text(cd_kind, d_base, nc)}, {reg_text(a_kind, a_base, na)}, {reg_text(b_kind, b_base, na)}, "
    ops += "0" if c_zero else reg_text(cd_kind, c_base, nc)
    if scale_regs is not None:
        inputs += [("v", 100), ("v", 101)]
        for n in range(len(cases)):
            data[n] += [scale_regs[n][0], scale_regs[n][1]]
        ops += ", v100, v101"
    body = f"  {name} {ops} {extra_mods}".rstrip()
    out = run_batch(body, inputs, np.array(data, np.uint32), [(cd_kind, d_base + r) for r in range(nc)])
    return [unpack_d(out[n]) for n in range(len(cases))]


DENSE_16BIT = [f"v_mfma_f32_{s}_{t}" for s in ("16x16x32", "32x32x16", "16x16x16", "32x32x8")
               for t in ("bf16", "f16")]
PLACEMENTS = [("v", "v", "v"), ("a", "v", "a"), ("v", "a", "v"), ("a", "a", "a")]


@pytest.mark.parametrize("name", DENSE_16BIT)
@pytest.mark.parametrize("placement", PLACEMENTS, ids=lambda p: "A%s_B%s_CD%s" % p)
def test_dense_16bit(name, placement):
    fmt = name.rsplit("_", 1)[1]
    rng = np.random.default_rng(seed((name, placement)))
    cases = [Case(name, fmt, fmt, rng) for _ in range(3)]
    a_kind, b_kind, cd_kind = placement
    got = run_cases(name, cases, a_kind=a_kind, b_kind=b_kind, cd_kind=cd_kind)
    for c, d in zip(cases, got):
        np.testing.assert_array_equal(d, c.expected())      # exact: the inputs make every sum exact


@pytest.mark.parametrize("name", ["v_mfma_f32_16x16x32_bf16", "v_mfma_f32_32x32x8_f16",
                                  "v_mfma_f32_32x32x16_fp8_bf8"])
@pytest.mark.parametrize("cd_kind", ["v", "a"])
def test_srcc_inline_zero(name, cd_kind):
    a_fmt, b_fmt = (("fp8", "bf8") if "fp8" in name else (name.rsplit("_", 1)[1],) * 2)
    rng = np.random.default_rng(7)
    cases = [Case(name, a_fmt, b_fmt, rng, c_zero=True) for _ in range(2)]
    got = run_cases(name, cases, cd_kind=cd_kind, c_zero=True)
    for c, d in zip(cases, got):
        np.testing.assert_array_equal(d, c.expected())


FP8_NAMES = [f"v_mfma_f32_{s}_{a}_{b}" for s in ("16x16x32", "32x32x16") for a in ("fp8", "bf8")
             for b in ("fp8", "bf8")]


@pytest.mark.parametrize("name", FP8_NAMES)
def test_dense_fp8(name):
    a_fmt, b_fmt = name.split("_")[-2:]
    rng = np.random.default_rng(seed(name))
    cases = [Case(name, a_fmt, b_fmt, rng) for _ in range(3)]
    got = run_cases(name, cases, a_kind="a", b_kind="v", cd_kind="v")
    for c, d in zip(cases, got):
        np.testing.assert_array_equal(d, c.expected())


F8F6F4 = ["v_mfma_f32_16x16x128_f8f6f4", "v_mfma_f32_32x32x64_f8f6f4"]
FORMAT_CODE = {"fp8": 0, "bf8": 1}


@pytest.mark.parametrize("name", F8F6F4)
@pytest.mark.parametrize("fmts", [("fp8", "fp8"), ("bf8", "fp8"), ("fp8", "bf8"), ("bf8", "bf8")])
def test_f8f6f4_unscaled(name, fmts):
    rng = np.random.default_rng(seed((name, fmts)))
    cases = [Case(name, *fmts, rng) for _ in range(3)]
    mods = f"cbsz:{FORMAT_CODE[fmts[0]]} blgp:{FORMAT_CODE[fmts[1]]}"
    got = run_cases(name, cases, a_kind="v", b_kind="a", cd_kind="a", extra_mods=mods)
    for c, d in zip(cases, got):
        np.testing.assert_allclose(d, c.expected(), rtol=2e-7, atol=0)


def scale_registers(rng, m, k, byte_a, byte_b):
    """Non-uniform random E8M0 scales per (row, 32-block) for A and B, placed in lane
    i + M*b at the selected byte; every other byte holds junk."""
    nb = k // 32
    sa = rng.integers(118, 137, (m, nb)).astype(np.uint8)
    sb = rng.integers(118, 137, (m, nb)).astype(np.uint8)
    regs = rng.integers(0, 2**32, (2, 64), dtype=np.uint64).astype(np.uint32)
    for which, scales, byte in ((0, sa, byte_a), (1, sb, byte_b)):
        for lane in range(64):
            i, blk = lane % m, lane // m
            if blk < nb:
                word = int(regs[which, lane]) & ~(0xFF << (8 * byte))
                regs[which, lane] = word | (int(scales[i, blk]) << (8 * byte))
    return sa, sb, regs


SCALED = ["v_mfma_scale_f32_16x16x128_f8f6f4", "v_mfma_scale_f32_32x32x64_f8f6f4"]


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("fmts", [("fp8", "fp8"), ("bf8", "fp8"), ("fp8", "bf8"), ("bf8", "bf8")])
@pytest.mark.parametrize("bytes_", [(0, 0), (1, 2), (3, 1), (2, 3)])
def test_f8f6f4_scaled(name, fmts, bytes_):
    rng = np.random.default_rng(seed((name, fmts, bytes_)))
    m, k = shape_of(name)
    cases, scales, regs = [], [], []
    for _ in range(3):
        cases.append(Case(name, *fmts, rng))
        sa, sb, sr = scale_registers(rng, m, k, *bytes_)
        scales.append((sa, sb))
        regs.append(sr)
    (ba, bb) = bytes_
    mods = (f"op_sel:[{ba & 1},{bb & 1},0] op_sel_hi:[{ba >> 1},{bb >> 1},0] "
            f"cbsz:{FORMAT_CODE[fmts[0]]} blgp:{FORMAT_CODE[fmts[1]]}")
    got = run_cases(name, cases, a_kind="a", b_kind="v", cd_kind="v", extra_mods=mods, scale_regs=regs)
    for c, (sa, sb), d in zip(cases, scales, got):
        np.testing.assert_allclose(d, c.expected(sa, sb), rtol=2e-7, atol=0)


def test_scaled_k_order_is_not_contiguous():
    """The K order pinned above is distinguishable: under the rejected reading (32
    contiguous K per lane, IREE) the same registers give a different D."""
    name = "v_mfma_scale_f32_32x32x64_f8f6f4"
    rng = np.random.default_rng(99)
    c = Case(name, "fp8", "fp8", rng)
    sa, sb, sr = scale_registers(rng, 32, 64, 0, 0)
    d = run_cases(name, [c], extra_mods="op_sel_hi:[0,0,0]", scale_regs=[sr])[0]
    np.testing.assert_allclose(d, c.expected(sa, sb), rtol=2e-7)
    # Re-read the same A/B registers with the contiguous mapping k = 32*(l/32) + t.
    a_alt = np.zeros((32, 64))
    b_alt = np.zeros((64, 32))
    for lane in range(64):
        for t in range(32):
            a_alt[lane % 32, 32 * (lane // 32) + t] = c.a[lane % 32, k_of(name, lane, t)]
            b_alt[32 * (lane // 32) + t, lane % 32] = c.b[k_of(name, lane, t), lane % 32]
    alt = Case.__new__(Case)
    alt.__dict__.update(c.__dict__, a=a_alt, b=b_alt)
    assert not np.allclose(d, alt.expected(sa, sb), rtol=1e-3)


# ----------------------------------------------------------------------------------
# AMD's hardware probe (composable_kernel test/mx_mfma_op/scale_mapping_*.txt)
# ----------------------------------------------------------------------------------

def load_probe(path: Path):
    table = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        operand, index, *runs = line.split()
        table[(operand, int(index))] = [int(t) for t in runs]
    return table


E4M3_ONE = 0x38


@pytest.mark.parametrize("name,m,k,data", [
    ("v_mfma_scale_f32_32x32x64_f8f6f4", 32, 64, "ck_scale_mapping_32x32x64.txt"),
    ("v_mfma_scale_f32_16x16x128_f8f6f4", 16, 128, "ck_scale_mapping_16x16x128.txt"),
])
@pytest.mark.parametrize("operand", ["a", "b"])
def test_ck_hardware_scale_probe(name, m, k, data, operand):
    """Replays CK's probe: lane l's scale is 2^l (E8M0 127 + l) for the probed operand and
    1.0 for the other; the probed operand has one 1.0 byte, the other operand's row/col 0
    is all ones. testId T lights lane idx + M*(T/32), byte T%32 (CK's probe code); the
    hardware then printed log2 of D[idx][0] (A) or D[0][idx] (B) = the scaling lane.
    Every index is probed in the same wave (their outputs do not interact)."""
    probe = load_probe(DATA / data)
    ones = np.zeros((8, 64), np.uint32)
    for lane in range(0, 64, m):          # row/column 0 of the other operand: all ones
        ones[:, lane] = 0x38383838
    data_regs, expect = [], []
    for test_id in range(k):
        lit = np.zeros((8, 64), np.uint32)
        for idx in range(m):
            lane = idx + m * (test_id // 32)
            t = test_id % 32
            lit[t // 4, lane] |= np.uint32(E4M3_ONE << (8 * (t % 4)))
        a_regs, b_regs = (lit, ones) if operand == "a" else (ones, lit)
        scale_probe = (127 + np.arange(64)).astype(np.uint32)
        scale_one = np.full(64, 127, np.uint32)
        sa, sb = (scale_probe, scale_one) if operand == "a" else (scale_one, scale_probe)
        data_regs.append(np.concatenate([a_regs, b_regs, sa[None], sb[None]]))
        expect.append([probe[(operand, idx)][test_id // 16] for idx in range(m)])
    nc = 4 if m == 16 else 16
    inputs = [("v", r) for r in range(8)] + [("v", 16 + r) for r in range(8)] + [("v", 100), ("v", 101)]
    body = f"  {name} v[64:{63 + nc}], v[0:7], v[16:23], 0, v100, v101"
    out = run_batch(body, inputs, np.array(data_regs), [("v", 64 + r) for r in range(nc)])
    for test_id in range(k):
        d = unpack_d(out[test_id])
        got = d[:, 0] if operand == "a" else d[0, :]
        np.testing.assert_array_equal(np.log2(got.astype(np.float64)), np.array(expect[test_id], float),
                                      err_msg=f"{operand} testId {test_id}")


def test_probe_data_files_are_complete():
    for data, m, k in (("ck_scale_mapping_32x32x64.txt", 32, 64), ("ck_scale_mapping_16x16x128.txt", 16, 128)):
        probe = load_probe(DATA / data)
        assert sorted(probe) == sorted((op, i) for op in "ab" for i in range(m))
        assert all(len(runs) == k // 16 for runs in probe.values())


# ----------------------------------------------------------------------------------
# rejections
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "v_mfma_f32_16x16x128_f8f6f4 v[0:3], v[4:9], v[12:19], v[0:3] cbsz:2",      # FP6 A
    "v_mfma_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:17], v[0:3] blgp:2",     # FP6 B
    "v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3] cbsz:1 abid:1",   # broadcast
    "v_mfma_f32_32x32x8_f16 v[0:15], v[16:17], v[18:19], v[0:15] blgp:3",       # lane rotate
])
def test_unmodelled_forms_are_rejected(body):
    regs = {r: np.full(64, 0x38383838, np.uint32) for r in range(0, 24)}
    with pytest.raises(UnsupportedInstruction):
        run_snippet(body, vgprs=regs)


def test_partial_exec_is_rejected():
    regs = {r: np.full(64, 0x3F803F80, np.uint32) for r in range(12)}
    with pytest.raises(UnsupportedInstruction, match="EXEC"):
        run_snippet("v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], 0", vgprs=regs,
                    exec_mask=0xFFFF_FFFF_0000_FFFF)


# ----------------------------------------------------------------------------------
# hazards (fact sheet §4): MFMA result -> VALU read needs passes + 4 wait states
# ----------------------------------------------------------------------------------

ONES = {r: np.full(64, 0x3F803F80, np.uint32) for r in range(4, 12)}
ONES_FP8 = {r: np.full(64, 0x38383838, np.uint32) for r in range(4, 20)}
ONES_FP8[20] = ONES_FP8[21] = np.full(64, 127, np.uint32)

HAZARD_CASES = [
    # (mfma text, inputs, required wait states)
    ("v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], 0", ONES, 8),
    ("v_mfma_f32_32x32x16_bf16 v[24:39], v[4:7], v[8:11], 0", ONES, 12),
    ("v_mfma_scale_f32_32x32x64_f8f6f4 v[24:39], v[4:11], v[12:19], 0, v20, v21", ONES_FP8, 20),
    ("v_mfma_f32_16x16x128_f8f6f4 v[24:27], v[4:11], v[12:19], 0", ONES_FP8, 12),
]


def _nops(n: int) -> str:
    out = []
    while n > 0:
        out.append(f"  s_nop {min(n, 16) - 1}")
        n -= min(n, 16)
    return "\n".join(out)


@pytest.mark.parametrize("mfma,inputs,need", HAZARD_CASES, ids=lambda x: str(x)[:40])
def test_mfma_result_read_by_valu_too_early(mfma, inputs, need):
    dst = mfma.split()[1].rstrip(",")
    first = int(dst[2:dst.index(":")])
    body = lambda n: f"  {mfma}\n{_nops(n)}\n  v_mov_b32 v200, v{first}"
    with pytest.raises(HazardError, match="wait states"):
        run_snippet(body(need - 1), vgprs=inputs, outputs=["v200"])
    out = run_snippet(body(need), vgprs=inputs, outputs=["v200"])
    assert out["v200"].view(np.float32)[0] != 0


def test_agpr_result_read_by_accvgpr_read_too_early():
    mfma = "v_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0"
    with pytest.raises(HazardError):
        run_snippet(f"  {mfma}\n  s_nop 6\n  v_accvgpr_read_b32 v200, a2", vgprs=ONES)
    out = run_snippet(f"  {mfma}\n  s_nop 7\n  v_accvgpr_read_b32 v200, a2", vgprs=ONES, outputs=["v200"])
    assert out["v200"].view(np.float32)[0] == 32.0         # K = 32 products 1.0 * 1.0


def test_valu_write_then_mfma_read_needs_two_wait_states():
    body = "  v_mov_b32 v4, 1.0\n{nop}  v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], 0"
    with pytest.raises(HazardError):
        run_snippet(body.format(nop="  s_nop 0\n"), vgprs=ONES)
    run_snippet(body.format(nop="  s_nop 1\n"), vgprs=ONES)


def test_back_to_back_accumulation_in_place_needs_no_wait():
    body = ("  v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], 0\n"
            "  v_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3]")
    out = run_snippet(body, vgprs=ONES, outputs=["v0"])
    assert np.all(out["v0"].view(np.float32) == 64.0)


def test_partially_overlapping_srcc_needs_wait():
    """srcC overlapping an 8-pass MFMA's result without being exactly its registers needs
    P + 2 = 10 wait states (LLVM GFX940_XDL_N_PassWritesVGPROverlappedXDLOrSMFMASrcC)."""
    body = ("  v_mfma_f32_32x32x16_bf16 v[32:47], v[4:7], v[8:11], 0\n{nop}"
            "  v_mfma_f32_16x16x32_bf16 v[20:23], v[4:7], v[8:11], v[32:35]")
    with pytest.raises(HazardError):
        run_snippet(body.format(nop="  s_nop 8\n"), vgprs=ONES)
    run_snippet(body.format(nop="  s_nop 9\n"), vgprs=ONES)


# ----------------------------------------------------------------------------------
# integer MFMAs: signed i8 operands, i32 C/D (exact integer arithmetic)
# ----------------------------------------------------------------------------------

I8_NAMES = ["v_mfma_i32_16x16x32_i8", "v_mfma_i32_32x32x16_i8", "v_mfma_i32_16x16x64_i8",
            "v_mfma_i32_32x32x32_i8"]


@pytest.mark.parametrize("name", I8_NAMES)
def test_dense_i8(name):
    """D = C + A.B over signed bytes (-128..127) with i32 C, both register files."""
    m, k = shape_of(name)
    rng = np.random.default_rng(seed(name))
    cases = []
    for n in range(3):
        a = rng.integers(-128, 128, (m, k))
        b = rng.integers(-128, 128, (k, m))
        if n == 0:                               # extremes: -128 * -128 summed over K
            a[0, :], b[:, 0] = -128, -128
        c = rng.integers(-2**30, 2**30, (m, m))
        cases.append((a, b, c))
    nr = 2 if k * m == 512 else 4
    nc = 4 if m == 16 else 16
    inputs = [("a", r) for r in range(nr)] + [("v", 16 + r) for r in range(nr)] + [("a", 32 + r) for r in range(nc)]
    data = [np.concatenate([pack_operand(name, (a & 0xFF).astype(np.uint8), 8),
                            pack_operand(name, (b.T & 0xFF).astype(np.uint8), 8), pack_c(c, np.int32)])
            for a, b, c in cases]
    body = f"  {name} a[64:{63 + nc}], a[0:{nr - 1}], v[16:{15 + nr}], a[32:{31 + nc}]"
    out = run_batch(body, inputs, np.array(data), [("a", 64 + r) for r in range(nc)])
    for (a, b, c), got in zip(cases, out):
        np.testing.assert_array_equal(unpack_d(got, np.int32), c + a @ b)


def test_i8_overflow_is_rejected():
    """An i32 result out of range (wrap or saturate: unverified) stops the run."""
    ones = np.full(64, 0x7F7F7F7F, np.uint32)
    big = np.full(64, 0x7FFFFFF0, np.uint32)
    with pytest.raises(UnsupportedInstruction, match="overflows"):
        run_snippet("v_mfma_i32_16x16x32_i8 v[0:3], v[4:5], v[6:7], v[8:11]",
                    vgprs={4: ones, 5: ones, 6: ones, 7: ones, 8: big, 9: big, 10: big, 11: big})


# ----------------------------------------------------------------------------------
# f8f6f4 with FP4 (E2M1) operands
# ----------------------------------------------------------------------------------

# OCP MX v1.0 E2M1 value table (sign bit 3): written out here, not taken from the emulator.
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


class Fp4Case(Case):
    """A and/or B in FP4 (the other may stay FP8)."""

    def __init__(self, name, a_fmt, b_fmt, rng):
        m, k = shape_of(name)
        self.name, self.m, self.k = name, m, k
        ops = []
        for fmt, shape in ((a_fmt, (m, k)), (b_fmt, (k, m))):
            if fmt == "fp4":
                codes = rng.integers(0, 16, shape).astype(np.uint8)
                ops.append((codes, E2M1_VALUES[codes], 4, k_of_fp4))
            else:
                codes, vals = random_fp8(rng, shape, fmt)
                ops.append((codes, vals, 8, k_of))
        (ac, self.a, abits, akf), (bc, self.b, bbits, bkf) = ops
        self.a_regs = pack_operand(name, ac, abits, akf)
        self.b_regs = pack_operand(name, bc.T, bbits, bkf)
        self.c = random_c(rng, m)
        self.c_regs = pack_c(self.c)


def run_fp4_cases(name, cases, mods, scale_regs=None):
    first = cases[0]
    na, nb, nc = first.a_regs.shape[0], first.b_regs.shape[0], first.c_regs.shape[0]
    inputs = ([("v", r) for r in range(na)] + [("a", 16 + r) for r in range(nb)]
              + [("v", 32 + r) for r in range(nc)])
    data = [np.concatenate([c.a_regs, c.b_regs, c.c_regs]) for c in cases]
    ops = f"v[64:{63 + nc}], v[0:{na - 1}], a[16:{15 + nb}], v[32:{31 + nc}]"
    if scale_regs is not None:
        inputs += [("v", 100), ("v", 101)]
        data = [np.concatenate([d, s]) for d, s in zip(data, scale_regs)]
        ops += ", v100, v101"
    out = run_batch(f"  {name} {ops} {mods}", inputs, np.array(data), [("v", 64 + r) for r in range(nc)])
    return [unpack_d(o) for o in out]


FP4_FORMATS = {"fp8": 0, "bf8": 1, "fp4": 4}


@pytest.mark.parametrize("name", F8F6F4)
@pytest.mark.parametrize("fmts", [("fp4", "fp4"), ("fp8", "fp4"), ("fp4", "bf8")])
def test_f8f6f4_fp4_unscaled(name, fmts):
    rng = np.random.default_rng(seed((name, fmts, "fp4")))
    cases = [Fp4Case(name, *fmts, rng) for _ in range(3)]
    got = run_fp4_cases(name, cases, f"cbsz:{FP4_FORMATS[fmts[0]]} blgp:{FP4_FORMATS[fmts[1]]}")
    for c, d in zip(cases, got):
        np.testing.assert_allclose(d, c.expected(), rtol=2e-7, atol=0)


@pytest.mark.parametrize("name", SCALED)
def test_f8f6f4_fp4_scaled(name):
    """The corpus form (f4gemm: cbsz:4 blgp:4, 4-VGPR operands) with per-block scales."""
    rng = np.random.default_rng(seed((name, "fp4 scaled")))
    m, k = shape_of(name)
    cases, scales, regs = [], [], []
    for _ in range(3):
        cases.append(Fp4Case(name, "fp4", "fp4", rng))
        sa, sb, sr = scale_registers(rng, m, k, 1, 2)
        scales.append((sa, sb))
        regs.append(sr)
    got = run_fp4_cases(name, cases, "op_sel:[1,0,0] op_sel_hi:[0,1,0] cbsz:4 blgp:4", regs)
    for c, (sa, sb), d in zip(cases, scales, got):
        np.testing.assert_allclose(d, c.expected(sa, sb), rtol=2e-7, atol=0)


@pytest.mark.parametrize("body,need", [
    ("v_mfma_f32_16x16x128_f8f6f4 v[24:27], v[4:7], v[12:15], 0 cbsz:4 blgp:4", 8),      # 4 passes
    ("v_mfma_f32_32x32x64_f8f6f4 v[24:39], v[4:7], v[12:15], 0 cbsz:4 blgp:4", 12),      # 8 passes
    ("v_mfma_f32_16x16x128_f8f6f4 v[24:27], v[4:11], v[12:15], 0 blgp:4", 12),           # FP8 A: 8
    ("v_mfma_i32_16x16x32_i8 v[24:27], v[4:5], v[12:13], 0", 8),
    ("v_mfma_i32_32x32x32_i8 v[24:39], v[4:7], v[12:15], 0", 12),
])
def test_new_mfma_result_wait_states(body, need):
    """Fact sheet §2 passes (FP4 x FP4 runs at half the FP8 passes; i8 like fp8), so a VALU
    read of the result needs passes + 4 wait states (LLVM 22 gfx950)."""
    regs = {r: np.full(64, 0x22222222, np.uint32) for r in range(4, 20)}
    first = int(body.split()[1][2:].split(":")[0])
    snippet = lambda n: f"  {body}\n{_nops(n)}\n  v_mov_b32 v200, v{first}"
    with pytest.raises(HazardError, match="wait states"):
        run_snippet(snippet(need - 1), vgprs=regs)
    run_snippet(snippet(need), vgprs=regs)


def test_timing_model_passes_match_the_emulator():
    """gfxasm.perf's pass count (cycles = 4 x passes) agrees with the passes the emulator's
    wait-state checks use, for every MFMA and SMFMAC it implements and every f8f6f4 format
    pair."""
    from gfxasm.emu.decode import parse_line
    from gfxasm.emu.families import mfma
    from gfxasm.perf.stats import mfma_passes
    for name, spec in mfma.MFMA.items():
        pairs = [(0, 0), (0, 4), (4, 1), (4, 4)] if spec.f8f6f4 else [(0, 0)]
        for cbsz, blgp in pairs:
            inst = parse_line(f"{name} v[0:3], v[4:7], v[8:11], 0 cbsz:{cbsz} blgp:{blgp}", 0, (0,))
            a, b = mfma.F8F6F4_FORMATS[cbsz], mfma.F8F6F4_FORMATS[blgp]
            assert mfma_passes(inst) == mfma._f8f6f4_passes(spec, a, b), (name, cbsz, blgp)
    from gfxasm.emu.families.smfmac import SMFMAC
    for name, spec in SMFMAC.items():
        assert mfma_passes(parse_line(f"{name} v[0:3], v[4:5], v[6:9], v10", 0, (0,))) == spec.passes, name

"""The compiled paths of this round against the numpy paths they stand in for, bit for bit.

fast.valu_f32 (vop.valu for v_add/sub/subrev/mul/fma/fmac_f32, vop3p for v_pk_mul/add_f32):
each op and operand form (VGPR, SGPR, inline constant, literal; neg/abs on the VOP3 forms;
fmac's dst source; op_sel/op_sel_hi/neg_lo/neg_hi of the packed ops, a destination pair
that is also a source) runs
through the emulator twice, once compiled (tests/conftest.py lowers fast.MIN_WAVES for
tests/emu) and once with the compiled kernels withheld (the numpy path), on seeded
random lanes drawn from every f32 class: zeros, denormals, normals, results that overflow
or fall to denormals, infinities, quiet and signalling NaNs with random payloads and
signs (two NaN operands in one lane included: the first operand's must win), with MODE's
f32 denormals kept and flushed, EXEC full and partial.

fast.gather_bf16 and fast.acc_store_f32 (an MFMA's bf16 operand gather and its srcC sum
and f32 store) against numpy's take/shift/cast and d += c then cast, on the same classes.
"""
import zlib

import numpy as np
import pytest

from asm_harness import run_snippet
from gfxasm.emu import fast

pytestmark = pytest.mark.skipif(fast.kernels() is None, reason="numba is not installed: no fast path to compare")


def _special(rng, n):
    """uint32[n] f32 patterns, every class well represented."""
    sign = rng.integers(0, 2, n, dtype=np.uint64).astype(np.uint32) << np.uint32(31)
    frac = rng.integers(1, 1 << 23, n, dtype=np.uint64).astype(np.uint32)
    kinds = rng.integers(0, 8, n)
    normal = rng.integers(1, 255, n, dtype=np.uint64).astype(np.uint32) << np.uint32(23)
    near = rng.integers(1, 4, n, dtype=np.uint64).astype(np.uint32) << np.uint32(23)      # results -> denormal
    big = rng.integers(250, 255, n, dtype=np.uint64).astype(np.uint32) << np.uint32(23)  # results -> inf
    bits = np.select([kinds == 0, kinds == 1, kinds == 2, kinds == 3, kinds == 4, kinds == 5, kinds == 6],
                     [np.zeros(n, np.uint32), frac, normal | frac, near | frac, big | frac,
                      np.full(n, 0x7F800000, np.uint32),
                      0x7FC00000 | (frac & 0x3FFFFF)],              # quiet NaN
                     0x7F800000 | (frac & 0x3FFFFF) | 1)             # signalling NaN (non-zero payload)
    return (bits | sign).astype(np.uint32)


FORMS = [
    ("v_add_f32 v3, v0, v1", 2), ("v_sub_f32 v3, v0, v1", 2), ("v_subrev_f32 v3, v0, v1", 2),
    ("v_mul_f32 v3, v0, v1", 2), ("v_mul_f32 v3, s20, v1", 2), ("v_add_f32 v3, 0.5, v1", 2),
    ("v_mul_f32 v3, 0x3e800001, v1", 2), ("v_add_f32_e64 v3, -v0, |v1|", 2),
    ("v_mul_f32_e64 v3, -|v0|, s20", 2), ("v_sub_f32_e64 v3, v0, -v1", 2),
    ("v_fma_f32 v3, v0, v1, v2", 3), ("v_fma_f32 v3, v0, s20, -v2", 3), ("v_fma_f32 v3, -v0, |v1|, 1.0", 3),
    ("v_fmac_f32 v2, v0, v1", 3), ("v_add_f32 v0, v0, v1", 2),
    # packed: op_sel picks each half's register of a pair, neg_lo/neg_hi negate
    ("v_pk_mul_f32 v[4:5], v[0:1], v[2:3]", 2), ("v_pk_add_f32 v[4:5], v[0:1], v[2:3] op_sel:[1,0] op_sel_hi:[0,1]", 2),
    ("v_pk_mul_f32 v[4:5], v[0:1], v[2:3] neg_lo:[1,0] neg_hi:[1,1]", 2),
    ("v_pk_mul_f32 v[0:1], v[0:1], v[2:3] op_sel:[1,1] op_sel_hi:[0,0]", 2),
]


def _run(body, vgprs, sgpr, denorm, exec_mask, out):
    return run_snippet(body, vgprs=vgprs, sgprs={20: sgpr}, outputs=[out], denorm=denorm,
                       exec_mask=exec_mask)[out]


@pytest.mark.parametrize("body,nsrc", FORMS)
@pytest.mark.parametrize("denorm", [0, 3])
def test_valu_f32_matches_numpy(body, nsrc, denorm, monkeypatch):
    rng = np.random.default_rng(zlib.crc32(f"{body} {denorm}".encode()))
    vgprs = {r: _special(rng, 64) for r in range(4)}
    sgpr = int(_special(rng, 1)[0])
    out = body.split()[1].rstrip(",")
    if out.startswith("v["):                      # a packed op's pair: both registers
        lo = int(out[2:].split(":")[0])
        return _check_pair(body, vgprs, sgpr, denorm, lo, monkeypatch)
    exec_mask = None if denorm else 0xF0F0_FFFF_0000_FFFF ^ int(rng.integers(0, 1 << 16))
    fast_bits = _run(body, vgprs, sgpr, denorm, exec_mask, out)
    monkeypatch.setattr(fast, "for_launch", lambda strict, waves: None)
    numpy_bits = _run(body, vgprs, sgpr, denorm, exec_mask, out)
    assert (fast_bits != 0xFFFFFFFF).any()
    np.testing.assert_array_equal(fast_bits, numpy_bits)


def _check_pair(body, vgprs, sgpr, denorm, lo, monkeypatch):
    outs = [f"v{lo}", f"v{lo + 1}"]
    fast_bits = run_snippet(body, vgprs=vgprs, sgprs={20: sgpr}, outputs=outs, denorm=denorm)
    monkeypatch.setattr(fast, "for_launch", lambda strict, waves: None)
    numpy_bits = run_snippet(body, vgprs=vgprs, sgprs={20: sgpr}, outputs=outs, denorm=denorm)
    for o in outs:
        np.testing.assert_array_equal(fast_bits[o], numpy_bits[o], err_msg=o)


def test_valu_f32_two_nans_first_wins(monkeypatch):
    """Both operands NaN in every lane: the first operand's payload, quieted."""
    rng = np.random.default_rng(7)
    a = (0x7F800001 + rng.integers(0, 1 << 22, 64)).astype(np.uint32)     # signalling
    b = (0xFFC00001 + rng.integers(0, 1 << 22, 64)).astype(np.uint32)     # quiet, negative
    for body in ("v_add_f32 v3, v0, v1", "v_mul_f32 v3, v0, v1", "v_sub_f32 v3, v0, v1",
                 "v_fma_f32 v3, v0, v1, v2"):
        got = run_snippet(body, vgprs={0: a, 1: b, 2: b}, outputs=["v3"])["v3"]
        np.testing.assert_array_equal(got, a | 0x00400000, err_msg=body)
    got = run_snippet("v_subrev_f32 v3, v0, v1", vgprs={0: a, 1: b}, outputs=["v3"])["v3"]
    np.testing.assert_array_equal(got, b)


def test_gather_bf16_matches_numpy():
    rng = np.random.default_rng(3)
    file = _special(rng, 6 * 10 * 64).reshape(6, 10, 64)
    rows = np.array([5, 0, 3])
    index = rng.permutation(4 * 128)[:200]
    base = 2 * 128
    out = np.full((3, 200), np.nan)
    fast.kernels().gather_bf16(file.reshape(6, -1).view(np.uint16), rows, base, index,
                               np.empty((3, 200), np.uint32), out)
    half = file.reshape(6, -1).view(np.uint16)[rows][:, base + index]
    want = np.left_shift(half, 16, dtype=np.uint32).view(np.float32).astype(np.float64)
    np.testing.assert_array_equal(out.view(np.uint64), want.view(np.uint64))


@pytest.mark.parametrize("same", [True, False])
def test_acc_store_matches_numpy(same):
    rng = np.random.default_rng(4 + same)
    file = _special(rng, 5 * 12 * 64).reshape(5, 12, 64)
    rows = np.array([4, 1])
    d = _special(rng, 2 * 4 * 64).view(np.float32).astype(np.float64)      # sNaN -> quiet, as a matmul's
    d.view(np.uint64)[::7] = 0x7FF0000000000005 + np.arange(d[::7].size, dtype=np.uint64)   # signalling in d
    d = d.reshape(2, 256)
    dst, c_at = 2, (2 if same else 7)
    want = d.copy()
    want += file[rows, c_at:c_at + 4].view(np.float32).reshape(2, -1)
    want = want.astype(np.float32).view(np.uint32).reshape(2, 4, 64)
    got = file.copy()
    fast.kernels().acc_store_f32(d, got.view(np.float32), rows, dst, 4, c_at, True)
    np.testing.assert_array_equal(got[rows, dst:dst + 4], want)
    untouched = np.ones(5, bool)
    untouched[rows] = False
    np.testing.assert_array_equal(got[untouched], file[untouched])
    plain = file.copy()
    fast.kernels().acc_store_f32(d, plain.view(np.float32), rows, dst, 4, 0, False)
    np.testing.assert_array_equal(plain[rows, dst:dst + 4], d.astype(np.float32).view(np.uint32).reshape(2, 4, 64))

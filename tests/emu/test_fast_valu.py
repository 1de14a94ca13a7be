"""The compiled VALU paths (fast.valu_f32, fast.pk_bf16) against the numpy paths, bit for bit.

fast.valu_f32 (vop.valu for v_add/sub/subrev/mul/fma/fmac_f32 and v_min/max/min3/max3_f32,
vop3p for v_pk_mul/add_f32):
each op and operand form (VGPR, SGPR, inline constant, literal; neg/abs on the VOP3 forms;
fmac's dst source; op_sel/op_sel_hi/neg_lo/neg_hi of the packed ops, a destination pair
that is also a source), and fast.pk_bf16 (v_cvt_pk_bf16_f32, plain and with neg/abs) runs
through the emulator twice, once compiled (tests/conftest.py lowers fast.MIN_WAVES for
tests/emu) and once with the compiled kernels withheld (the numpy path), on seeded
random lanes drawn from every f32 class: zeros, denormals, normals, results that overflow
or fall to denormals, infinities, quiet and signalling NaNs with random payloads and
signs (two NaN operands in one lane included: the first operand's must win), with MODE's
f32 denormals kept and flushed, EXEC full and partial.
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
    # fast.pk_bf16 (declines where a lane is a NaN: the draws below always hold some, so
    # the NaN-free forms draw again without them)
    ("v_cvt_pk_bf16_f32 v3, v0, v1", 2), ("v_cvt_pk_bf16_f32 v0, -v0, |v1|", 2),
]


def _run(body, vgprs, sgpr, denorm, exec_mask, out):
    return run_snippet(body, vgprs=vgprs, sgprs={20: sgpr}, outputs=[out], denorm=denorm,
                       exec_mask=exec_mask)[out]


@pytest.mark.parametrize("body,nsrc", FORMS)
@pytest.mark.parametrize("denorm", [0, 3])
def test_valu_f32_matches_numpy(body, nsrc, denorm, monkeypatch):
    rng = np.random.default_rng(zlib.crc32(f"{body} {denorm}".encode()))
    vgprs = {r: _special(rng, 64) for r in range(4)}
    if "cvt_pk_bf16" in body:                     # NaN-free: the compiled path's domain
        vgprs = {r: np.where((v & 0x7FFFFFFF) > 0x7F800000, v & 0xFF800000, v) for r, v in vgprs.items()}
        ties = rng.choice(np.array([0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32), 64)   # rounding boundaries
        vgprs = {r: np.where(np.arange(64) % 2 == 0, (v & 0xFFFF0000) | ties, v) for r, v in vgprs.items()}
        vgprs = {r: np.where((v & 0x7FFFFFFF) > 0x7F800000, v & 0xFF800000, v) for r, v in vgprs.items()}
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


MINMAX = ["v_max_f32 v3, v0, v1", "v_min_f32 v3, s20, v1", "v_max3_f32 v3, v0, v1, v2",
          "v_min3_f32 v3, v0, -v1, |v2|", "v_max3_f32 v3, v0, 1.0, v2", "v_max_f32_e64 v3, -v0, v1"]


@pytest.mark.parametrize("body", MINMAX)
@pytest.mark.parametrize("ieee", [0, 1])
@pytest.mark.parametrize("denorm", [0, 3])
def test_minmax_f32_matches_numpy(body, ieee, denorm, monkeypatch):
    """v_min/max/min3/max3_f32 compiled (fast._pick) and in numpy (vop._select_f32), in
    both MODE.IEEE settings: every f32 class, a quarter of the lanes zeros of random signs
    in every source (the -0 < +0 rule), equal values, EXEC partial where denormals flush."""
    rng = np.random.default_rng(zlib.crc32(f"{body} {ieee} {denorm}".encode()))
    vgprs = {r: _special(rng, 64) for r in range(3)}
    zero = np.arange(64) % 4 == 0
    for r in range(3):
        vgprs[r] = np.where(zero, rng.integers(0, 2, 64).astype(np.uint32) << np.uint32(31), vgprs[r])
    vgprs[1] = np.where(np.arange(64) % 8 == 1, vgprs[0], vgprs[1])           # equal operands
    sgpr = int(_special(rng, 1)[0])
    exec_mask = None if denorm else 0xF0F0_FFFF_0000_FFFF

    def run():
        return run_snippet(body, vgprs=vgprs, sgprs={20: sgpr}, outputs=["v3"], denorm=denorm, ieee=ieee,
                           exec_mask=exec_mask)["v3"]
    fast_bits = run()
    monkeypatch.setattr(fast, "for_launch", lambda strict, waves: None)
    np.testing.assert_array_equal(fast_bits, run())


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

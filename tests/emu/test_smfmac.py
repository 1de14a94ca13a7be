"""Known-answer tests for the sparse MFMAs (loader/emu/families/smfmac.py).

The reference is the instruction's meaning, D = C + A_dense . B, with A_dense a 4:2
structured-sparse matrix: the test draws A_dense and B, then packs A's non-zeros and
their 2-bit positions (the index set ABID selects: non-zero j at bits [2j+1:2j]) and B
(lane i + M*g holds row/column i and dense k = T*g + t in register order, T elements per
lane) as the ISA describes — never from the emulator's output.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from gfxasm.emu.errors import UnsupportedInstruction
from asm_harness import run_snippet
from mfma_batch import run_batch
from test_mfma import pack_c, random_fp8, random_16bit, unpack_d


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


def parse(name):
    """(M, K, A format, B format, A VGPRs) from the mnemonic."""
    parts = name.split("_")
    m, _, k = (int(x) for x in parts[3].split("x"))
    fmts = parts[4:] if len(parts) > 5 else parts[4:] * 2
    bits = 16 if fmts[0] in ("f16", "bf16") else 8
    a_regs = k * m // 2 // 64 * bits // 32
    return m, k, fmts[0], fmts[1], a_regs


def pack(elems: np.ndarray, bits: int) -> np.ndarray:
    """elements [64, E] (lane, register order) of `bits` bits -> uint32[R, 64]."""
    per = 32 // bits
    e = elems.astype(np.uint64).reshape(64, -1, per)
    words = (e << (bits * np.arange(per, dtype=np.uint64))).sum(axis=2)
    return words.T.astype(np.uint32)


def draw(fmt, rng, shape):
    if fmt in ("f16", "bf16"):
        return random_16bit(rng, shape, fmt)
    if fmt == "i8":
        v = rng.integers(-128, 128, shape)
        return (v & 0xFF).astype(np.uint8), v.astype(np.float64)
    return random_fp8(rng, shape, fmt)


def case(name, rng, abid):
    m, k, af, bf, a_regs = parse(name)
    bits = 16 if af in ("f16", "bf16") else 8
    groups, t_per = 64 // m, k * m // 64             # lanes groups, dense elements per lane
    nz = t_per // 2
    a_codes, a_vals = draw(af, rng, (64, nz))
    b_codes, b_vals = draw(bf, rng, (64, t_per))     # lane l, element t
    # 4:2 pattern: per group of 4 two distinct sorted positions.
    picks = np.sort(np.argsort(rng.random((64, nz // 2, 4)), axis=2)[:, :, :2], axis=2)
    pos = (4 * np.arange(nz // 2)[None, :, None] + picks).reshape(64, nz)
    a_dense = np.zeros((m, k))
    b_dense = np.zeros((k, m))
    for lane in range(64):
        i, g = lane % m, lane // m
        a_dense[i, t_per * g + pos[lane]] = a_vals[lane]
        b_dense[t_per * g + np.arange(t_per), i] = b_vals[lane]
    set_bits = 2 * nz
    idx = rng.integers(0, 2**32, 64, dtype=np.uint64)            # junk outside the selected set
    field = (picks.reshape(64, nz).astype(np.uint64) << (2 * np.arange(nz, dtype=np.uint64))).sum(axis=1)
    mask = ((1 << set_bits) - 1) << (abid * set_bits)
    idx = (idx & ~np.uint64(mask)) | (field << np.uint64(abid * set_bits))
    integer = af == "i8"
    c = (rng.integers(-2**20, 2**20, (m, m)) if integer else (rng.integers(-64, 64, (m, m)) / 8))
    regs = np.concatenate([pack(a_codes, bits), pack(b_codes, bits), idx.astype(np.uint32)[None],
                           pack_c(c, np.int32) if integer else pack_c(c.astype(np.float32))])
    return regs, c + a_dense @ b_dense, a_regs, integer


CASES = [("v_smfmac_f32_16x16x32_f16", a) for a in range(4)] + [
    ("v_smfmac_f32_32x32x16_bf16", 2), ("v_smfmac_f32_16x16x64_f16", 1), ("v_smfmac_f32_32x32x32_bf16", 0),
    ("v_smfmac_i32_16x16x64_i8", 1), ("v_smfmac_i32_32x32x64_i8", 0), ("v_smfmac_f32_16x16x64_fp8_bf8", 0),
    ("v_smfmac_f32_32x32x64_bf8_fp8", 0), ("v_smfmac_f32_16x16x128_fp8_fp8", 0),
]


@pytest.mark.parametrize("name,abid", CASES)
def test_smfmac_known_answer(name, abid):
    rng = np.random.default_rng(seed(name, abid))
    cases = [case(name, rng, abid) for _ in range(3)]
    _, _, a_regs, integer = cases[0]
    m = parse(name)[0]
    nc = 4 if m == 16 else 16
    inputs = ([("v", r) for r in range(a_regs)] + [("a", 8 + r) for r in range(2 * a_regs)] + [("v", 30)]
              + [("a", 64 + r) for r in range(nc)])
    body = (f"  {name} a[64:{63 + nc}], v[0:{a_regs - 1}], a[8:{7 + 2 * a_regs}], v30"
            + (f" abid:{abid}" if abid else ""))
    out = run_batch(body, inputs, np.array([c[0] for c in cases]), [("a", 64 + r) for r in range(nc)])
    for (_, want, _, _), got in zip(cases, out):
        if integer:
            np.testing.assert_array_equal(unpack_d(got, np.int32), want)
        else:
            np.testing.assert_allclose(unpack_d(got), want.astype(np.float32), rtol=2e-7, atol=0)


def test_smfmac_repeated_index_is_rejected():
    regs = {r: np.full(64, 0x3C003C00, np.uint32) for r in range(0, 8)}
    regs[10] = np.zeros(64, np.uint32)            # both non-zeros of each group at position 0
    with pytest.raises(UnsupportedInstruction, match="share an index"):
        run_snippet("v_smfmac_f32_16x16x32_f16 v[20:23], v[0:1], v[2:5], v10", vgprs=regs)

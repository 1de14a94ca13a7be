"""Known-answer tests for the sparse MFMAs (loader/emu/families/smfmac.py), built from the
evidence docs/smfmac-evidence.md names, never from the emulator's output.

gfx940 forms: the operands are placed by the element-to-register formulas AMD's matrix
instruction calculator prints for CDNA3 (ROCm/amd_matrix_instruction_calculator,
`--detail-instruction`): A[i][k] and the compression index in lane M*floor(k/T) + i, one
16-bit (8-bit sources) or 32-bit (16-bit sources) slot per group of 4 k, one index nibble
per group; B[k][j] in lane M*floor(k/T) + j, element k mod T in register order (T dense
k per lane); D as the dense MFMAs. The index set is the one ABID picks (CBSZ 0).

gfx950 16x16x128 fp8/bf8 forms: only class-uniform operands are modelled (the evidence,
aiter's fwd_hd128_mxfp8.co, pins no more): per row i and dense half c, one A value a(i, c)
and one pair of positions in every 4-group; then D[i][j] = C[i][j] + sum over c of
a(i, c) * (the bytes at those positions of every dword of column j in lane groups c and
c + 2). Everything else of those forms, and the 10 gfx950 forms with no evidence, must be
refused.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from gfxasm.emu.decode import parse_line
from gfxasm.emu.errors import UnsupportedInstruction
from gfxasm.emu.families.smfmac import SMFMAC
from asm_harness import run_snippet
from mfma_batch import run_batch
from test_mfma import pack_c, random_fp8, random_16bit, unpack_d

GFX940 = [n for n, s in SMFMAC.items() if s.a_regs == 2]
ROWSUM = [n for n, s in SMFMAC.items() if s.pairing == "classes"]
UNSETTLED = [n for n, s in SMFMAC.items() if s.pairing is None]


def seed(*key) -> int:
    return zlib.crc32(repr(key).encode())


def parse(name):
    """(M, K, A format, B format) from the mnemonic."""
    parts = name.split("_")
    m, _, k = (int(x) for x in parts[3].split("x"))
    fmts = parts[4:] if len(parts) > 5 else parts[4:] * 2
    return m, k, fmts[0], fmts[1]


def bits_of(fmt) -> int:
    return 16 if fmt in ("f16", "bf16") else 8


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


def draw_c(rng, m, integer):
    return rng.integers(-2**20, 2**20, (m, m)) if integer else rng.integers(-64, 64, (m, m)) / 8


def index_word(rng, positions: np.ndarray, abid: int) -> np.ndarray:
    """uint32[64]: positions [64, nz] (0..3) as 2-bit fields, non-zero j at bits 2j of the
    set ABID picks; the other bits random (they must not matter)."""
    nz = positions.shape[1]
    field = (positions.astype(np.uint64) << (2 * np.arange(nz, dtype=np.uint64))).sum(axis=1)
    mask = ((1 << 2 * nz) - 1) << (abid * 2 * nz)
    junk = rng.integers(0, 2**32, 64, dtype=np.uint64)
    return ((junk & ~np.uint64(mask)) | (field << np.uint64(abid * 2 * nz))).astype(np.uint32)


def gfx940_case(name, rng, abid):
    """Registers [R, 64] and the expected D, placing A_dense and B by the calculator's
    formulas: lane group g = floor(k / T) holds k = T*g .. T*g + T - 1."""
    m, k, af, bf = parse(name)
    t = k * m // 64                                   # dense k per lane
    nz = t // 2
    a_codes, a_vals = draw(af, rng, (64, nz))
    b_codes, b_vals = draw(bf, rng, (64, t))
    picks = np.sort(np.argsort(rng.random((64, nz // 2, 4)), axis=2)[:, :, :2], axis=2).reshape(64, nz)
    a_dense, b_dense = np.zeros((m, k)), np.zeros((k, m))
    for lane in range(64):
        i, g = lane % m, lane // m
        a_dense[i, t * g + 4 * (np.arange(nz) // 2) + picks[lane]] = a_vals[lane]
        b_dense[t * g + np.arange(t), i] = b_vals[lane]
    integer = af == "i8"
    c = draw_c(rng, m, integer)
    regs = np.concatenate([pack(a_codes, bits_of(af)), pack(b_codes, bits_of(bf)),
                           index_word(rng, picks, abid)[None],
                           pack_c(c, np.int32) if integer else pack_c(c.astype(np.float32))])
    return regs, c + a_dense @ b_dense


def rowsum_case(name, rng):
    """Class-uniform operands of a 16x16x128 form and D by the evidence rule."""
    _, _, af, bf = parse(name)
    a_codes, a_vals = draw(af, rng, (16, 2))               # a(i, c)
    pair = np.sort(np.argsort(rng.random((16, 2, 4)), axis=2)[:, :, :2], axis=2)   # positions (i, c)
    b_codes, b_vals = draw(bf, rng, (64, 32))
    a_lane = np.zeros((64, 16), np.uint8)
    positions = np.zeros((64, 16), np.int64)
    for lane in range(64):
        i = lane % 16
        for c in (0, 1):
            a_lane[lane, 8 * c:8 * c + 8] = a_codes[i, c]
            positions[lane, 8 * c:8 * c + 8] = np.tile(pair[i, c], 4)
    c_mat = draw_c(rng, 16, False)
    want = c_mat.copy()
    for i in range(16):
        for j in range(16):
            for c in (0, 1):
                for g in (c, c + 2):
                    want[i, j] += a_vals[i, c] * b_vals[j + 16 * g].reshape(8, 4)[:, pair[i, c]].sum()
    regs = np.concatenate([pack(a_lane, 8), pack(b_codes, 8), index_word(rng, positions, 0)[None],
                           pack_c(c_mat.astype(np.float32))])
    return regs, want


def run_cases(name, abid, cases, a_regs):
    m = parse(name)[0]
    nc = 4 if m == 16 else 16
    inputs = ([("v", r) for r in range(a_regs)] + [("a", 8 + r) for r in range(2 * a_regs)] + [("v", 30)]
              + [("a", 64 + r) for r in range(nc)])
    body = (f"  {name} a[64:{63 + nc}], v[0:{a_regs - 1}], a[8:{7 + 2 * a_regs}], v30"
            + (f" abid:{abid}" if abid else ""))
    return run_batch(body, inputs, np.array([c[0] for c in cases]), [("a", 64 + r) for r in range(nc)])


def check(name, cases, out):
    for (_, want), got in zip(cases, out):
        if parse(name)[2] == "i8":
            np.testing.assert_array_equal(unpack_d(got, np.int32), want)
        else:
            np.testing.assert_allclose(unpack_d(got), want.astype(np.float32), rtol=2e-7, atol=0)


def _gfx940_params():
    """Every form with its last index set (the shift matters); the other sets under -m full."""
    for n in GFX940:
        sets = 4 if bits_of(parse(n)[2]) == 16 else 2
        for abid in range(sets):
            yield pytest.param(n, abid, marks=() if abid == sets - 1 else pytest.mark.full)


@pytest.mark.parametrize("name,abid", list(_gfx940_params()))
def test_gfx940_smfmac_known_answer(name, abid):
    rng = np.random.default_rng(seed(name, abid))
    cases = [gfx940_case(name, rng, abid) for _ in range(2)]
    check(name, cases, run_cases(name, abid, cases, 2))


@pytest.mark.parametrize("name", ROWSUM)
def test_16x16x128_class_uniform_known_answer(name):
    rng = np.random.default_rng(seed(name))
    cases = [rowsum_case(name, rng) for _ in range(3)]
    check(name, cases, run_cases(name, 0, cases, 4))


def test_16x16x128_operands_the_evidence_does_not_settle_are_refused():
    """One A value that differs from the rest of its class, or one 4-group that selects
    another pair: the result would depend on the unsettled order, so the form refuses."""
    name = ROWSUM[0]
    rng = np.random.default_rng(seed("refuse"))
    regs, _ = rowsum_case(name, rng)
    odd_value = regs.copy()
    odd_value[0, 5] ^= 0x01                        # lane 5, non-zero 0: another value
    odd_pair = regs.copy()
    nibble = (int(odd_pair[12, 5]) >> 4) & 0xF      # lane 5, 4-group 1: another pair of positions
    other = 0b1110 if nibble == 0b0100 else 0b0100
    odd_pair[12, 5] = (int(odd_pair[12, 5]) & ~0xF0) | (other << 4)
    for bad in (odd_value, odd_pair):
        with pytest.raises(UnsupportedInstruction, match="not settled"):
            run_cases(name, 0, [(bad, None)], 4)


@pytest.mark.parametrize("name", UNSETTLED)
def test_unsettled_forms_are_refused_statically_and_when_run(name):
    from gfxasm.emu.registry import HANDLERS
    m = parse(name)[0]
    nc = 4 if m == 16 else 16
    text = f"{name} v[20:{19 + nc}], v[0:3], v[4:11], v12"
    with pytest.raises(UnsupportedInstruction, match="not settled"):
        HANDLERS[name].check(parse_line(text, 0, (0,)))
    with pytest.raises(UnsupportedInstruction, match="not settled"):
        run_snippet(text, vgprs={r: np.full(64, 0x3C003C00, np.uint32) for r in range(13)})


def test_smfmac_repeated_index_is_rejected():
    regs = {r: np.full(64, 0x3C003C00, np.uint32) for r in range(0, 8)}
    regs[10] = np.zeros(64, np.uint32)            # both non-zeros of each group at position 0
    with pytest.raises(UnsupportedInstruction, match="share an index"):
        run_snippet("v_smfmac_f32_16x16x32_f16 v[20:23], v[0:1], v[2:5], v10", vgprs=regs)


def test_smfmac_cbsz_is_refused():
    """AMD's calculator ties CBSZ != 0 to the index set in ways its own comments disagree on."""
    regs = {r: np.full(64, 0x3C003C00, np.uint32) for r in range(0, 8)}
    regs[10] = np.full(64, 0x44444444, np.uint32)
    with pytest.raises(UnsupportedInstruction, match="not modelled"):
        run_snippet("v_smfmac_f32_16x16x32_f16 v[20:23], v[0:1], v[2:5], v10 cbsz:1 abid:1", vgprs=regs)

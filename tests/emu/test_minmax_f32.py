"""v_min/max/min3/max3/med3_f32 against the CDNA4 ISA reference's pseudocode (section 12.7,
VOP2, and 12.10, VOP3), written here lane by lane on bit patterns: signaling NaNs are
quieted only under MODE.IEEE, a quiet NaN yields the other operand, -0 < +0, and the
same operands give the same bits whatever else is in the wave.

The operands: every ordered pair (S0, S1) of the special values where the rules differ —
both zeros, quiet and signaling NaNs of either sign with payloads, infinities, denormals
(kept: denorm mode 3) — with S2 drawn (seeded) from them and random finite values, and one
run of three drawn operands; in both IEEE modes.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from asm_harness import run_snippet

SPECIAL = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x7FC00000, 0x7FC12345, 0xFFC00001,
           0x7F800001, 0x7FA00000, 0xFF800123, 0x7F800000, 0xFF800000, 0x00000001, 0x80000001, 0x40000000,
           0x7F7FFFFF]
QUIET = 0x00400000


def _f(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _nan(bits: int) -> bool:
    return (bits & 0x7F800000) == 0x7F800000 and (bits & 0x007FFFFF) != 0


def _snan(bits: int) -> bool:
    return _nan(bits) and not bits & QUIET


def _is(bits: int, zero: str) -> bool:
    return bits == (0 if zero == "+0" else 0x80000000)


def _ref_select(larger: bool, ieee: bool, s0: int, s1: int) -> int:
    """V_MAX_F32 (larger) or V_MIN_F32, step by step as the reference writes them."""
    if ieee and _snan(s0):
        return s0 | QUIET
    if ieee and _snan(s1):
        return s1 | QUIET
    if _nan(s0):
        return s1
    if _nan(s1):
        return s0
    if _is(s0, "+0") and _is(s1, "-0"):
        return s0 if larger else s1
    if _is(s0, "-0") and _is(s1, "+0"):
        return s1 if larger else s0
    if not larger:
        return s0 if _f(s0) < _f(s1) else s1
    if ieee:
        return s0 if _f(s0) >= _f(s1) else s1
    return s0 if _f(s0) > _f(s1) else s1


def ref_max(ieee: bool, s0: int, s1: int) -> int:
    return _ref_select(True, ieee, s0, s1)


def ref_min(ieee: bool, s0: int, s1: int) -> int:
    return _ref_select(False, ieee, s0, s1)


def ref_med3(ieee: bool, s0: int, s1: int, s2: int) -> int:
    if _nan(s0) or _nan(s1) or _nan(s2):
        return ref_min(ieee, ref_min(ieee, s0, s1), s2)
    top = _f(ref_max(ieee, ref_max(ieee, s0, s1), s2))
    if top == _f(s0):
        return ref_max(ieee, s1, s2)
    if top == _f(s1):
        return ref_max(ieee, s0, s2)
    return ref_max(ieee, s0, s1)


OPS = {
    "v_max_f32 v10, v1, v2": lambda i, a, b, c: ref_max(i, a, b),
    "v_min_f32 v10, v1, v2": lambda i, a, b, c: ref_min(i, a, b),
    "v_max3_f32 v10, v1, v2, v3": lambda i, a, b, c: ref_max(i, ref_max(i, a, b), c),
    "v_min3_f32 v10, v1, v2, v3": lambda i, a, b, c: ref_min(i, ref_min(i, a, b), c),
    "v_med3_f32 v10, v1, v2, v3": ref_med3,
}


def _operands(run: int) -> list[np.ndarray]:
    """Runs 0-3: every ordered pair of SPECIAL as (S0, S1), 64 per run, S2 drawn (seeded) from
    SPECIAL and random finite values; run 4: all three drawn."""
    rng = np.random.default_rng(run)
    pool = np.array(SPECIAL + [int(x) for x in rng.normal(0, 4, 16).astype(np.float32).view(np.uint32)], np.uint32)
    drawn = [pool[rng.integers(0, len(pool), 64)] for _ in range(3)]
    if run == 4:
        return drawn
    pair = np.arange(64 * run, 64 * run + 64)
    special = np.array(SPECIAL, np.uint32)
    return [special[pair // len(SPECIAL)], special[pair % len(SPECIAL)], drawn[2]]


@pytest.mark.parametrize("ieee", [1, 0])
@pytest.mark.parametrize("op", list(OPS))
def test_min_max_med3_follow_the_pseudocode(op, ieee):
    for run in range(5):
        a, b, c = _operands(run)
        got = run_snippet(op, vgprs={1: a, 2: b, 3: c}, outputs=["v10"], ieee=ieee)["v10"]
        want = np.array([OPS[op](bool(ieee), int(x), int(y), int(z)) for x, y, z in zip(a, b, c)], np.uint32)
        bad = np.flatnonzero(got != want)
        assert not bad.size, (f"{op} ieee={ieee} run {run}: lane {bad[0]} operands "
                              f"{a[bad[0]]:#010x} {b[bad[0]]:#010x} {c[bad[0]]:#010x}: got {got[bad[0]]:#010x}, "
                              f"want {want[bad[0]]:#010x}")

"""LDS bank-conflict counting against hand-built lane addresses (phase groups: HipKittens)."""
from __future__ import annotations

import numpy as np
import pytest

from gfxasm.perf import lds_banks as L

ALL = np.ones((1, 64), bool)


def cycles(op, addr, nbytes, write=False, mask=ALL):
    groups, banks, _ = L.phases(op, nbytes, write)
    return L.count(np.asarray(addr).reshape(1, 64), mask, nbytes, groups, banks)


def test_consecutive_b64_reads_are_conflict_free_and_strided_ones_serialise():
    lanes = np.arange(64)
    assert cycles("ds_read_b64", lanes * 8, 8) == (2, 2)                 # two 32-lane phases
    # 256-byte stride: all 32 lanes of a phase in the same two banks, distinct dwords
    assert cycles("ds_read_b64", lanes * 256, 8) == (2, 64)
    # the same address everywhere is a broadcast
    assert cycles("ds_read_b64", np.zeros(64, int), 8) == (2, 2)


def test_b128_phase_groups_are_the_measured_non_consecutive_ones():
    # within each measured phase, the k-th lane reads banks 4k..4k+3 (a different 1 KiB row
    # per phase): every phase covers the 64 banks once -> conflict-free, 4 phases
    rng = np.random.default_rng(5)
    groups = L.MEASURED["ds_read_b128"][0]
    addr = np.zeros(64, np.int64)
    for p, lanes in enumerate(groups):
        for k, lane in enumerate(lanes):
            addr[lane] = 1024 * (4 * p + int(rng.integers(0, 4))) + 16 * k
    assert cycles("ds_read_b128", addr, 16) == (4, 4)
    # lanes 0 and 4 read the same banks (different dwords): measured in different phases, so
    # no conflict -- with 16 consecutive lanes a phase they would be 2-way
    assert addr[0] % 1024 == addr[4] % 1024 == 0
    assert cycles("ds_read_b128", addr, 16, mask=ALL) == (4, 4)
    consecutive = L.count(addr.reshape(1, 64), ALL, 16, tuple(tuple(range(s, s + 16)) for s in range(0, 64, 16)), 64)
    assert consecutive[1] > 4
    # lane 12 is in lane 0's phase: moved onto lane 0's banks it costs one more cycle
    same_phase = addr.copy()
    same_phase[12] = addr[0] + 8192
    assert cycles("ds_read_b128", same_phase, 16) == (4, 5)


def test_inactive_lanes_do_not_conflict_and_unmeasured_ops_are_flagged():
    addr = np.arange(64) * 256
    mask = np.zeros((1, 64), bool)
    mask[0, [0, 40]] = True
    assert cycles("ds_read_b64", addr, 8, mask=mask) == (2, 2)
    assert L.phases("ds_read_b64_tr_b16", 8, False)[2] is False
    assert L.phases("ds_write_b64", 8, True)[1:] == (32, True)


def v_read_addresses(swizzle) -> np.ndarray:
    """fmha_fwd_d128's V read (ds_read_b64_tr_b16), one d block: lane 16bb + 4j + m reads 8
    bytes of row rr = 4(bb/2) + j, chunk c = 2(bb%2) + m/2, at rr*256 + 16*(c ^ swizzle(rr))
    + 8(m%2) (the kernel's header comment; rows are 256 bytes of 16 chunks)."""
    lanes = np.arange(64)
    bb, j, m = lanes // 16, (lanes // 4) % 4, lanes % 4
    rr = 4 * (bb // 2) + j
    c = 2 * (bb % 2) + m // 2
    return rr * 256 + 16 * (c ^ swizzle(rr)) + 8 * (m % 2)


def test_fmha_v_reads_conflict_under_two_hypotheses_and_the_proposed_swizzle_under_none():
    current = v_read_addresses(lambda r: 2 * (r % 8))
    proposed = v_read_addresses(lambda r: 4 * (r % 4) ^ 2 * ((r // 4) % 2))
    extra = {}
    for name, addr in (("current", current), ("proposed", proposed)):
        for h in L.HYPOTHESES:
            groups, banks, measured = L.phases("ds_read_b64_tr_b16", 8, False, h)
            assert not measured
            ph, cyc = L.count(addr.reshape(1, 64), ALL, 8, groups, banks)
            extra[name, h] = cyc - ph
    # rows r and r+1 (r even) of the current layout put their chunks in the same 4 bank groups
    assert extra["current", "by bytes"] == 2 and extra["current", "b128 groups"] == 4
    assert extra["current", "quarter waves"] == 0
    assert all(extra["proposed", h] == 0 for h in L.HYPOTHESES)
    # the swizzle is a bijection of a row's 16 chunks: the DMA's 16 lanes of a row still read
    # the row's 256 contiguous global bytes
    for r in range(64):
        assert sorted(c ^ (4 * (r % 4) ^ 2 * ((r // 4) % 2)) for c in range(16)) == list(range(16))


def test_hypotheses_bracket_unmeasured_ops_only():
    for h in L.HYPOTHESES:
        assert L.phases("ds_read_b128", 16, False, h) == L.phases("ds_read_b128", 16, False)
    assert L.phases("ds_read_b64_tr_b16", 8, False, "b128 groups")[0] == L.phases("ds_read_b128", 16, False)[0]
    with pytest.raises(ValueError):
        L.phases("ds_read_b64_tr_b16", 8, False, "no such hypothesis")

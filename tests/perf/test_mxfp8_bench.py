"""bench/mxfp8_vs_f4gemm.py: the ours-vs-aiter table builder on one tiny point (a few seconds)."""
from __future__ import annotations

import re

import pytest

from bench import calib_data
from bench import mxfp8_vs_f4gemm as B
from gfxasm.perf import params as P

TILE_32 = "_ZN5aiter41f4gemm_bf16_per1x32Fp4_BpreShuffle_32x128E"
SPLIT_256 = "_ZN5aiter42f4gemm_bf16_per1x32Fp4_BpreShuffle_256x256E"


@pytest.fixture(scope="module")
def row():
    # N = 384: three 128-wide tiles, one and a half 256-wide tiles (an overhanging tile)
    return B.compare("tiny", 1, 3, 384, 512, [(TILE_32, 0), (SPLIT_256, 1)], calibrated={})


def test_row_is_equal_weight_bytes_and_ratios_span_the_brackets(row):
    assert row["K_f4"] == 2 * row["K"] == 1024
    # by hand: FP4 weights 384 x 512 bytes + 384 x 32 scales, activations 3 x (512 + 32), bf16 out
    assert B.f4_minimum_bytes(3, 384, 1024) == 384 * 512 + 384 * 32 + 3 * (512 + 32) + 2 * 3 * 384
    assert set(row["brackets"]) == set(P.BRACKETS)
    for name, b in row["brackets"].items():
        tried = row["aiter_candidates"][name]
        assert {(c["tile"], c["log2_k_split"]) for c in tried} == {("32x128", 0), ("256x256", 1)}
        assert b["aiter_us"] == min(c["us"] for c in tried)
        assert b["ratio"] == pytest.approx(b["ours_us"] / b["aiter_us"])
        # both kernels must read every weight byte at least once
        assert b["ours_dram_bytes"] >= 384 * 512 and b["aiter_dram_bytes"] >= 384 * 512
        assert b["ours_requested_bytes"] >= b["ours_dram_bytes"] and b["aiter_requested_bytes"] >= b["aiter_dram_bytes"]
    grids = {c["tile"]: c["grid"] for c in row["aiter_candidates"][next(iter(P.BRACKETS))]}
    assert grids == {"32x128": [3, 1, 1], "256x256": [2, 1, 2]}
    ratios = [b["ratio"] for b in row["brackets"].values()]
    assert row["ratio_lo"] == min(ratios) <= max(ratios) == row["ratio_hi"]


def test_markdown_row_states_the_ratio_as_a_range(row):
    table = B.markdown([row]).splitlines()
    assert len(table) == 3 and table[0].count("|") == table[2].count("|")
    assert table[2].startswith("| tiny | 1 | 3 | 384 | 512 / 1024 | ")
    assert re.search(rf"\| {row['ratio_lo']:.2f}–{row['ratio_hi']:.2f} \|$", table[2])


def test_measured_point_exact_and_nearest():
    pts = calib_data.load()
    p = next(q for q in pts if q["family"] == "f4gemm" and q["M"] == 16)
    got = B.measured_f4(16, p["N"], p["K"], pts, calibrated={})
    assert got["exact"] and (got["N"], got["K"]) == (p["N"], p["K"])
    same = [q for q in pts if q["family"] == "f4gemm" and (q["M"], q["N"], q["K"]) == (16, p["N"], p["K"])]
    assert got["measured_us"] in {q["measured_us"] for q in same}
    near = B.measured_f4(16, p["N"] + 1, p["K"], pts, calibrated={})
    assert not near["exact"] and near["M"] == 16
    assert B.measured_f4(7, 128, 256, pts, calibrated={}) is None      # no M = 7 row in the table

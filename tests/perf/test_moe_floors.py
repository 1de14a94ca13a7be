"""bench/moe.py --floors: the rate each MoE target needs (arithmetic on the bench's routing)."""
from __future__ import annotations

import re

import pytest

from bench import moe
from gfxasm.perf import params as P


def test_targets_follow_the_issue():
    assert moe.target_us(1, 1e9) == 20.0
    assert moe.target_us(8, 1e9) == pytest.approx(0.8 * 99.6)
    # T >= 64: the rate target, 6.5 TB/s of weight bytes
    assert moe.target_us(64, 6.5e6) == pytest.approx(1.0)


def test_needed_rates_meet_each_target_exactly():
    """Streaming the routed weights at the printed rate, plus the launches, takes the target's
    time; the one-launch rate is lower where the layer takes more than one launch (at T = 1
    it takes one: the two rates are the same)."""
    launch = P.DEFAULT.launch_overhead_us
    lines = moe.floors_table([1, 4, 16]).splitlines()[1:4]
    for line in lines:
        T, experts, mb, target, n, need, one = (float(v) for v in re.split(r"\s+", line.strip()))
        weight = moe.weight_bytes(int(experts))
        assert mb == pytest.approx(weight / 1e6, abs=0.05)
        assert weight / (need * 1e12) * 1e6 + n * launch == pytest.approx(target, rel=2e-3)
        assert weight / (one * 1e12) * 1e6 + launch == pytest.approx(target, rel=2e-3)
        assert one < need if n > 1 else one == need
    assert "fastest measured MI355X stream" in moe.floors_table([1])

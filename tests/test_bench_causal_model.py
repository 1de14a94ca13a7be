"""bench/causal_model.py's causal probe arithmetic: which Q tiles are probed, the interpolation and
extrapolation of the others, and the list-scheduled makespan (no emulation: milliseconds)."""
import random

import pytest

from bench import causal_model as M
from gfxasm.perf import params as P


def test_probe_tiles_without_and_with_cap():
    assert M.probe_tiles(512) == [0, 128, 256, 384, 511]
    assert M.probe_tiles(4) == [0, 1, 2, 3]
    # capped: the same five spread over the tiles under the cap; the cap above the grid is no cap
    assert M.probe_tiles(512, 64) == [0, 16, 32, 48, 63]
    assert M.probe_tiles(32, 64) == M.probe_tiles(32)


def test_tiles_under_cap_and_bad_cap():
    assert M.tiles_under_cap(16384, 16384) is None and M.tiles_under_cap(131072, None) is None
    assert M.tiles_under_cap(131072, 16384) == 16384 // M.Q_TILE
    with pytest.raises(ValueError, match="cap_keys"):
        M.tiles_under_cap(131072, 512)


def test_affine_series_is_reproduced_from_capped_probes():
    """An affine per-tile time (offset + slope x tiles, random seeded coefficients) is exact
    from any two probes: interpolated below the cap, extrapolated past it."""
    rng = random.Random(7)
    a, b = rng.uniform(1e-6, 9e-6), rng.uniform(1e-7, 9e-7)
    tiles = 509                                 # not a multiple of 4: awkward quarter points
    probed = {t: a + b * t for t in M.probe_tiles(tiles, 37)}
    assert max(probed) == 36
    for t in (0, 5, 36, 37, 100, tiles - 1):
        assert M.q_tile_seconds(probed, t) == pytest.approx(a + b * t, rel=1e-12)


def test_extrapolation_uses_the_last_two_probes_only():
    """A convex series (early tiles cheaper per tile): past the last probe the line through
    the last two probes, not a fit over all of them."""
    probed = {0: 1.0, 4: 3.0, 8: 9.0, 10: 12.0}
    assert M.q_tile_seconds(probed, 20) == pytest.approx(12.0 + 1.5 * 10)
    assert M.q_tile_seconds(probed, 6) == pytest.approx(6.0)          # between probes: linear
    assert M.q_tile_seconds(probed, 8) == 9.0


def test_makespan_matches_an_independent_schedule():
    """The list schedule against a direct simulation: every CU takes the next workgroup in
    dispatch order (Q tile T-1 first) when it frees; with fewer workgroups than CUs the
    makespan is the longest workgroup."""
    S, Hq = 40 * M.Q_TILE, 9                # 360 workgroups on 256 CUs
    T = S // M.Q_TILE
    probed = {t: 2.0 + 0.5 * t for t in M.probe_tiles(T)}
    cus = [0.0] * P.NUM_CUS
    for _ in range(Hq):
        for x in range(T):
            n = min(range(P.NUM_CUS), key=lambda c: cus[c])
            cus[n] += 2.0 + 0.5 * (T - 1 - x)
    assert M.causal_makespan(1, Hq, S, probed) == pytest.approx(max(cus), rel=1e-12)
    assert M.causal_makespan(1, 1, S, probed) == pytest.approx(2.0 + 0.5 * (T - 1))

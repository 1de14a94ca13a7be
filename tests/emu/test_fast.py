"""The compiled fast paths (gfxasm.emu.fast, numba) against the numpy paths they stand in for.

fast.read_marks (inside fast.read_dwords, lds.read's fast path) replaces lds.py's
_check_pending + _check_order for a DS read where nothing is to be reported. Here both run on the same randomly drawn tracker state and
access (duplicate dwords within and across waves, waves of one workgroup and of two,
epochs equal and apart, some dwords in flight): where the numpy path reports, the fast
path must decline and leave the state untouched; elsewhere both must leave the same
reader marks, bit for bit. hazards.check_read's use of fast.reads_settled is covered by
test_strict.py's boundary tests and read_dwords' addresses and data by every DS test:
tests/conftest.py lowers fast.MIN_WAVES to 1 for tests/emu, so they run through both.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from gfxasm.emu import fast, lds
from gfxasm.emu.errors import HazardError

pytestmark = pytest.mark.skipif(fast.kernels() is None, reason="numba is not installed: no fast path to compare")

SLOTS, SIZE = 2, 256          # two workgroups' LDS of 64 dwords each


class _Ex:
    """What lds.py's checks use of an Executor."""

    def __init__(self, tracker, wave_in_group):
        self.lds, self.strict = tracker, True
        self.waves = SimpleNamespace(wave_in_group=wave_in_group)

    def wave_ids(self, w):
        return np.arange(len(self.waves.wave_in_group))[w]

    def hazard(self, w, rows, message):
        raise HazardError(message)


def _draw(rng, busy: bool):
    waves = 8
    t = lds.LdsTracker(SLOTS, SIZE, waves, strict=True)
    n = t.writer.size
    t.epoch[:] = rng.integers(1, 3, waves)
    t.writer[:] = rng.integers(-1, 4, n)
    # mostly writes from earlier epochs (so the marks are reached), some from this one
    t.w_epoch[:] = np.where(t.writer < 0, -1, rng.integers(-1, 1, n) + 2 * (rng.random(n) < 0.02))
    t.reader[:] = rng.integers(-2, 4, n)
    t.r_epoch[:] = np.where(t.reader == -1, -1, rng.integers(0, 4, n))
    if busy:
        t.dma_pending[rng.integers(0, n, 3)] = 1
        t.ds_pending[rng.integers(0, n, 3)] = 1
        t.ds_owner[:] = rng.integers(0, waves, n)
    ex = _Ex(t, np.arange(waves) % 4)
    rows = rng.choice(waves, size=int(rng.integers(1, 6)), replace=False)
    rows.sort()
    slot = rows // 4                                    # waves 0-3: workgroup 0, 4-7: 1
    per_row = 4 * int(rng.integers(1, 4))               # 4 lanes x 1..3 dwords, few dwords: collisions
    dword = rng.integers(0, 16, (len(rows), per_row))
    keys = (slot[:, None] * t.dwords + dword).reshape(-1)
    ok = np.ones((len(rows), 4), bool)
    acc = lds.Access(slot[:, None, None], ok, keys, None, None, dword.reshape(len(rows), 4, -1),
                     dword[:, ::per_row // 4] * 4, 4 * per_row // 4)
    return ex, rows, acc


def _state(t):
    return [a.copy() for a in (t.reader, t.r_epoch, t.writer, t.w_epoch)]


def test_read_marks_match_the_numpy_path():
    outcomes = [0, 0]          # draws marked, draws reported: both kinds must occur
    for seed in range(300):
        rng = np.random.default_rng(seed)
        outcomes[_compare(*_draw(rng, busy=seed % 3 == 0))] += 1
    assert min(outcomes) >= 50, outcomes


def _compare(ex, rows, acc) -> bool:
    """Run both paths from the same state; returns whether the numpy path reported."""
    t = ex.lds
    before = _state(t)
    fast_ex = _Ex(lds.LdsTracker(SLOTS, SIZE, 8, strict=True), ex.waves.wave_in_group)
    for name in ("epoch", "writer", "w_epoch", "reader", "r_epoch", "dma_pending", "ds_pending", "ds_owner"):
        getattr(fast_ex.lds, name)[:] = getattr(t, name)
    f = fast_ex.lds
    marked = fast.kernels().read_marks(acc.keys2, np.arange(8, dtype=np.int8)[rows] % 4, f.epoch[rows], rows, f.dma_pending,
                             f.ds_pending, f.ds_owner, f.w_epoch, f.writer, f.reader, f.r_epoch, f._scratch,
                             f._flag, np.zeros(f.writer.size, np.int32))
    try:
        lds._check_pending(ex, rows, acc, "ds_read", same_wave_ok=True)
        lds._check_order(ex, rows, acc, "ds_read", write=False)
        reported = False
    except HazardError:
        reported = True
    assert marked != reported
    expected = before if reported else _state(t)
    for got, want in zip(_state(fast_ex.lds), expected):
        np.testing.assert_array_equal(got, want)
    assert not fast_ex.lds._flag.any()
    return reported

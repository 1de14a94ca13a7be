"""The compiled fast paths (gfxasm.emu.fast, numba) against the numpy paths they stand in for.

fast.read_checks then fast.mark_reads (lds.read's fast path: fast.read_dwords, then the
marks deferred to lds.LdsTracker.settle) replace lds.py's _check_pending + _check_order
for a DS read where nothing is to be reported. Here both run on the same randomly drawn
tracker state and access (duplicate dwords within and across waves, waves of one workgroup and of two,
epochs equal and apart, some dwords in flight): where the numpy path reports, the fast
path must decline and leave the state untouched; elsewhere both must leave the same
reader marks, bit for bit. fast.write_marks (lds._write_checked: DS writes and LDS DMA)
likewise against _check_pending + _check_order(write=True) + _in_flight, with DMA values
that often equal what the dword already holds or will land (the same-DMA exception), and
every tracker array compared. hazards.check_read's use of fast.reads_settled is covered by
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
        self.lds, self.strict, self.fast = tracker, True, None
        self.waves = SimpleNamespace(wave_in_group=wave_in_group, lds=np.zeros((SLOTS, SIZE), np.uint8),
                                     slot=np.arange(len(wave_in_group)) // 4)

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
    me, mine = np.arange(8, dtype=np.int8)[rows] % 4, f.epoch[rows]
    marked = fast.kernels().read_checks(acc.keys2, me, mine, rows, f.dma_pending, f.ds_pending, f.ds_owner,
                                        f.w_epoch, f.writer)
    if marked:
        fast.kernels().mark_reads(acc.keys2, me, mine, f.reader, f.r_epoch, f._scratch, f._flag,
                                  np.zeros(f.writer.size, np.int32))
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


_WRITE_STATE = ("writer", "w_epoch", "reader", "r_epoch", "dma_pending", "ds_pending", "ds_owner", "by_dma",
                "dma_value")


def test_write_marks_match_the_numpy_path():
    outcomes = [0, 0]          # draws marked, draws reported: both kinds must occur
    for seed in range(400):
        outcomes[_compare_write(seed)] += 1
    assert min(outcomes) >= 60, outcomes


def _write_case(seed: int):
    """A drawn tracker state and write: (executor, rows, access, is_dma, DMA values or None).
    Two seeds in three write dwords no other wave of the access writes, over records that
    are mostly from earlier epochs, so that both outcomes are common."""
    rng = np.random.default_rng(seed)
    ex, rows, acc = _draw(rng, busy=seed % 3 == 0)
    t = ex.lds
    n = t.writer.size
    if seed % 3:
        old = rng.random(n) < 0.95
        t.w_epoch[:] = np.where(old & (t.writer >= 0), 0, t.w_epoch)
        t.r_epoch[:] = np.where(old & (t.reader != -1), 0, t.r_epoch)
        # each wave its own dwords: 16 per slot split among the access's waves by row
        per_row = acc.keys2.shape[1]
        dword = (np.arange(len(rows))[:, None] * per_row + np.arange(per_row)) % 16
        slot = rows // 4
        keys = (slot[:, None] * t.dwords + dword).reshape(-1)
        acc = lds.Access(slot[:, None, None], acc.ok, keys, None, None, dword.reshape(len(rows), 4, -1),
                         dword[:, ::per_row // 4] * 4, 4 * per_row // 4)
    dma = seed % 2 == 0
    # few distinct dword values, so DMAs often land what is already there
    ex.waves.lds.view(np.uint32).reshape(-1)[:] = rng.integers(0, 3, n)
    t.by_dma[:] = rng.random(n) < 0.5
    t.dma_value[:] = rng.integers(0, 3, n)
    if dma:
        t.dma_pending[rng.integers(0, n, 4)] = 1
    values = rng.integers(0, 3, acc.keys2.shape).astype(np.uint32) if dma and seed % 4 == 0 else None
    return ex, rows, acc, dma, values


def _compare_write(seed: int) -> bool:
    """Run lds._write_checked's numpy path and its fast path on the same drawn state and
    write; returns whether the numpy path reported."""
    results, states = [], []
    for compiled in (None, fast.kernels()):
        ex, rows, acc, dma, values = _write_case(seed)
        ex.fast = compiled
        before = [getattr(ex.lds, name).copy() for name in _WRITE_STATE]
        try:
            lds._write_checked(ex, rows, acc, "write", ex.lds.dma_pending if dma else ex.lds.ds_pending,
                               owner=not dma, same_wave_ok=not dma, values=values)
            results.append(None)
        except HazardError as err:
            results.append(str(err))
            for name, old in zip(_WRITE_STATE, before):     # a report leaves the state untouched
                np.testing.assert_array_equal(getattr(ex.lds, name), old, err_msg=name)
        states.append([getattr(ex.lds, name) for name in _WRITE_STATE])
        assert not ex.lds._flag.any()
    assert results[0] == results[1], seed
    for name, got, want in zip(_WRITE_STATE, states[1], states[0]):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} (seed {seed})")
    return results[0] is not None


def test_flush_f32_matches_the_numpy_path():
    """vop.flush_denorms compiled (in place) and in numpy, bit for bit, on every kind of f32
    pattern: denormals of both signs, zeros, the smallest normals, Inf, quiet and
    signaling NaNs, random values."""
    from gfxasm.emu.families.vop import flush_denorms
    rng = np.random.default_rng(7)
    special = np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000,
                        0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFBADBAD, 0x3F800000], np.uint32)
    signs = rng.integers(0, 2, 1000, dtype=np.uint32) << 31
    denormals = rng.integers(1, 1 << 23, 1000, dtype=np.uint32) | signs
    anything = rng.integers(0, 1 << 32, 5000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([special, anything, denormals])
    bits = bits[:64 * 93].reshape(-1, 64)
    want = flush_denorms(bits.copy().view(np.float32)).view(np.uint32)
    got = flush_denorms(bits.copy().view(np.float32), fast.kernels()).view(np.uint32)
    np.testing.assert_array_equal(got, want)
    assert (want != bits).sum() > 500          # many denormals were flushed

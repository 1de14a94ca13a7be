"""Strict mode's LDS race rule with deferred reader marks (lds.LdsTracker.defer/settle).

A read on the compiled path (fast.read_dwords) checks at once but keeps its reader marks
as a record of its dwords, with each wave's lowest and highest dword; a write marks
first the records whose ranges meet its own in the same workgroup, and drops records
from epochs every wave of their workgroup has left. Known answers of the rule (WAR, RAW,
WAW; overlap, adjacency, other workgroup, partial lanes, several readers, a barrier
between) are checked on both paths, compiled and numpy, with the same message; then
random access sequences must give the same first report (or none) and the same data on
both paths.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from gfxasm.emu import fast, lds
from gfxasm.emu.errors import HazardError

DWORDS, SLOTS, WAVES = 64, 2, 8            # two workgroups of four waves, 256 B of LDS each
PATHS = [pytest.param(True, id="compiled"), pytest.param(False, id="numpy")]
if fast.kernels() is None:
    PATHS = PATHS[1:]


class _Ex:
    """What lds.py uses of an Executor: waves 0-3 in workgroup (slot) 0, 4-7 in slot 1."""

    def __init__(self, compiled: bool):
        self.strict = True
        self.fast = fast.kernels() if compiled else None
        self.lds = lds.LdsTracker(SLOTS, 4 * DWORDS, WAVES, strict=True)
        self.waves = SimpleNamespace(lds=np.zeros((SLOTS, 4 * DWORDS), np.uint8), lds_bytes=4 * DWORDS,
                                     slot=np.arange(WAVES) // 4, wave_in_group=np.arange(WAVES) % 4)

    def wave_ids(self, w):
        return np.arange(WAVES)[w]

    def hazard(self, w, rows, message):
        raise HazardError(f"{message} (wave {int(self.wave_ids(w)[np.flatnonzero(rows)[0]])})")

    def read(self, waves, dwords, nbytes=4, lanes=64):
        """waves read 4-byte-aligned dwords[len(waves), 64] (byte address 4 * dword); lanes
        from `lanes` on are inactive (they take the numpy path)."""
        mask = np.broadcast_to(np.arange(64) < lanes, (len(waves), 64))
        return lds.read(self, np.asarray(waves), 4 * np.asarray(dwords), nbytes, mask, "ds_read")

    def write(self, waves, dwords, nbytes=4, lanes=64, seed=0):
        """waves write random bytes; returns the write's release(rows)."""
        mask = np.broadcast_to(np.arange(64) < lanes, (len(waves), 64))
        data = np.random.default_rng(seed).integers(0, 256, (len(waves), 64, nbytes), dtype=np.uint8)
        return lds.write(self, np.asarray(waves), 4 * np.asarray(dwords), data, mask, "ds_write")

    def write_done(self, waves, dwords, **kw):
        """A write whose lgkmcnt has retired."""
        self.write(waves, dwords, **kw)(np.arange(len(waves)))

    def barrier(self, slot):
        self.lds.arrive(np.flatnonzero(self.waves.slot == slot))


def _rows(*starts, span=64):
    """dwords[len(starts), 64]: lane l of row r at starts[r] + l % span."""
    return np.array([s + np.arange(64) % span for s in starts])


@pytest.mark.parametrize("compiled", PATHS)
def test_write_over_a_read_of_the_same_epoch_is_a_war(compiled):
    ex = _Ex(compiled)
    ex.read([0], _rows(0, span=16))                       # wave 0 reads dwords 0..15
    with pytest.raises(HazardError) as err:
        ex.write([1], _rows(15, span=1))                  # wave 1 writes dword 15
    assert str(err.value) == ("ds_write overwrites LDS address 0x3c (lane 0), which wave 0 of the workgroup "
                              "read, with no s_barrier in between (LDS race) (wave 1)")


@pytest.mark.parametrize("compiled", PATHS)
def test_write_next_to_a_read_or_in_another_workgroup_is_no_race(compiled):
    ex = _Ex(compiled)
    ex.read([0], _rows(0, span=16))
    ex.write([1], _rows(16, span=16))                     # adjacent dwords 16..31
    ex.write([4], _rows(0, span=16))                      # the same dwords in workgroup 1
    if compiled:
        assert len(ex.lds.reads) == 1                     # neither range met the read's: still deferred
    with pytest.raises(HazardError, match="0x0 .lane 0., which wave 0 of the workgroup read"):
        ex.write([2], _rows(0, span=16))                  # the read itself is still there


@pytest.mark.parametrize("compiled", PATHS)
def test_read_before_a_barrier_lets_any_wave_overwrite(compiled):
    ex = _Ex(compiled)
    ex.read([0, 1, 2, 3], _rows(0, 0, 8, 8, span=16))
    ex.barrier(0)
    ex.write([1], _rows(0, span=24))
    if compiled:
        assert not ex.lds.reads and (ex.lds.reader == -1).all()      # dropped, never marked


@pytest.mark.parametrize("compiled", PATHS)
def test_several_readers_then_a_reader_writes(compiled):
    ex = _Ex(compiled)
    ex.read([0, 1], _rows(0, 4, span=8))                  # dwords 4..7 read by both waves
    ex.write([0], _rows(0, span=4))                       # only wave 0 read dwords 0..3: its own
    with pytest.raises(HazardError) as err:
        ex.write([1], _rows(6, span=1))
    assert str(err.value) == ("ds_write overwrites LDS address 0x18 (lane 0), which other waves of the "
                              "workgroup read, with no s_barrier in between (LDS race) (wave 1)")


@pytest.mark.parametrize("compiled", PATHS)
def test_partial_lane_read_joins_the_deferred_one(compiled):
    ex = _Ex(compiled)
    ex.read([0], _rows(0, span=32))
    ex.read([1], _rows(0, span=32), lanes=20)             # dwords 0..19, numpy path (settles first)
    ex.write([0], _rows(20, span=12))                     # dwords 20..31: only wave 0 read them
    with pytest.raises(HazardError, match="0x4c .lane 0., which other waves of the workgroup read"):
        ex.write([0], _rows(19, span=1))


@pytest.mark.parametrize("compiled", PATHS)
def test_raw_and_waw_without_a_barrier(compiled):
    ex = _Ex(compiled)
    ex.write_done([1], _rows(8, span=4))
    with pytest.raises(HazardError) as err:
        ex.read([0], _rows(0, span=16), nbytes=8)
    assert str(err.value) == ("ds_read reads LDS address 0x20 (lane 7), which wave 1 of the workgroup wrote, "
                              "with no s_waitcnt lgkmcnt(0) + s_barrier in between (LDS race) (wave 0)")
    with pytest.raises(HazardError, match="ds_write writes LDS address 0x20 .lane 0., which wave 1 of the"):
        ex.write([2], _rows(8, span=4))
    ex.barrier(0)
    ex.write_done([2], _rows(8, span=4))                  # after the barrier: ordered


@pytest.mark.parametrize("compiled", PATHS)
def test_read_of_a_partial_lane_write_in_flight(compiled):
    ex = _Ex(compiled)
    ex.write([1], _rows(4, span=16), lanes=8)           # the numpy write path: dwords 4..11 in flight
    ex.read([2], _rows(12, span=16))                    # its neighbours: no race
    with pytest.raises(HazardError) as err:
        ex.read([0], _rows(0, span=16))
    assert str(err.value) == ("ds_read touches LDS address 0x10 (lane 4) that another wave wrote without "
                              "s_waitcnt lgkmcnt(0) + s_barrier in between (wave 0)")


def _random_run(seed: int, compiled: bool):
    """A random sequence of reads and writes (of one wave, mostly retired at once), mostly
    in each wave's own part of LDS, and barriers; returns (step, report) of the first
    report (or None) and every read's data."""
    rng = np.random.default_rng(seed)
    ex, pending, data = _Ex(compiled), [], []
    for step in range(60):
        kind = rng.choice(["read"] * 6 + ["write"] + ["barrier"] * 2)
        waves = np.sort(rng.choice(WAVES, 1 if kind == "write" else int(rng.integers(1, 5)), replace=False))
        span = int(rng.integers(1, 17))
        # mostly within the wave's own quarter of its workgroup's LDS, at times anywhere
        own = 16 * (waves % 4) + rng.integers(0, 17 - span, len(waves))
        starts = np.where(rng.random(len(waves)) < 0.85, own, rng.integers(0, DWORDS - 16, len(waves)))
        starts = np.minimum(starts, DWORDS - 1 - span)      # an 8-byte lane reads one dword more
        nbytes = int(rng.choice([4, 8]))
        lanes = 64 if rng.random() < 0.8 else int(rng.integers(1, 64))
        try:
            if kind == "read":
                data.append(ex.read(waves, _rows(*starts, span=span), nbytes, lanes))
            elif kind == "write":
                pending.append(ex.write(waves, _rows(*starts, span=span), nbytes, lanes, seed=step))
            if rng.random() < 0.9:
                for release in pending:
                    release(np.arange(1))
                pending.clear()
            if kind == "barrier":
                slot = int(rng.integers(0, SLOTS))
                if rng.random() < 0.8:
                    ex.barrier(slot)
                else:                                     # waves of one workgroup at different epochs
                    ex.lds.arrive(np.array([4 * slot + int(rng.integers(0, 4))]))
        except HazardError as err:
            return (step, str(err)), data
    return None, data


def test_random_sequences_report_the_same_on_both_paths():
    if fast.kernels() is None:
        pytest.skip("numba is not installed: no compiled path to compare")
    late_war = 0
    for seed in range(150):
        got, got_data = _random_run(seed, True)
        want, want_data = _random_run(seed, False)
        assert got == want, seed
        for a, b in zip(got_data, want_data):
            np.testing.assert_array_equal(a, b)
        late_war += want is not None and want[0] >= 10 and " overwrites " in want[1]
    assert late_war >= 30, late_war          # WAR reports after a history of deferred reads

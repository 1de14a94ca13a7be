"""fast.writes_settled (hazards.check_write's early return) against check_write's numpy path.

Both run on the same drawn register records: last-writer codes and clocks (VALU, DST_SEL,
XDL and non-XDL MFMA writers, some never written), MFMA srcC reads with and without their
passes filled in, wide-store data reads, and wave clocks from 2 behind to 30 ahead of them
(gaps below, at and above every rule's need). Where the numpy path reports a HazardError
the fast path must not claim the write settled (the numpy path then runs and reports the
same message); where it reports nothing, both must let the write through. Draws cover the
VALU and VMEM/DS writer classes and launches with no _Side record yet.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from gfxasm.emu import fast, hazards
from gfxasm.emu.errors import HazardError

pytestmark = pytest.mark.skipif(fast.kernels() is None,
                                reason="numba is not installed: no fast path to compare")

WAVES, REGS = 6, 12
CODES = np.array([hazards.NONE, hazards.VALU, hazards.TRANS, hazards.DST_SEL, hazards.ACCVGPR_WRITE,
                  hazards.MFMA_BASE + 2, hazards.MFMA_BASE + 4, hazards.MFMA_BASE + 8, hazards.MFMA_BASE + 16,
                  hazards.SMFMA_BASE + 8], np.int16)


class _Ex:
    """What hazards.check_write uses of an Executor."""

    def __init__(self, rng, klass: str, with_side: bool, compiled):
        shape = (WAVES, REGS)
        clock = rng.integers(100, 130, WAVES)
        # mostly long ago (settled), some within every rule's reach
        ago = np.where(rng.random(shape) < 0.9, rng.integers(14, 40, shape), rng.integers(-1, 14, shape))
        at = clock[:, None] - ago
        by = rng.choice(CODES, shape)
        self.waves = SimpleNamespace(written_at={"v": np.where(by == 0, -(1 << 40), at)},
                                     written_by={"v": by}, busy={"v": np.zeros(shape, np.int16)},
                                     recent={"v": [int(clock.max())] * REGS}, clock=clock)
        if with_side:
            side = hazards._side(self)
            now = clock[:, None]
            side.srcc_at["v"][:] = np.where(rng.random(shape) < 0.2, now - rng.integers(0, 20, shape),
                                            side.srcc_at["v"])
            side.srcc_passes["v"][:] = np.where(side.srcc_at["v"] > 0, rng.choice([0, 2, 4, 8, 16], shape), 0)
            side.store_at["v"][:] = np.where(rng.random(shape) < 0.1, now - rng.integers(0, 4, shape),
                                             side.store_at["v"])
            side.store_window["v"][:] = np.where(side.store_at["v"] > 0, 2, 0)
        self.strict, self.klass, self.fast = True, klass, compiled
        self.inst = SimpleNamespace(pc=0, text="(drawn)")

    def clocks(self, w):
        clock = self.waves.clock[w]
        return clock, int(clock.min()), int(clock.max())

    def wave_ids(self, w):
        return np.arange(WAVES)[w]

    def hazard(self, w, rows, message):
        raise HazardError(message)


def _outcome(ex, w, index, count):
    try:
        hazards.check_write(ex, "v", w, index, count)
    except HazardError as err:
        return str(err)
    return None


def test_writes_settled_agrees_with_the_numpy_path():
    compiled = fast.kernels()
    outcomes = [0, 0]            # draws let through, draws reported: both kinds must occur
    for seed in range(400):
        rng = np.random.default_rng(seed)
        klass = ("valu", "trans", "vmem", "ds")[seed % 4]
        with_side = seed % 5 != 0
        some = np.sort(rng.choice(WAVES, int(rng.integers(1, WAVES)), replace=False))
        w = slice(None) if seed % 3 == 0 else some
        index, count = int(rng.integers(0, REGS - 4)), int(rng.integers(1, 5))
        numpy_says = _outcome(_Ex(np.random.default_rng(seed), klass, with_side, None), w, index, count)
        ex = _Ex(np.random.default_rng(seed), klass, with_side, compiled)
        valu = klass in hazards.VALU_CLASSES
        side = getattr(ex.waves, "_hazard_side", None)
        records = ((side.srcc_at["v"], side.srcc_passes["v"], side.store_at["v"], side.store_window["v"])
                   if with_side else (ex.waves.written_at["v"], ex.waves.written_by["v"]) * 2)
        settled = compiled.writes_settled(ex.waves.written_at["v"], ex.waves.written_by["v"],
                                          hazards._WAW_NEED[valu], *records, with_side, valu, ex.wave_ids(w),
                                          index, count, ex.clocks(w)[0])
        assert not (settled and numpy_says), (seed, numpy_says)
        assert _outcome(ex, w, index, count) == numpy_says, seed
        outcomes[numpy_says is not None] += 1
    assert min(outcomes) >= 80, outcomes

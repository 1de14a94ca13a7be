"""The timing model's compute unit (gfxasm.perf.model.Cu) driven by a running emulator.

A module of its own because gfxasm.perf imports the emulator: timed.py imports this one
when a launch first asks for the timed schedule, not when the emulator is imported.
"""
from __future__ import annotations

from ..perf import model
from .state import EXEC_LO

LOGGED = {"vmem": "vm", "lds_dma": "vm", "ds": "lgkm", "smem": "lgkm"}   # where an op's completion goes


class LiveWave(model.Wave):
    """A model wave that stands for emulator wave `wave`."""
    __slots__ = ("wave",)


class LiveCu(model.Cu):
    """One workgroup's CU. Its waves' instructions are whatever the emulator executes:
    `head` moves when the emulator has run the instruction (timed.Timed._follow), and each
    sweep's issues are logged, with the completion cycle of the memory op each queued.
    No load scoreboard: only s_waitcnt holds a wave for its loads, as on hardware."""

    def __init__(self, static, prm, waves, **kw):
        super().__init__(static, prm, load_scoreboard=False, **kw)
        self.sgpr = waves.sgpr
        self.log: list = []                 # (LiveWave, completion cycle or None), issue order

    def lanes(self, wv) -> int:
        row = self.sgpr[wv.wave]
        return int(row[EXEC_LO]).bit_count() + int(row[EXEC_LO + 1]).bit_count()

    def advance(self, wv, i, klass, nxt):
        return nxt

    def issue(self, wv, t) -> None:
        counter = LOGGED.get(self.st[wv.head].klass)
        super().issue(wv, t)
        self.log.append((wv, None if counter is None else getattr(wv, counter)[-1]))

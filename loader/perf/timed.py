"""The hardware-like schedule: the timing model's per-CU cycle simulation picks the waves
that run and the times their loads land.

It lives in the timing model's package (the emulator imports nothing of gfxasm.perf):
importing this module registers it with the emulator as schedule "timed"
(gfxasm.emu.kernel.register_schedule), and gfxasm.perf imports it, so after
`import gfxasm.perf`, `launch(..., schedule="timed", strict=False)` puts each workgroup of a batch on a compute
unit of its own, simulated live by gfxasm.perf.model.Cu — the same rules the timing model
replays recorded streams with (model.py's docstring): 4 SIMDs (wave i of a workgroup on
SIMD i % 4), one issue slot per SIMD every `issue_quantum` cycles, at most one
instruction per category per slot, arbitration by s_setprio priority then age, VALU and
MFMA result latencies, a matrix pipe per SIMD, one LDS pipe per CU, the global pipe at
the CU's share of the bandwidth plus the loaded latency, s_barrier released
`barrier_cycles` after the last arrival. Slot by slot, the model says which waves issue
at that cycle; the emulator executes exactly those instructions, in the model's order
(waves of different CUs that issue in one slot at one pc run as one step), and the new
pcs are the model's next instructions. Every memory op the model issues completes at a
cycle it computes; the emulator lands it when the schedule's clock passes that cycle
(before the next instruction issued at or after it), in an order the ISA allows
(adversarial.landable; VMEM and DS complete in issue order in the model too).

Where it differs from the replay (simulate_cu), and why:
  * No scoreboard on load results: a wave's instruction that reads a register whose load
    has not completed issues anyway and sees the register's old value (the replay stalls
    it; on hardware only s_waitcnt waits), so a missing wait shows.
  * A memory instruction moves its active lanes' bytes (EXEC at issue), lanes outside a
    buffer's range included (the replay takes those from a trace); every global byte is
    charged at the HBM share (DRAM fraction 1), the clock is the peak one, the DRAM latency
    unloaded; the bandwidth share is that of min(workgroups in the batch, 256) active CUs.
  * Every workgroup of a batch is resident at once, one per CU, all CUs on one clock.

It is deterministic: the same launch gives the same order and the same bits.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from ..emu import adversarial
from ..emu.errors import EmulatorError
from ..emu.kernel import register_schedule
from ..emu.state import EXEC_LO
from . import model, params

LOGGED = {"vmem": "vm", "lds_dma": "vm", "ds": "lgkm", "smem": "lgkm"}   # where an op's completion goes


class LiveWave(model.Wave):
    """A model wave that stands for emulator wave `wave`."""
    __slots__ = ("wave",)


class LiveCu(model.Cu):
    """One workgroup's CU. Its waves' instructions are whatever the emulator executes:
    `head` moves when the emulator has run the instruction (Timed._follow), and each
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


class Timed:
    def __init__(self, program, waves):
        prm = params.DEFAULT
        self.static = model.prepare(program.insts, prm)
        self.program = program
        self.quantum = prm.issue_quantum
        self.branch_cycles = prm.branch_taken_cycles
        self.waves = waves
        slots = waves.slot
        count = int(slots.max()) + 1
        entry = program.by_pc[program.entry]
        self.cus = []
        for slot in range(count):
            cu = LiveCu(self.static, prm, waves, active_cus=min(params.NUM_CUS, count))
            members = []
            for n, wave in enumerate(np.flatnonzero(slots == slot).tolist()):
                wv = LiveWave(slot, n % params.SIMDS_PER_CU, n, 0.0, entry)   # age: wave order
                wv.wave = wave
                members.append(wv)
            cu.join(slot, members)
            self.cus.append(cu)
        self.next_sweep = [0.0] * count     # per CU, the cycle of its next issue slot to simulate
        self.now = 0.0                      # the cycle of the slot being executed
        self.plan: deque = deque()          # (pc, waves) steps of that slot, in the model's order
        self.moved: list = []               # model waves issued in that slot (their pcs move)
        self.issue_due: dict[int, float] = {}           # wave -> completion of its op of this slot
        self.due: dict[tuple[int, int], float] = {}     # (id(op), wave) -> landing cycle
        self.earliest = np.inf                          # min(due.values())

    # ------------------------------------------------------------------ wave order
    def pick(self, groups: dict) -> tuple[int, np.ndarray]:
        """The next step of the model's issue order: (pc, waves), taken out of `groups`."""
        if not self.plan:
            self._simulate()
        pc, w = self.plan.popleft()
        members = groups.get(pc)                  # sorted, as w is
        at = None if members is None else np.searchsorted(members, w)
        if at is None or at[-1] >= len(members) or not np.array_equal(members[at], w):
            raise EmulatorError(f"timed schedule: the timing model issues waves {w.tolist()} at pc {pc:#x}, "
                                f"where the emulator does not have them ready (internal error)")
        if len(w) < len(members):
            groups[pc] = np.delete(members, at)
        else:
            del groups[pc]
        return pc, w

    def _simulate(self) -> None:
        """Simulate issue slots, CU by CU, until one issues something: that slot's plan."""
        self._follow()
        q = self.quantum
        while not self.plan:
            now = min(self.next_sweep)
            if now == np.inf:
                raise EmulatorError("timed schedule: the timing model has no wave left to issue "
                                    "while the emulator has (internal error)")
            self.now = now
            logs = []
            for c, cu in enumerate(self.cus):
                if self.next_sweep[c] != now:
                    continue
                try:
                    next_t = cu.sweep(now)
                except RuntimeError as exc:          # the model's barrier deadlock
                    raise EmulatorError(f"timed schedule: {exc}") from exc
                # None or inf: the CU's waves have all ended
                self.next_sweep[c] = np.inf if next_t in (None, np.inf) else math.ceil(max(next_t, now + q) / q) * q
                if cu.log:
                    logs.append(cu.log)
                    cu.log = []
            self._plan(logs)

    def _plan(self, logs: list) -> None:
        """Steps from each CU's issue log of one slot: per CU in its order; the heads of the
        CUs' logs that stand at one pc run together (CUs share nothing but global memory)."""
        insts, heads = self.program.insts, [0] * len(logs)
        while True:
            live = [c for c in range(len(logs)) if heads[c] < len(logs[c])]
            if not live:
                return
            pc = insts[logs[live[0]][heads[live[0]]][0].head].pc
            waves = []
            for c in live:
                wv, due = logs[c][heads[c]]
                if insts[wv.head].pc == pc:
                    heads[c] += 1
                    waves.append(wv.wave)
                    self.moved.append(wv)
                    if due is not None:
                        self.issue_due[wv.wave] = due
            self.plan.append((pc, np.array(sorted(waves))))

    def _follow(self) -> None:
        """The model waves issued in the last slot move to the pcs the emulator took them to
        (a taken branch costs `branch_taken_cycles` more, as in the replay)."""
        by_pc, pcs, st = self.program.by_pc, self.waves.pc, self.static
        for wv in self.moved:
            if wv.done:
                continue
            i = wv.head
            wv.head = by_pc[int(pcs[wv.wave])]
            if st[i].klass == "branch" and wv.head != i + 1:
                wv.earliest += self.branch_cycles
        self.moved.clear()

    # ------------------------------------------------------------------ load landing
    def stepped(self, ex, inst, w) -> None:
        """After `inst` ran for waves `w`: stamp the ops it queued (the newest ones not yet
        stamped) with the completion cycle the model gave them."""
        for wave in ex.wave_ids(w).tolist():
            due = self.issue_due.pop(wave, self.now)
            for counter in ("vm", "lgkm"):
                for op in reversed(ex.waves.queues[counter][wave]):
                    key = (id(op), wave)
                    if key in self.due:
                        break
                    self.due[key] = due
                    if due < self.earliest:
                        self.earliest = due

    def land_some(self, ex) -> None:
        """Land every op whose completion cycle has passed, in an order the ISA allows."""
        if self.now < self.earliest:
            return
        for counter in ("vm", "lgkm"):
            for wave, queue in enumerate(ex.waves.queues[counter]):
                while queue:
                    position = self._due_first(wave, queue)
                    if self.due[(id(queue[position]), wave)] > self.now:
                        break
                    self.due.pop((id(queue[position]), wave))
                    ex.land_now(wave, counter, position)
        self.earliest = min(self.due.values(), default=np.inf)

    def _due_first(self, wave: int, queue) -> int:
        """Of the ops that may land first (adversarial.landable), the one due soonest."""
        return min(adversarial.landable(queue), key=lambda n: self.due[(id(queue[n]), wave)])

    def next_to_land(self, wave: int, queue) -> int:
        """s_waitcnt (or s_endpgm) lands the op due soonest."""
        position = self._due_first(wave, queue)
        self.due.pop((id(queue[position]), wave))
        return position


register_schedule("timed", Timed)

"""A hardware-like schedule: waves ordered by cycle clocks, loads landing after a latency.

`launch(..., schedule="timed", strict=False)` keeps one cycle clock per wave. The waves
whose clock is lowest run next (those of them standing at one pc run together); each
instruction advances its waves' clocks by its cost, and every memory op lands when the
clock passes its issue time plus its latency — VMEM and LDS DMA, DS and scalar loads each
with the timing model's latency (gfxasm.perf.params), in the order the ISA guarantees.
s_waitcnt moves a wave's clock on to the landing of the ops it waits for; s_barrier
releases a workgroup at its last wave's arrival plus the barrier latency. A register
read before its load lands sees the old value, as with the adversarial schedule.

This is an approximation of the timing model, not its per-CU simulation: costs are per
wave (an MFMA costs its passes, a VALU op its cycles, anything else one issue slot), with
no contention for issue slots, pipes or memory bandwidth, and no register scoreboard. What
it gives is the order hardware latencies make likely — an LDS DMA landing hundreds of
cycles after issue, a wave's next instruction a few cycles later — where the lockstep
schedule lands every load at its wait and the adversarial one at random.
"""
from __future__ import annotations

import numpy as np

from . import adversarial


class Timed:
    def __init__(self, program, slots: np.ndarray):
        from ..perf import params, stats          # perf imports the emulator: not at import time
        prm = params.DEFAULT
        q = prm.issue_quantum
        self.barrier_cycles = prm.barrier_cycles
        self.quantum = q
        vmem = prm.global_latency_ns * 1e-9 * prm.clock_hz
        latency = {"vmem": vmem, "lds_dma": vmem, "ds": prm.lds_latency, "smem": prm.smem_latency}
        cost = {"valu": prm.valu_cycles, "trans": prm.trans_cycles}
        self.cost, self.latency = {}, {}
        for inst in program.insts:
            k = stats.classify(inst)
            self.cost[inst.pc] = (params.CYCLES_PER_PASS * stats.mfma_passes(inst) if k == "mfma"
                                  else cost.get(k, q))
            self.latency[inst.pc] = latency.get(k, 0.0)
        self.slots = slots
        self.clock = np.zeros(len(slots))
        self.arrived = np.full(len(slots), -1.0)        # clock at s_barrier, -1: not waiting
        self.due: dict[tuple[int, int], float] = {}     # (id(op), wave) -> landing cycle
        self.earliest = np.inf                          # min(due.values())
        self.now = 0.0

    def pick(self, groups: dict) -> tuple[int, np.ndarray]:
        """The waves with the lowest clock (after releasing barriers): (pc, waves)."""
        self._released(groups)
        clock = self.clock
        pc, w = adversarial.group_of(groups, np.argmin, clock)
        self.now = clock[w].min()
        run = clock[w] < self.now + self.quantum
        if run.all():
            del groups[pc]
            return pc, w
        groups[pc] = w[~run]
        return pc, w[run]

    def _released(self, groups: dict) -> None:
        """Waves back in `groups` after s_barrier leave it at their workgroup's last arrival."""
        waiting = self.arrived >= 0
        if not waiting.any():
            return
        ready = np.concatenate(list(groups.values()))
        back = ready[waiting[ready]]
        for slot in np.unique(self.slots[back]):
            members = np.flatnonzero((self.slots == slot) & waiting)
            self.clock[members] = self.arrived[members].max() + self.barrier_cycles
            self.arrived[members] = -1.0

    def stepped(self, ex, inst, w) -> None:
        """After `inst` ran for waves `w`: stamp the op it issued (the newest ones not yet
        stamped; a landed op's stamp is removed), advance the clocks."""
        waves = ex.wave_ids(w)
        latency = self.latency[inst.pc]
        for counter in ("vm", "lgkm"):
            queues = ex.waves.queues[counter]
            for wave in waves:
                for op in reversed(queues[wave]):
                    key = (id(op), int(wave))
                    if key in self.due:
                        break
                    self.due[key] = self.clock[wave] + latency
                    self.earliest = min(self.earliest, self.due[key])
        if inst.name == "s_barrier":
            self.arrived[waves] = self.clock[waves]
        self.clock[waves] += self.cost[inst.pc]

    def land_some(self, ex) -> None:
        """Land every op whose landing cycle has passed, in an order the ISA allows."""
        if self.now < self.earliest:
            return
        for counter in ("vm", "lgkm"):
            for wave, queue in enumerate(ex.waves.queues[counter]):
                while queue:
                    position = self._due_first(wave, queue)
                    if self.due[(id(queue[position]), wave)] > self.now:
                        break
                    self._land(ex, wave, counter, position)
        self.earliest = min(self.due.values(), default=np.inf)

    def _due_first(self, wave: int, queue) -> int:
        """Of the ops that may land first (adversarial.landable), the one due soonest."""
        return min(adversarial.landable(queue), key=lambda n: self.due[(id(queue[n]), wave)])

    def _land(self, ex, wave: int, counter: str, position: int) -> None:
        self.due.pop((id(ex.waves.queues[counter][wave][position]), wave))
        ex.land_now(wave, counter, position)

    def next_to_land(self, wave: int, queue) -> int:
        """s_waitcnt lands the op due soonest; the wave waits until it has landed."""
        position = self._due_first(wave, queue)
        self.clock[wave] = max(self.clock[wave], self.due.pop((id(queue[position]), wave)))
        return position

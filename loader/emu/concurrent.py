"""Concurrent workgroups: a launch whose workgroups wait on each other through global memory.

`Kernel.launch(..., schedule="concurrent")` keeps up to the grid's resident capacity of
workgroups live at once in one process and interleaves them one instruction at a time
(the waves of one workgroup run in lockstep among themselves, as under the serial
schedule), so a workgroup spinning on a flag sees another workgroup's release. Workgroups
start in the serial order (x fastest); one beyond the capacity starts when a live one ends.
The order is fixed: round-robin over the live workgroups, one instruction each; with
`seed=N` it is drawn from N instead (a random live workgroup runs a random number of
instructions, the mean run length itself drawn per seed from 1 to ~300), for orders the
round-robin hides. The serial schedule stays the default: nothing changes for a launch
that does not ask for this one.

Resident capacity (`resident_capacity`): the emulated device is an MI355X, 256 CUs
(8 XCDs x 32), each holding as many workgroups as emu.occupancy's rule allows (LLVM's
gfx90a-class occupancy; the timing model reads the same rule). `resident=` overrides.

Memory model (strict, after LLVM's AMDGPUUsage "Memory Model GFX942" and its code-sequence
table; LLVM's SIMemoryLegalizer emits the same sequences for gfx950, whose feature set
extends gfx94x's: SICacheControl::create picks SIGfx940CacheControl for any target with
the GFX940 instructions. Not checked on hardware).
Cross-workgroup communication is ordered only by release/acquire pairs at agent scope:

  * An agent-scope atomic load is a load with sc1 (sc0 sc1: system); an atomic store a
    store with sc1. Read-modify-write atomics are atomic whatever their bits (they bypass
    the L1). Atomic accesses of several workgroups to the same bytes are no race; a plain
    access against another workgroup's atomic or plain store is, unless ordered.
  * Release sequences (C++'s, which LLVM's model follows): a read-modify-write atomic
    carries on what the location's previous atomic published, so an acquire that reads a
    value left by another workgroup's polling atomic (an add of 0) still acquires the
    release before it; an atomic store starts a new sequence.
  * Release (store atomic / atomicrmw release, agent): `buffer_wbl2 sc1`, then
    `s_waitcnt vmcnt(0)` retiring it, then the atomic store or atomicrmw. What a release
    publishes is exactly what its workgroup stored before a buffer_wbl2 sc1 that had
    retired when the release issued. A buffer_wbl2 while another wave of the workgroup
    still has stores in flight is a HazardError in strict mode (which of them the
    writeback covers is timing: they need s_waitcnt vmcnt(0) and s_barrier first).
  * Acquire (load atomic / atomicrmw acquire, agent): the atomic load (or returning
    atomic), `s_waitcnt vmcnt(0)` retiring it, then `buffer_inv sc1`. From the
    buffer_inv on, the workgroup is ordered after what the release that wrote the value
    it read had published. A buffer_inv issued while that load is still in flight
    acquires nothing (the load may complete after the invalidate).
  * buffer_wbl2 / buffer_inv without sc1 (workgroup scope, or no bits) order nothing
    across workgroups; a bare buffer_wbl2 (the text calls it enough "in the same agent",
    while the code sequences use sc1) and a buffer_inv with no bits are refused as
    unmodelled rather than guessed. The nt bit is a cache hint: no effect on ordering.

Values: every load reads memory as it is at issue (stores write at issue). So a plain
(non-sc1) poll of a flag sees the release too, where hardware may keep returning a stale L1
line; strict mode reports such a poll as a race with the flag's store instead. Where the
model departs from hardware (documented, not enforced): acquire is per workgroup (the other
waves of the acquiring workgroup need an s_barrier after the buffer_inv on hardware);
scalar loads are not tracked (the scalar cache is not coherent: a flag polled with s_load
is refused by nothing here); LDS spins of one workgroup's waves run in lockstep.

Deadlock: a workgroup is stalled when it has executed one s_sleep twice in the same state:
global memory at the same version (Memory.version, bumped by every store or atomic that
changes a byte), and its registers and LDS the same (a digest): it polled once more and
found nothing new (a counted delay loop changes its counter, so it is no spin). When every
live workgroup is stalled — the ones beyond the capacity cannot start — the launch is a
DeadlockError naming the workgroups and pcs; a spin without s_sleep runs into the launch's
wave-instruction bound, reported the same way. The serial schedule reports a spin that
cannot end (SpinWatch) instead of hanging.

Timeline (for gfxasm.perf.flagwait): per workgroup the wave-instructions it executed
outside spin-waits, the slot it took (the workgroup whose end freed it), and each acquire:
how far it had got, which workgroup released, and how far that one had got at the release.
"""
from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from . import occupancy, races
from .errors import DeadlockError, HazardError, LaunchError, UnsupportedInstruction
from .races import ATOMIC, ATOMIC_LOAD, ATOMIC_RETURN, ATOMIC_STORE, READ, WRITE

# Sleeps at one pc with global memory unchanged before the serial schedule calls it a deadlock.
SPIN_LIMIT = 64
_STORES = ("global_store", "buffer_store", "global_atomic", "buffer_atomic")


def resident_capacity(info, waves_per_group: int) -> int:
    """How many workgroups of this kernel the emulated device holds at once."""
    per_cu = occupancy.of_kernel(info, waves_per_group * occupancy.WAVE_SIZE).workgroups_per_cu
    if per_cu < 1:
        raise LaunchError(f"kernel {info.name}: one workgroup of {waves_per_group} waves with "
                          f"{occupancy.vgpr_alloc(info)} VGPRs does not fit on a CU")
    return per_cu * occupancy.NUM_CUS


def check_launch(seed, jobs, engine, workgroups, resident, trace) -> None:
    """Refuse what a concurrent launch cannot do."""
    if trace is not None:
        raise LaunchError("schedule='concurrent' takes no trace (the timing model's recorder expects one batch "
                          "of waves; the launch's timeline is what gfxasm.perf.flagwait times)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise LaunchError(f"seed must be None (round-robin) or an int >= 0 for schedule='concurrent', got {seed!r}")
    if jobs != 1 or engine != "processes":
        raise LaunchError("schedule='concurrent' runs in one process (its workgroups talk through memory): "
                          "jobs must be 1")
    if workgroups is not None:
        raise LaunchError("schedule='concurrent' runs the whole grid (a subset could wait on a workgroup left out)")
    if resident is not None and (isinstance(resident, bool) or not isinstance(resident, (int, np.integer))
                                 or resident < 1):
        raise LaunchError(f"resident must be an int >= 1, got {resident!r}")


def _groups_at(ex, waves) -> str:
    """"(x,y,z), ..." of the workgroups of `waves` (wave names are "workgroup (x,y,z) wave i")."""
    names = dict.fromkeys(ex.wave_names(int(i)).split(" wave ")[0].removeprefix("workgroup ") for i in waves)
    return ", ".join(names)


def spin_state(ex, w) -> tuple:
    """What a spinning wave's next poll depends on: global memory's version and a digest of
    the registers of the waves `w` and of their workgroups' LDS. The same state at the same
    s_sleep twice means the loop found nothing new."""
    waves = ex.waves
    digest = hashlib.blake2b(digest_size=16)
    for part in (waves.sgpr[w], waves.vgpr[w], waves.agpr[w], waves.scc[w], waves.lds[np.unique(waves.slot[w])]):
        digest.update(np.ascontiguousarray(part).data)
    return ex.memory.version, digest.digest()


class SpinWatch:
    """The serial schedule's deadlock report: waves that execute the same s_sleep
    SPIN_LIMIT times in the same state (spin_state) wait for something no wave of the
    launch will do before them (lockstep runs the lowest pc first; later batches start
    after this one ends)."""

    def __init__(self, ex):
        self.ex = ex
        self.at: dict[int, tuple[tuple, int]] = {}     # pc -> (state, sleeps in it)

    def slept(self, pc: int, w) -> None:
        state = spin_state(self.ex, w)
        last, count = self.at.get(pc, (None, 0))
        count = count + 1 if last == state else 1
        self.at[pc] = (state, count)
        if count >= SPIN_LIMIT:
            raise DeadlockError(
                f"kernel {self.ex.kernel_name}: workgroup(s) {_groups_at(self.ex, self.ex.wave_ids(w))} spin at "
                f"s_sleep pc {pc:#x} ({count} times in the same state, global memory unchanged): under the serial "
                f"schedule the workgroup they wait for does not run before them; launch with schedule='concurrent'")


# ---------------------------------------------------------------------- memory model
class FlagOrdering:
    """The concurrent schedule's memory model for races.GlobalAccesses (its `sync`):
    classifies sc1 accesses as atomic, and decides what releases publish and when an
    acquire takes effect (module docstring)."""

    orders = "no release (buffer_wbl2 sc1, s_waitcnt) / acquire (s_waitcnt, buffer_inv sc1) pair orders the two"

    def __init__(self, accesses, listener):
        self.accesses = accesses
        self.listener = listener              # the scheduler: progress(group), acquired(group, releases)
        self.fenced: dict[int, int] = {}      # group -> highest own epoch a retired buffer_wbl2 sc1 wrote back
        self.pending: dict[tuple[int, int], list] = {}   # (group, wave in it) -> [(pc, clock seen, releases)]
        # atomic record -> the releases it carries: (group, its progress then), for the timeline
        self.releases: dict[int, list] = {}

    def classify(self, ex, kind: int) -> int:
        if ex.inst.mods.get("sc1"):
            if kind == READ:
                return ATOMIC_LOAD
            if kind == WRITE:
                return ATOMIC_STORE
        return kind

    def _clock(self, group: int) -> dict:
        return self.accesses.clocks.setdefault(group, {group: 0})

    def synchronise(self, accesses, ex, w, rec: np.ndarray, kind: int) -> None:
        """An atomic access of this step: an atomic read notes what it may acquire (at the
        next buffer_inv sc1 after it lands); an atomic write is a release of what its
        workgroup had written back, and a read-modify-write one also carries on what the
        atomic it read from published (the release sequence)."""
        for r in rec.tolist():
            g = int(accesses.records[r, 0])
            seen: dict[int, int] = {}                 # what the atomics this one read from published
            releases: list = []
            for prior in accesses.prior_atomics(r):
                _merge(seen, accesses.snapshots.get(prior, {}))
                releases += self.releases.get(prior, [])
            if kind in (ATOMIC_RETURN, ATOMIC_LOAD) and seen:
                for wave in ex.wave_ids(w).tolist():
                    self.pending.setdefault((g, wave), []).append((ex.inst.pc, seen, releases))
            if kind in (ATOMIC, ATOMIC_RETURN, ATOMIC_STORE):
                snapshot = dict(self._clock(g))
                snapshot[g] = self.fenced.get(g, -1)
                own = [(g, self.listener.progress(g))] if snapshot[g] >= 0 else []   # it wrote something back
                if kind == ATOMIC_STORE:              # a store starts a new release sequence
                    seen, releases = {}, []
                accesses.snapshots[r] = _merge(dict(seen), snapshot)
                self.releases[r] = releases + own

    def write_back(self, ex, w):
        """buffer_wbl2 sc1 issues: what the workgroup stored so far is published by a
        release once this retires (returns its landing)."""
        g = int(ex.group_ids[ex.wave_ids(w)[0]])
        others = np.setdiff1d(np.arange(ex.waves.count), ex.wave_ids(w))
        for wave in others.tolist():
            busy = [op for op in ex.waves.queues["vm"][wave] if op.text.startswith(_STORES)]
            if busy and ex.strict:
                raise HazardError(f"buffer_wbl2 while wave {wave} of the workgroup still has a store in flight "
                                  f"(`{busy[0].text}` at pc {busy[0].pc:#x}): the writeback need not cover it "
                                  f"(s_waitcnt vmcnt(0) and s_barrier first) ({ex.where(int(ex.wave_ids(w)[0]))})")
        clock = self._clock(g)
        epoch = clock[g]
        clock[g] = epoch + 1                  # later stores are not covered by this writeback

        def land(rows):
            self.fenced[g] = max(self.fenced.get(g, -1), epoch)
        return land

    def invalidate(self, ex, w) -> None:
        """buffer_inv sc1 issues: acquire what the wave's completed atomic reads saw."""
        g = int(ex.group_ids[ex.wave_ids(w)[0]])
        clock = self._clock(g)
        queues = ex.waves.queues["vm"]
        for wave in ex.wave_ids(w).tolist():
            keep = []
            for pc, seen, releases in self.pending.pop((g, wave), []):
                if any(op.pc == pc for op in queues[wave]):
                    keep.append((pc, seen, releases))         # still in flight: not acquired yet
                    continue
                _merge(clock, seen)
                self.listener.acquired(g, releases)
            if keep:
                self.pending[(g, wave)] = keep


def _merge(clock: dict, other: dict) -> dict:
    """clock := the per-workgroup maximum of clock and other (vector clocks); returns clock."""
    for group, epoch in other.items():
        if clock.get(group, -1) < epoch:
            clock[group] = epoch
    return clock


def check_cache_control(inst) -> None:
    """The buffer_wbl2 / buffer_inv forms the model covers (families/cache.py)."""
    bits = {m for m in ("sc0", "sc1") if inst.mods.get(m)}
    if (inst.name == "buffer_wbl2" and "sc1" not in bits) or not bits:
        raise UnsupportedInstruction(
            f"`{inst.text}`: only buffer_wbl2 sc1 / sc0 sc1 and buffer_inv sc0 / sc1 / sc0 sc1 are modelled "
            f"(AMDGPUUsage's GFX942 code sequences); this form's scope is not settled")


# ---------------------------------------------------------------------- the schedule
@dataclass
class Wait:
    """An acquire: the waiting workgroup had done `at` wave-instructions (spins excluded);
    `releaser` had done `released_at` when it released."""
    at: int
    releaser: int
    released_at: int


@dataclass
class GroupTimeline:
    group: int                      # linear workgroup id (x fastest)
    started_after: int | None       # the workgroup whose end freed its slot (None: at launch)
    work: int = 0                   # wave-instructions outside spin-waits
    spin: int = 0                   # wave-instructions of spin-waits (from the first s_sleep to the acquire)
    waits: list = field(default_factory=list)


@dataclass
class Timeline:
    resident: int                   # the capacity the launch ran under
    groups: dict                    # linear id -> GroupTimeline


class _Slot:
    """One live workgroup."""

    def __init__(self, group: int, ex, steps, started_after):
        self.ex, self.steps = ex, steps
        self.line = GroupTimeline(group, started_after)
        self.raw = 0                    # wave-instructions executed
        self.pc = ex.program.entry
        self.spin_from: int | None = None   # raw count at the first s_sleep of the current wait
        self.sleep_state: tuple | None = None   # (pc, spin_state) at the last s_sleep
        self.sleeps = 0

    @property
    def work(self) -> int:
        return self.raw - self.line.spin

    def slept(self, pc: int) -> None:
        if self.spin_from is None:
            self.spin_from = self.raw
        state = (pc, spin_state(self.ex, slice(None)))
        if state == self.sleep_state:
            self.sleeps += 1
        else:
            self.sleep_state, self.sleeps = state, 1

    def stalled(self, version: int) -> bool:
        """Slept twice in the same state, and global memory has not changed since."""
        return self.sleeps >= 2 and self.sleep_state[1][0] == version


class _Order:
    """Which live workgroup runs next: round-robin (seed None) or drawn from the seed."""

    def __init__(self, seed):
        self.rng = None if seed is None else np.random.default_rng([seed, 0x636F6E63])
        self.mean = 1.0 if self.rng is None else 10.0 ** self.rng.uniform(0.0, 2.5)
        self.turn = 0
        self.current, self.left = None, 0

    def next(self, live: list) -> "_Slot":
        if self.rng is None:
            self.turn = (self.turn + 1) % len(live)
            return live[self.turn]
        if self.left <= 0 or self.current not in live:
            self.current = live[int(self.rng.integers(len(live)))]
            self.left = int(self.rng.geometric(1.0 / self.mean))
        self.left -= 1
        return self.current


class _Scheduler:
    def __init__(self, kernel, run_, groups, budget, seed, capacity, steps):
        self.kernel, self.run_, self.groups, self.budget = kernel, run_, groups, budget
        self.capacity, self.steps = capacity, steps
        self.order = _Order(seed)
        self.memory = run_.memory
        self.accesses = races.GlobalAccesses(self.memory, run_.strict, run_.group_name)
        self.accesses.sync = FlagOrdering(self.accesses, self)
        self.live: list[_Slot] = []
        self.by_group: dict[int, _Slot] = {}
        self.timeline = Timeline(capacity, {})

    # the memory model's questions
    def progress(self, group: int) -> int:
        return self.by_group[group].work

    def acquired(self, group: int, releases) -> None:
        slot = self.by_group[group]
        at = slot.work
        if slot.spin_from is not None:        # the wait ends here: its spin is not work
            at = slot.spin_from - slot.line.spin
            slot.line.spin += slot.raw - slot.spin_from
            slot.spin_from = None
        slot.line.waits += [Wait(at, releaser, released_at) for releaser, released_at in releases]

    def _start(self, index: int, started_after) -> None:
        ex = self.kernel.executor(self.run_, index, [self.groups[index]], self.accesses)
        slot = _Slot(index, ex, self.steps(ex), started_after)
        self.live.append(slot)
        self.by_group[index] = slot

    def run(self) -> tuple[int, Timeline]:
        self.memory.watch_values = True
        waiting = deque(range(len(self.groups)))
        executed, freed_by = 0, deque()
        while waiting or self.live:
            while waiting and len(self.live) < self.capacity:
                self._start(waiting.popleft(), freed_by.popleft() if freed_by else None)
            slot = self.order.next(self.live)
            try:
                slot.pc, w = next(slot.steps)
            except StopIteration:
                self.live.remove(slot)
                slot.line.work = slot.work
                self.timeline.groups[slot.line.group] = slot.line
                freed_by.append(slot.line.group)
                continue
            slot.raw += len(w)
            executed += len(w)
            if executed > self.budget:
                raise DeadlockError(f"kernel {slot.ex.kernel_name} exceeded {self.budget} wave-instructions under "
                                    f"the concurrent schedule (a spin without s_sleep, or a runaway loop); "
                                    f"{self._where(waiting)}")
            if slot.ex.control == "sleep":
                slot.slept(slot.pc)
                if all(s.stalled(self.memory.version) for s in self.live):
                    raise DeadlockError(f"kernel {slot.ex.kernel_name}: every live workgroup spins (s_sleep) on "
                                        f"global memory that none of them changes; {self._where(waiting)}")
        return executed, self.timeline

    def _where(self, waiting) -> str:
        live = "; ".join(f"workgroup {self.run_.group_name(s.line.group)} at pc {s.pc:#x}" for s in self.live)
        text = f"live: {live}"
        if waiting:
            text += (f"; {len(waiting)} workgroup(s) wait for a free slot (resident capacity {self.capacity}), "
                     f"first {self.run_.group_name(waiting[0])}")
        return text


def run(kernel, run_, groups, budget: int, seed, capacity: int, steps) -> tuple[int, Timeline]:
    """Run every workgroup of `groups` ((x, y, z), serial order) under the concurrent
    schedule; `steps(executor)` is kernel.steps. Returns (wave-instructions, Timeline)."""
    return _Scheduler(kernel, run_, groups, budget, seed, capacity, steps).run()

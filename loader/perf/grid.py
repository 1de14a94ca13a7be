"""The whole grid's time from the sampled compute unit (gfxasm.perf.grid; issue 13 (a), (b)).

estimate() emulates compute unit 0's first-round workgroups and simulates that CU. Scaling
its round to ceil(rounds) full rounds is wrong in two ways:

(a) not every workgroup does the sample's work: aiter's fused-MoE grid is moe_sorting's
    largest block count, and the blocks past num_valid_ids exit at once;
(b) a last round that only some CUs occupy is no full round: each of its CUs gets a larger
    share of the HBM (up to the per-CU limits of the CU model), and a CU that frees takes
    the next workgroup at once.

What this module does, with no parameter of its own:

1. `find_classes`: the grid's workgroup classes. Probe workgroups (the last one and
   evenly spaced ones, PROBES in all) run in the emulator's timing mode beside the sample;
   a class is the workgroups whose executed wave-instructions agree within SAME_WORK.
   Between two probes of different classes the boundary is located by probing evenly
   spaced workgroups between them (REFINE per emulator run, narrowing the gap ~REFINE
   times each run) down to adjacent workgroups, assuming one boundary between them (true
   of a padded grid: the used blocks come first in linear order). Between two probes of
   the same class every workgroup is taken to be of that class. An early-exit workgroup
   costs little to emulate. The sampled workgroups are classed the same way. Grids the
   probes split into more than MAX_CLASSES classes keep the sample scaling (`None`).
2. A class's time: `simulate` (the CU model at the clock and HBM load the run's own
   activity gives) of k of its workgroups resident on one CU while `active` CUs have
   work, its emulated workgroups (sampled or probed) taken in turn; the sample's own
   simulation is reused where the sample is one class.
3. `makespan`: a dispatch simulation. 256 CUs x workgroups_per_cu slots; workgroups in
   linear order go to the first free slot (slot-major at equal times: round-robin over
   the CUs, the model's dispatch assumption); a workgroup holds its slot for its class's
   time with k = the workgroups of its class on that CU. Pass 1 runs every class at the
   launch's CU count; pass 2 re-runs each workgroup's class with `active` = the mean
   number of busy CUs over its pass-1 lifetime (one fixed-point step), so a tail round
   that occupies few CUs is simulated with their HBM share.

A grid of one class in full rounds keeps rounds x the sample's round, bit for bit.
"""
from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from . import params as P
from .model import WaveStream, hbm_utilisation, simulate_cu
from .trace import record

PROBES = 4           # probe workgroups besides the sample: the last one and evenly spaced ones
REFINE = 15          # workgroups per emulator run while locating a class boundary
# relative difference of executed wave-instructions within one class: a GEMM's edge tiles
# run a few % fewer (2.4% in f4gemm_160x384's partial last column) and recur in every row
# of the grid, a pattern the boundary search does not follow; the sample stands for them
SAME_WORK = 0.10
MAX_CLASSES = 4      # more than this: the grid is not a few classes (sample scaling kept)
MAX_RUNS = 8         # emulator runs while locating boundaries (each narrows a gap ~REFINE x)


def workgroup_id(n: int, grid) -> tuple[int, int, int]:
    """(x, y, z) of the n-th workgroup in linear (dispatch) order."""
    gx, gy, _ = grid
    return n % gx, (n // gx) % gy, n // (gx * gy)


def linear_id(g, grid) -> int:
    gx, gy, _ = grid
    return g[0] + gx * (g[1] + gy * g[2])


def valu_alu_utilization(cu, prm: P.Params) -> float:
    """Vector-ALU busy fraction from VALU/transcendental ops (an MFMA's issue slot excluded)."""
    if not cu.cycles:
        return 0.0
    busy = sum(cu.valu_busy) - prm.issue_quantum * cu.issued.get("mfma", 0)
    return max(0.0, busy) / (len(cu.valu_busy) * cu.cycles)


def simulate(streams, insts, static, *, waves_per_group: int, groups_resident: int, prm: P.Params,
             dram_fraction: float, active_cus: int):
    """One CU running `streams` while `active_cus` CUs have work: (CuResult, clock_hz, rho,
    vector-ALU busy). The clock depends on how busy the chip is, and the busy fractions on
    the clock (memory rates are per second); the DRAM latency depends on how much of the
    HBM the launch uses, and that on the latency. Simulate at the peak clock and unloaded
    latency, then once more at the clock and HBM utilisation that pass's activity gives."""
    active_share = active_cus / P.NUM_CUS
    clock, rho = prm.clock_hz, 0.0
    for n in range(2):
        cu = simulate_cu(streams, insts, waves_per_group=waves_per_group, groups_resident=groups_resident,
                         prm=prm, dram_fraction=dram_fraction, active_cus=active_cus, static=static,
                         clock_hz=clock, dram_load=rho)
        alu = valu_alu_utilization(cu, prm)
        if n or not cu.cycles:
            break
        # one fixed-point step: the chip's DRAM demand at unloaded latency (under the CUs'
        # HBM share, so a <= ~1 and the latency at most about doubles) sets rho
        demand = active_cus * cu.dram_bytes * clock / cu.cycles
        rho = hbm_utilisation(demand, P.HBM_BYTES_PER_S * prm.hbm_efficiency, prm.dram_queue)
        clock = prm.sustained_clock(cu.mfma_utilization * active_share, alu * active_share)
        if clock == prm.clock_hz and rho == 0.0:
            break
    return cu, clock, rho, alu


@dataclass
class WorkgroupClass:
    instructions: int            # executed wave-instructions of one of its workgroups
    reps: list                   # its emulated representatives: per workgroup [(wave, stream, mem_lanes)]
    workgroups: int = 0          # how many of the grid's workgroups it has
    sampled: int = 0             # how many of them estimate() sampled

    def streams(self, k: int) -> list:
        """WaveStreams of k of its workgroups on one CU (representatives in turn)."""
        return [WaveStream(s, lanes, g, w) for g in range(k) for w, s, lanes in self.reps[g % len(self.reps)]]


@dataclass
class GridClasses:
    classes: list                # WorkgroupClass; class 0 is the first sampled workgroup's
    segments: list               # (first, end, class index): linear workgroup ranges, in order
    sample_work: int             # executed wave-instructions of the sampled workgroups
    probed: int                  # workgroups emulated besides the sample
    runs: int                    # emulator runs for them

    def class_of(self, n: int) -> int:
        i = bisect.bisect_right(self._firsts, n) - 1
        return self.segments[i][2]

    def __post_init__(self):
        self._firsts = [s[0] for s in self.segments]

    @property
    def sample_uniform(self) -> bool:
        """Every sampled workgroup is of class 0."""
        return all(not c.sampled for c in self.classes[1:])

    def scale(self) -> float:
        """Whole-grid counts (bytes, FLOPs, instructions) over the sample's: the workgroups of
        the sample's classes, weighted by their executed wave-instructions where the sample
        holds several. Classes the sample lacks are left out (a padded grid's early-exit
        blocks move next to nothing; the time counts every class)."""
        sampled = [c for c in self.classes if c.sampled]
        if len(sampled) == 1:
            return sampled[0].workgroups / sampled[0].sampled
        return sum(c.workgroups * c.instructions for c in sampled) / self.sample_work


def _per_group(tr) -> dict:
    """workgroup (x, y, z) -> (executed wave-instructions, [(wave, stream, mem_lanes)] in wave order)."""
    out: dict = {}
    for w, lanes in zip(tr.waves, tr.mem_lanes):
        n, waves = out.get(w["group"], (0, []))
        waves.append((w["wave"], w["stream"], lanes))
        out[w["group"]] = (n + len(w["stream"]), waves)
    return {g: (n, sorted(waves, key=lambda x: x[0])) for g, (n, waves) in out.items()}


def find_classes(kernel, grid, block, kernarg, buffers, sample_trace, sample_ids: list, *,
                 skip_mfma: bool = True) -> GridClasses | None:
    """The grid's workgroup classes (module docstring, 1); None where the sample scaling stays.
    skip_mfma: as the sample's timing run took it (the probes run the same way)."""
    total = grid[0] * grid[1] * grid[2]
    classes: list = []
    label: dict = {}

    def add(n: int, count: int, waves: list, sampled: bool) -> None:
        for c, cls in enumerate(classes):
            if abs(count - cls.instructions) <= SAME_WORK * max(count, cls.instructions):
                label[n] = c
                if sampled:
                    cls.reps.append(waves)
                    cls.sampled += 1
                return
        classes.append(WorkgroupClass(count, [waves], sampled=int(sampled)))
        label[n] = len(classes) - 1

    seen = _per_group(sample_trace)
    for n in sample_ids:
        add(n, *seen[workgroup_id(n, grid)], sampled=True)
    probed = runs = 0

    def probe(ids):
        nonlocal probed, runs
        ids = sorted(set(ids) - label.keys())
        if not ids:
            return
        tr = record(kernel, grid, block, kernarg, buffers, [workgroup_id(n, grid) for n in ids], detail=False,
                    skip_mfma=skip_mfma)
        probed, runs = probed + len(ids), runs + 1
        for g, (count, waves) in _per_group(tr).items():
            add(linear_id(g, grid), count, waves, sampled=False)

    probe([total - 1] + [total * i // PROBES for i in range(1, PROBES)])
    while True:
        known = sorted(label)
        gaps = [(a, b) for a, b in zip(known, known[1:]) if label[a] != label[b] and b - a > 1]
        if len(classes) > MAX_CLASSES or runs > MAX_RUNS:
            return None
        if not gaps:
            break
        probe([a + (b - a) * i // (REFINE + 1) for a, b in gaps for i in range(1, REFINE + 1)])
    segments = []
    for a, b in zip(known, known[1:] + [total]):
        if segments and segments[-1][2] == label[a]:
            segments[-1] = (segments[-1][0], b, label[a])
        else:
            segments.append((a, b, label[a]))
    for a, b, c in segments:
        classes[c].workgroups += b - a
    sample_work = sum(seen[workgroup_id(n, grid)][0] for n in sample_ids)
    return GridClasses(classes, segments, sample_work, probed, runs)


@dataclass
class Durations:
    """Seconds a workgroup of each class holds its slot: simulate() of k of its workgroups
    on one CU with `active` CUs busy; memoised (estimate() seeds the sample's own run)."""
    classes: GridClasses
    insts: list
    static: list
    waves_per_group: int
    prm: P.Params
    dram_fraction: float
    memo: dict = field(default_factory=dict)

    def __call__(self, c: int, k: int, active: int) -> float:
        key = (c, k, active)
        if key not in self.memo:
            cu, clock, _, _ = simulate(self.classes.classes[c].streams(k), self.insts, self.static,
                                       waves_per_group=self.waves_per_group, groups_resident=k, prm=self.prm,
                                       dram_fraction=self.dram_fraction, active_cus=active)
            self.memo[key] = cu.cycles / clock
        return self.memo[key]


def _dispatch(classes: GridClasses, total: int, per_cu: int, seconds_of) -> list:
    """Per workgroup (start, end, cu) with workgroups in linear order to the first free slot.
    seconds_of(n, class, k): how long workgroup n holds its slot, k = workgroups of its class
    on its CU once the workgroups dispatched at that instant are placed."""
    slots = [(0.0, j, cu) for j in range(per_cu) for cu in range(P.NUM_CUS)]
    heapq.heapify(slots)
    resident = [[] for _ in range(P.NUM_CUS)]        # per CU: [end, class] of its workgroups
    out = [None] * total
    n = 0
    while n < total:
        t = slots[0][0]
        batch = []
        while slots and slots[0][0] == t and len(batch) < total - n:
            batch.append(heapq.heappop(slots))
        placed = []
        for (_, j, cu), m in zip(batch, range(n, n + len(batch))):
            c = classes.class_of(m)
            entry = [math.inf, c]
            resident[cu] = [r for r in resident[cu] if r[0] > t] + [entry]
            placed.append((m, j, cu, c, entry))
        for m, j, cu, c, entry in placed:
            k = sum(1 for r in resident[cu] if r[1] == c)
            entry[0] = end = t + seconds_of(m, c, k)
            out[m] = (t, end, cu)
            heapq.heappush(slots, (end, j, cu))
        n += len(batch)
    return out


def _mean_busy_cus(lives: list):
    """f(start, end): the mean number of CUs holding a workgroup over [start, end)."""
    events: dict = {}
    for start, end, cu in lives:
        events.setdefault(start, []).append((cu, 1))
        events.setdefault(end, []).append((cu, -1))
    held = np.zeros(P.NUM_CUS, np.int64)
    times, busy = [], []
    for t in sorted(events):
        for cu, d in events[t]:
            held[cu] += d
        times.append(t)
        busy.append(int(np.count_nonzero(held)))
    times = np.array(times)
    area = np.concatenate([[0.0], np.cumsum(np.diff(times) * np.array(busy[:-1]))])

    def mean(start: float, end: float) -> float:
        if end <= start:
            return float(busy[bisect.bisect_right(times, start) - 1])
        return float(np.interp(end, times, area) - np.interp(start, times, area)) / (end - start)
    return mean


def makespan(classes: GridClasses, durations: Durations, total: int, per_cu: int, active_cus: int) -> float:
    """Seconds from the first dispatch to the last workgroup's end (module docstring, 3)."""
    first = _dispatch(classes, total, per_cu, lambda m, c, k: durations(c, k, active_cus))
    mean = _mean_busy_cus(first)
    active = {}
    for m, (start, end, _) in enumerate(first):
        key = (start, end)
        if key not in active:
            active[key] = max(1, min(P.NUM_CUS, round(mean(start, end))))
    second = _dispatch(classes, total, per_cu, lambda m, c, k: durations(c, k, active[first[m][:2]]))
    return max(end for _, end, _ in second)

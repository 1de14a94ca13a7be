"""`gfxasm.perf.estimate` (this module is gfxasm.perf.estimator): what a launch costs on one MI355X, from the code object alone.

    est = gfxasm.perf.estimate("x.co", grid=(gx, gy, gz), block=(512, 1, 1),
                               kernarg=kernarg_bytes, buffers=[q, k, v, o, lse])
    est.seconds, est.mfma_flops, est.dram_bytes, est.pct_peak_flops, est.pct_hbm

The launch arguments are those of `gfxasm.emu` (CPU tensors whose data_ptr() values the
kernarg holds). Only one compute unit's share is executed: occupancy (stats.occupancy)
says how many workgroups a CU holds at once; the workgroups compute unit 0 would run in
the first `sample_rounds` rounds (dispatch assumed round-robin over the 256 CUs in
linear workgroup order) run in the emulator's timing mode (trace.py); their wave
streams are replayed on the CU model (model.py); the CU's time per round is multiplied
by the number of rounds, ceil(ceil(workgroups / 256) / workgroups_per_cu), where every
workgroup does the sample's work in full rounds. Otherwise (grid.py: probe workgroups
find the grid's workgroup classes, e.g. a padded MoE grid's early-exit blocks; or the last
round is partial) the time is a dispatch simulation of the classes over the 256 CUs, a
partial round re-simulated on the CUs it occupies. With sample_rounds > 1 (a causal
kernel: workgroups differ round to round) the sample's rounds are scaled as before.

DRAM traffic: the distinct 128-byte lines the sampled workgroups touched in each buffer,
scaled to the whole grid (by its work, grid.GridClasses.scale, where workgroups differ)
and capped at the buffer's size (caches are assumed to catch all reuse across workgroups
— a lower bound on DRAM bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import grid as grid_mod
from . import lds_banks
from . import params as P
from .model import WaveStream, prepare
from .stats import analyze_kernel, classify, mfma_dtype, mfma_flops
from .trace import LINE, record


@dataclass
class Estimate:
    kernel: str
    seconds: float
    cycles_per_round: float
    rounds: int
    workgroups: int
    workgroups_per_cu: int
    simulated_workgroups: int
    mfma_flops: float                  # executed MFMA work (FLOP) over the whole grid
    mfma_dtype: str
    dram_bytes: float                  # estimated HBM traffic (distinct bytes touched)
    requested_global_bytes: float      # bytes all loads/stores request (before caches)
    lds_bytes: float
    mfma_utilization: float            # matrix-pipe busy fraction on the simulated CU
    valu_utilization: float            # vector-ALU busy fraction (VALU ops, MFMA issue excluded)
    clock_hz: float                    # the sustained engine clock the launch was modelled at
    hbm_utilization: float             # rho: the HBM's load while it runs (DRAM latency x 1/(1-rho))
    dynamic_mix: dict                  # class -> executed wave-instructions (whole grid)
    loop_iterations: dict              # loop head pc -> executed iterations per wave (max)
    stubbed: list                      # instructions the emulator lacks (timing stubs)
    launch_overhead_s: float
    # DS instructions, pc order: op, executions, mean LDS cycles per phase (1.0 = no
    # conflict), conflict cycles per execution (under lds_banks.DEFAULT, the range and each
    # phase hypothesis), whether the phase groups are measured (lds_banks.py) and whether
    # the instruction is in the hottest loop. Charged to the LDS pipe only when
    # params.lds_conflicts names a hypothesis (the calibrated set leaves them out).
    lds_conflicts: list = field(default_factory=list)
    # the grid's workgroup classes (grid.py), first the sample's: workgroups, executed
    # wave-instructions of one; empty where the sample's rounds are scaled (sample_rounds > 1)
    workgroup_classes: list = field(default_factory=list)
    params: P.Params = field(repr=False, default=None)
    modelled: bool = True

    @property
    def tflops(self) -> float:
        return self.mfma_flops / self.seconds / 1e12 if self.seconds else 0.0

    @property
    def pct_peak_flops(self) -> float:
        peak = P.PEAK_FLOPS.get(self.mfma_dtype)
        return 100.0 * self.mfma_flops / self.seconds / peak if peak and self.seconds else 0.0

    @property
    def pct_hbm(self) -> float:
        return 100.0 * self.dram_bytes / self.seconds / P.HBM_BYTES_PER_S if self.seconds else 0.0

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "params"}
        d.update(tflops=self.tflops, pct_peak_flops=self.pct_peak_flops, pct_hbm=self.pct_hbm)
        return d

    def summary(self) -> str:
        return (f"{self.kernel}: {self.seconds * 1e6:.1f} us (modelled), {self.tflops:.0f} TFLOP/s "
                f"({self.pct_peak_flops:.1f}% of {self.mfma_dtype} peak), DRAM {self.dram_bytes / 1e9:.3f} GB "
                f"({self.pct_hbm:.1f}% of HBM), MFMA pipe busy {100 * self.mfma_utilization:.1f}%, "
                f"clock {self.clock_hz / 1e9:.2f} GHz, "
                f"{self.rounds} round(s) x {self.cycles_per_round:.0f} cycles, "
                f"{self.workgroups_per_cu} WG/CU")


def format_lds_conflicts(est: Estimate, hottest_only: bool = True) -> str:
    """A table of the DS instructions' bank conflicts (the hottest loop's by default): conflict
    cycles per execution under each phase hypothesis of lds_banks (equal for measured ops)."""
    rows = [c for c in est.lds_conflicts if c["hottest_loop"] or not hottest_only]
    hyps = lds_banks.HYPOTHESES
    lines = [f"LDS bank conflicts ({'hottest loop' if hottest_only else 'all DS instructions'}; "
             f"* = phase groups a hypothesis, not measured; conflict cycles per execution)",
             f"  {'pc':>8} {'instruction':24} {'executions':>10} {'cycles/phase':>12} "
             + " ".join(f"{h:>14}" for h in hyps)]
    for c in rows:
        lines.append(f"  {c['pc']:>8} {c['op'] + ('' if c['measured_phases'] else ' *'):24} {c['executions']:10} "
                     f"{c['degree']:12.2f} " + " ".join(f"{c['by_hypothesis'][h]:14.2f}" for h in hyps))
    if not rows:
        lines.append("  (no DS instruction ran there)")
    ops = sorted({c["op"] for c in rows})
    for op in ops:
        sel = [c for c in rows if c["op"] == op]
        total = {h: sum(c["by_hypothesis"][h] * c["executions"] for c in sel) for h in hyps}
        lines.append(f"  {'total':>8} {op:24} {sum(c['executions'] for c in sel):10} {'':12} "
                     + " ".join(f"{total[h]:14.0f}" for h in hyps))
    return "\n".join(lines)


def _dims(v) -> tuple[int, int, int]:
    d = tuple(int(x) for x in (v if isinstance(v, (tuple, list)) else (v,)))
    return d + (1,) * (3 - len(d))


def representative_workgroups(grid, per_cu: int, rounds: int) -> list[tuple[int, int, int]]:
    """The workgroups compute unit 0 runs in its first `rounds` rounds."""
    gx, gy, gz = grid
    total = gx * gy * gz
    ids = []
    for r in range(rounds):
        for j in range(per_cu):
            n = (r * per_cu + j) * P.NUM_CUS
            if n < total:
                ids.append(n)
    return [(n % gx, (n // gx) % gy, n // (gx * gy)) for n in ids]


# Recent timing traces (the emulator run does not depend on the model's parameters, so a
# calibration that re-models the same launches with other parameters reuses them; it
# raises the size to the number of launches it holds).
_TRACES: dict = {}
TRACE_CACHE_SIZE = 8


def _ptr(buf) -> int:
    try:
        return int(buf.data_ptr())
    except AttributeError:
        return int(np.asarray(buf).__array_interface__["data"][0])


def _buffer_bytes(buf) -> int:
    try:
        return int(buf.untyped_storage().nbytes())
    except AttributeError:
        return int(np.asarray(buf).nbytes)


def estimate(co, grid, block, kernarg: bytes = b"", buffers=(), kernel: str | None = None, *,
             params: P.Params | None = None, sample_rounds: int = 1,
             workgroups_per_cu: int | None = None, skip_mfma: bool = True) -> Estimate:
    """Model one launch on an MI355X (see the module docstring). skip_mfma=False computes
    the MFMAs in every timing run (the sample's and the class search's), for a kernel whose
    control flow depends on their results: a stubbed MFMA leaves its destination as it was,
    which a later workgroup on the same registers sees as stale scores."""
    from .. import emu
    prm = params or P.DEFAULT
    grid, block = _dims(grid), _dims(block)
    k = co.kernel(kernel) if hasattr(co, "kernel") and not isinstance(co, (str, bytes)) else \
        emu.load(co).kernel(kernel)
    threads = block[0] * block[1] * block[2]
    st = analyze_kernel(k, threads)
    per_cu = workgroups_per_cu or max(1, st.occupancy.workgroups_per_cu)
    total = grid[0] * grid[1] * grid[2]
    per_cu_share = math.ceil(total / P.NUM_CUS)
    rounds = math.ceil(per_cu_share / per_cu)
    sample = max(1, min(sample_rounds, rounds))
    chosen = representative_workgroups(grid, per_cu, sample)
    key = (k.module.code_object.data, k.name, grid, block, bytes(kernarg),
           tuple(_ptr(b) for b in buffers), tuple(chosen), skip_mfma)
    tr, classes = _TRACES.get(key, (None, None))
    if tr is None:
        tr = record(k, grid, block, kernarg, buffers, chosen, skip_mfma=skip_mfma)
        ids = [grid_mod.linear_id(g, grid) for g in chosen]
        classes = grid_mod.find_classes(k, grid, block, kernarg, buffers, tr, ids,
                                        skip_mfma=skip_mfma) if sample == 1 else None
        _TRACES[key] = tr, classes
        while len(_TRACES) > TRACE_CACHE_SIZE:
            _TRACES.pop(next(iter(_TRACES)))

    # wave streams grouped by workgroup, in dispatch order
    gindex = {g: n for n, g in enumerate(chosen)}
    streams = [WaveStream(w["stream"], tr.mem_lanes[n], gindex[w["group"]], w["wave"])
               for n, w in enumerate(tr.waves)]
    insts = tr.insts
    static = prepare(insts, prm)

    # executed work of the sample
    counts = np.zeros(len(insts), np.int64)
    for w in tr.waves:
        counts += np.bincount(w["stream"], minlength=len(insts))
    flops_per = np.array([mfma_flops(i) if classify(i) == "mfma" else 0 for i in insts], np.float64)
    sim_flops = float(counts @ flops_per)
    dtypes: dict[str, float] = {}
    for n in np.flatnonzero(flops_per * counts):
        dt = mfma_dtype(insts[n])
        dtypes[dt] = dtypes.get(dt, 0.0) + flops_per[n] * counts[n]
    dtype = max(dtypes, key=dtypes.get) if dtypes else "bf16"
    mix: dict[str, int] = {}
    for n in np.flatnonzero(counts):
        c = classify(insts[n])
        mix[c] = mix.get(c, 0) + int(counts[n])

    scale = classes.scale() if classes else total / len(chosen)       # sample -> whole grid
    sizes = {f"buffers[{n}]": _buffer_bytes(b) for n, b in enumerate(buffers)}
    dram = 0.0
    buf_fraction = {}
    for name, lines in tr.touched.items():
        d = min(sizes.get(name, float("inf")), lines * LINE * scale)
        dram += d
        req = tr.requested.get(name, 0) * scale
        buf_fraction[name] = min(1.0, d / req) if req else 1.0
    # each memory instruction streams at the DRAM share of the buffers it touches: data read
    # once (Q, O) costs HBM bandwidth, data many workgroups re-read (K, V) hits the caches
    for n, names in tr.inst_buffers.items():
        if static[n].klass in ("vmem", "lds_dma"):
            static[n].dram_fraction = max(buf_fraction.get(b, 1.0) for b in names)
    for n, f in tr.in_range.items():
        static[n].in_range = f
    if prm.lds_conflicts is not None:
        if prm.lds_conflicts not in lds_banks.HYPOTHESES:
            raise ValueError(f"params.lds_conflicts must be None or one of {lds_banks.HYPOTHESES}, "
                             f"got {prm.lds_conflicts!r}")
        for n, c in tr.lds_conflicts.items():
            static[n].lds_extra = c.extra_per_execution(prm.lds_conflicts)
    requested = 0.0
    for n in np.flatnonzero(counts):
        s = static[n]
        if s.klass in ("vmem", "lds_dma"):
            requested += counts[n] * 64 * (s.bytes[0] + s.bytes[1]) * s.in_range
    requested *= scale
    dram_fraction = min(1.0, dram / requested) if requested else 0.0
    active_cus = min(P.NUM_CUS, total)

    cu, clock, rho, alu = grid_mod.simulate(streams, insts, static, waves_per_group=st.occupancy.waves_per_workgroup,
                                            groups_resident=per_cu, prm=prm, dram_fraction=dram_fraction,
                                            active_cus=active_cus)
    per_round = cu.cycles / sample
    overhead = prm.launch_overhead_us * 1e-6
    seconds = rounds * per_round / clock + overhead
    if classes and (len(classes.classes) > 1 or total % (P.NUM_CUS * per_cu)):
        durations = grid_mod.Durations(classes, insts, static, st.occupancy.waves_per_workgroup, prm, dram_fraction)
        if classes.sample_uniform:
            durations.memo[(0, len(chosen), active_cus)] = cu.cycles / clock   # the sample's own run
        seconds = grid_mod.makespan(classes, durations, total, per_cu, active_cus) + overhead

    # loops: iterations = times the back edge was taken + 1, per wave (max over waves)
    from .stats import find_loops
    loops = find_loops(insts)
    pc_index = {i.pc: n for n, i in enumerate(insts)}
    iters = {}
    for lp in loops:
        be = pc_index[lp.end]
        head = pc_index[lp.start]
        best = 0
        for w in tr.waves:
            s = w["stream"]
            taken = int(np.count_nonzero((s[:-1] == be) & (s[1:] == head)))
            if taken or np.any(s == head):
                best = max(best, taken + 1 if np.any(s == head) else 0)
        iters[f"{lp.start:#x}"] = best

    hot = st.hottest
    conflicts = [{"pc": f"{insts[n].pc:#x}", "op": insts[n].name, "executions": c.executions,
                  "degree": round(c.degree(), 3), "extra_cycles": round(c.extra_per_execution(), 3),
                  "extra_cycles_range": [round(v, 3) for v in c.bracket()],
                  "by_hypothesis": {h: round(c.extra_per_execution(h), 3) for h in lds_banks.HYPOTHESES},
                  "measured_phases": c.measured, "hottest_loop": bool(hot and hot.start <= insts[n].pc <= hot.end)}
                 for n, c in sorted(tr.lds_conflicts.items())]

    return Estimate(
        kernel=k.name, lds_conflicts=conflicts, seconds=seconds, cycles_per_round=per_round, rounds=rounds, workgroups=total,
        workgroups_per_cu=per_cu, simulated_workgroups=len(chosen), mfma_flops=sim_flops * scale,
        mfma_dtype=dtype, dram_bytes=dram, requested_global_bytes=requested,
        lds_bytes=cu.lds_bytes * scale, mfma_utilization=cu.mfma_utilization,
        valu_utilization=alu, clock_hz=clock, hbm_utilization=rho,
        dynamic_mix={k_: int(v * scale) for k_, v in mix.items()}, loop_iterations=iters,
        stubbed=tr.stubbed, launch_overhead_s=overhead, params=prm,
        workgroup_classes=[{"workgroups": c.workgroups, "instructions": c.instructions}
                           for c in (classes.classes if classes else [])])

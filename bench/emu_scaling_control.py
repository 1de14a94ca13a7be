"""The machine's own scaling, as the control for the parallel emulator's speed-up: N
processes that share nothing run the same fixed work at once, and each process's wall and
CPU seconds are compared with one process running it alone.

If a workload that shares nothing slows down with N the way the emulator's workers do, the
loss is the machine's (clock under all-core load, shared cache and memory bandwidth, the
VM's page handling), not the parallel engine's. The workloads:

  python     a pure-Python integer loop (no memory traffic: clock and scheduling only)
  numpy      a loop of numpy operations on (512, 64) arrays, the shape of one register
             across a lockstep batch of 512 waves (cache-resident: clock and L2)
  regfile    the same operations reading and writing rows of a (512, 512, 64) uint32
             "register file" (64 MiB, as the emulator's VGPR file for a batch), the access
             pattern of the emulator's operand gathers (L3 and memory bandwidth)
  touch      np.zeros(1 GiB) written one byte per page (the cost of first-touched pages,
             which the emulator's workers pay for their footprints and batch state)
  emulator   (--emulator) the first batch of the fmha_fwd launch --shape, run serially
             (jobs=1) in each of the N processes: the emulator's own work with none of the
             parallel engine's (no footprint shipped, no merging)

The iteration counts are calibrated once, in one process, to about --seconds each, and then
fixed for every N. Processes are forked from this one after the inputs exist and start
together at a barrier; this process waits and does nothing meanwhile. Slow-down = mean
per-process wall at N / wall at 1; the machine's efficiency at N = 1 / slow-down.
Writes a JSON (--out) and prints a table.

    python3 bench/emu_scaling_control.py --procs 1 4 8 16
    python3 bench/emu_scaling_control.py --procs 1 16 --workloads emulator --emulator
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

WORKLOADS = ("python", "numpy", "regfile", "touch")


def python_loop(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i & 0xFFFF
    return s


def numpy_loop(n: int) -> float:
    rng = np.random.default_rng(0)
    a, b, c = (rng.random((512, 64), dtype=np.float32) for _ in range(3))
    mask = rng.random((512, 64)) < 0.5
    for _ in range(n):
        d = a * b + c
        d = np.where(mask, d, a)
        e = d.view(np.uint32) >> 3
        a = np.take(d, np.arange(64)[::-1], axis=1)
        b = (e & 0xFF).astype(np.float32) * np.float32(1 / 256)      # stays in [0, 1): no overflow
    return float(a[0, 0])


REGFILE = None


def regfile_setup() -> None:
    """The process's own register file (allocated and filled before the clock starts)."""
    global REGFILE
    REGFILE = np.random.default_rng(0).integers(0, 2**32, (512, 512, 64), dtype=np.uint32)


def regfile_loop(n: int) -> int:
    f = REGFILE
    for i in range(n):
        r1, r2, r3 = (i * 7) % 512, (i * 13 + 5) % 512, (i * 29 + 11) % 512
        x = f[:, r1] + f[:, r2]
        f[:, r3] = np.where(x > f[:, r1], x, f[:, r2]) ^ (x >> 5)
    return int(f[0, 0, 0])


def touch(n: int) -> int:
    total = 0
    for _ in range(n):
        z = np.zeros(1 << 30, np.uint8)
        z[::4096] = 1
        total += int(z[::4096].sum())
        del z
    return total


def emulator_batch(n: int) -> int:
    """The first batch of the fmha_fwd launch of --shape, serially (bench/emu_parallel.py's
    call; n is always 1: a batch is already ~40 s); its wave-instructions."""
    _, _, _, counts, *_ = EMU_RUN(*EMU_INPUTS, 1, False, 1)
    return sum(counts)


EMU_RUN = None
EMU_INPUTS = None
FUNCS = dict(python=python_loop, numpy=numpy_loop, regfile=regfile_loop, touch=touch, emulator=emulator_batch)
SETUPS = dict(regfile=regfile_setup)


def _threads() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def _child(name, n, barrier, queue) -> None:
    fn = FUNCS[name]
    if name in SETUPS:
        SETUPS[name]()
    barrier.wait()
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn(n)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    queue.put(dict(wall=wall, user=ru1.ru_utime - ru0.ru_utime, system=ru1.ru_stime - ru0.ru_stime,
                   minor_faults=ru1.ru_minflt - ru0.ru_minflt, involuntary_switches=ru1.ru_nivcsw - ru0.ru_nivcsw,
                   threads=_threads()))


def run_together(name: str, n: int, procs: int) -> list[dict]:
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    children = [ctx.Process(target=_child, args=(name, n, barrier, queue)) for _ in range(procs)]
    for c in children:
        c.start()
    results = [queue.get() for _ in children]
    for c in children:
        c.join()
        if c.exitcode != 0:
            raise SystemExit(f"a control process failed (exit {c.exitcode})")
    return results


def calibrate(name: str, seconds: float) -> int:
    fn = FUNCS[name]
    if name in SETUPS:
        SETUPS[name]()
    n = 1
    while True:
        t0 = time.perf_counter()
        fn(n)
        took = time.perf_counter() - t0
        if took > 0.3:
            return max(1, round(n * seconds / took))
        n *= 4


def main() -> None:
    global EMU_RUN, EMU_INPUTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, "emulator"])
    ap.add_argument("--seconds", type=float, default=3.0, help="each workload's calibrated time alone")
    ap.add_argument("--emulator", action="store_true", help="build the emulator workload's inputs")
    ap.add_argument("--shape", default="4,64,8,8192", help="the emulator workload's batch,heads_q,heads_k,seq")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "emu_scaling_control.json"))
    args = ap.parse_args()
    if "emulator" in args.workloads:
        if not args.emulator:
            raise SystemExit("the emulator workload needs --emulator")
        import torch
        # the children call torch (the whole fmha_fwd op): a fork after torch's OpenMP pool
        # ran a parallel region hangs the child's first parallel region, so this process
        # uses one thread (the parallel engine's workers call no torch)
        torch.set_num_threads(1)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from emu_parallel import run_once
        from gfxasm.ops import fmha
        b, hq, hk, s = (int(x) for x in args.shape.split(","))
        g = torch.Generator().manual_seed(1)
        EMU_RUN = run_once
        EMU_INPUTS = tuple(torch.randn(b, s, h, fmha.HEAD_DIM, generator=g).to(torch.bfloat16) for h in (hq, hk, hk))
        # one-time costs (numba, the decode) in this process, before the forks
        q, k, v = EMU_INPUTS
        run_once(q[:, :256, :8].contiguous(), k[:, :256, :1].contiguous(), v[:, :256, :1].contiguous(), 1, False, None)
    rows = []
    print(f"{'workload':<9} {'procs':>5} {'iters':>9} {'wall s':>7} {'max s':>7} {'CPU s':>7} {'sys %':>6} "
          f"{'faults':>8} {'invol':>7} {'thr':>4} {'slow-down':>9} {'eff':>5}")
    for name in args.workloads:
        n = 1 if name == "emulator" else calibrate(name, args.seconds)
        alone = None
        for procs in args.procs:
            res = run_together(name, n, procs)
            wall = float(np.mean([r["wall"] for r in res]))
            cpu = float(np.mean([r["user"] + r["system"] for r in res]))
            system = float(np.mean([r["system"] for r in res]))
            alone = alone or wall
            row = dict(workload=name, procs=procs, iterations=n, mean_wall=wall, max_wall=max(r["wall"] for r in res),
                       mean_cpu=cpu, mean_system=system, mean_minor_faults=float(np.mean([r["minor_faults"] for r in res])),
                       mean_involuntary_switches=float(np.mean([r["involuntary_switches"] for r in res])),
                       max_threads=max(r["threads"] for r in res), slowdown=wall / alone, efficiency=alone / wall)
            rows.append(row)
            print(f"{name:<9} {procs:>5} {n:>9} {wall:>7.2f} {row['max_wall']:>7.2f} {cpu:>7.2f} "
                  f"{system / cpu:>6.1%} {row['mean_minor_faults']:>8.0f} {row['mean_involuntary_switches']:>7.0f} "
                  f"{row['max_threads']:>4} {row['slowdown']:>9.3f} {row['efficiency']:>5.2f}", flush=True)
    meta = dict(cpus=os.cpu_count(), affinity=len(os.sched_getaffinity(0)), machine=platform.machine(),
                python=platform.python_version(), numpy=np.__version__, load_average=os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"cpus {meta['cpus']} (affinity {meta['affinity']}), load average {meta['load_average']}")


if __name__ == "__main__":
    main()

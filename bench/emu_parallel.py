"""Emulator launches over several processes: the speed-up of gfxasm.emu's jobs=N (what
GFXASM_EMU_JOBS=N gives the ops) on fmha_fwd prefill launches, and the check that every
parallel run is bit for bit the serial one (out, LSE, wave_instructions).

For each shape, the launch runs serially (jobs=1) and then with each --jobs N; wall time
of the whole op call (host checks, the emulated launch, the parallel parent's merging),
best of --repeat, after one small untimed launch of the same kernel (so the serial time
holds no one-time costs: numba's compile or cache load, the decode). Speed-up = serial
time / parallel time; efficiency = speed-up / N.

A production shape takes an hour serially, so `--batches K` runs a prefix of its launch
instead: the first K batches (kernel.BATCH_WAVES waves each, in the serial order) for the
serial run and the first K x N batches with N jobs, K per process, so every row does the
same work per process. Then speed-up = N x serial time / time with N jobs (time per
batch, serial over parallel), the full launch's time is extrapolated as time per batch x
its batches, and the bit check covers what both runs computed: every element of out the
serial run wrote (out is poisoned with NaN) and its LSE, equal in the parallel run; and
wave-instructions per batch equal (exact for non-causal launches, whose batches are alike).

Each parallel row also says where its time went (gfxasm.emu.parallel.last_run): the pieces'
CPU seconds (sum) against the serial run's, their system CPU share and minor page faults,
the busiest process's wall seconds, the pool's start (the run's start to its first
piece's), the tail (the last piece's end to the run's end) and the parent's merging, and
the MB of footprint the pieces shipped.
Prints a table and writes bench/out/emu_parallel.json. The objects must be built (this
script does not build: the device machine has no clang, so `build/` is carried there).

    python3 bench/emu_parallel.py --jobs 2
    python3 bench/emu_parallel.py --jobs 4 8 16 --shapes 4,64,8,8192 --batches 1
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

import torch

import gfxasm
import gfxasm.emu as emu
from gfxasm.emu import kernel as emu_kernel
from gfxasm.emu import parallel
from gfxasm.ops import fmha

OUT = Path(__file__).resolve().parent / "out" / "emu_parallel.json"


def first_batches(grid, block, batches: int | None):
    """The launch's first `batches` batches of workgroups in serial order (x fastest), as
    launch(workgroups=...) takes them, and the launch's number of batches."""
    waves = math.ceil(block[0] * block[1] * block[2] / 64)
    per_batch = max(1, emu_kernel.BATCH_WAVES // waves)
    total = grid[0] * grid[1] * grid[2]
    if batches is None:
        return None, math.ceil(total / per_batch)
    n = min(total, batches * per_batch)
    return [(i % grid[0], i // grid[0] % grid[1], i // (grid[0] * grid[1])) for i in range(n)], \
        math.ceil(total / per_batch)


def run_once(q, k, v, jobs: int, causal: bool, batches: int | None):
    """(seconds, out, lse, wave_instructions of each launch, batches run, batches of the
    whole launch, the parallel run's stats) of one fmha_fwd call."""
    os.environ["GFXASM_EMU_JOBS"] = str(jobs)
    counts, sizes = [], []
    real = emu.Kernel.launch

    def counted(self, grid, block, *args, **kwargs):
        chosen, total = first_batches(grid, block, batches)
        if chosen is not None:
            kwargs["workgroups"] = chosen
        result = real(self, grid, block, *args, **kwargs)
        counts.append(result.wave_instructions)
        per_batch = max(1, emu_kernel.BATCH_WAVES // math.ceil(result.waves / result.workgroups))
        sizes.append((math.ceil(result.workgroups / per_batch), total))
        return result
    emu.Kernel.launch = counted
    parallel.last_run = None
    try:
        out = torch.full_like(q, float("nan"))
        started = time.perf_counter()
        _, lse = gfxasm.fmha_fwd(q, k, v, causal=causal, out=out, return_lse=True)
        seconds = time.perf_counter() - started
    finally:
        emu.Kernel.launch = real
    (ran, total), = sizes
    return seconds, out, lse, counts, ran, total, parallel.last_run


def same_where_serial_wrote(serial_out, serial_lse, out, lse) -> bool:
    """out and LSE equal bit for bit wherever the serial run wrote out (rows [B, S, H])."""
    wrote = ~serial_out.isnan().all(dim=-1)                     # [B, S, H]
    rows_lse = wrote.permute(0, 2, 1)                           # LSE is [B, H, S]
    return (wrote.any().item()
            and torch.equal(serial_out[wrote].view(torch.int16), out[wrote].view(torch.int16))
            and torch.equal(serial_lse[rows_lse].view(torch.int32), lse[rows_lse].view(torch.int32)))


def where_time_went(stats, serial_cpu: float) -> dict:
    """The parallel run's stats as the table's columns (serial_cpu: the serial run's CPU
    seconds for as many batches)."""
    timed = [] if stats is None else [p for p in stats.pieces if p[3] is not None]
    if not timed:
        return {}
    busy = defaultdict(float)
    for _, _, pid, _, wall, *_ in timed:
        busy[pid] += wall
    first = min(p[3] for p in timed)
    last = max(p[3] + p[4] for p in timed)
    cpu = sum(p[5] for p in timed)
    system = sum(p[6] for p in timed)
    faults = sum(p[7] for p in timed)
    return dict(pieces=len(stats.pieces), processes=len(busy), piece_cpu=cpu,
                piece_cpu_over_serial=cpu / serial_cpu, piece_system_cpu=system, minor_faults=faults,
                busiest_process=max(busy.values()), pool_start=first - stats.started,
                tail=stats.started + stats.seconds - last, take=stats.take_seconds, reruns=stats.reruns,
                footprint_mb=sum(p[8] for p in stats.pieces) / 2**20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[2])
    ap.add_argument("--shapes", nargs="+", default=["1,8,1,2048"], help="batch,heads_q,heads_k,seq (seq_q = seq_k)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--batches", type=int, default=None,
                    help="run the first K batches serially and K x N with N jobs (default: the whole launch)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    rows = []
    print(f"{'shape':<14} {'jobs':>4} {'batches':>9} {'wave-insts':>12} {'seconds':>8} {'s/batch':>8} "
          f"{'speed-up':>8} {'eff':>5} {'full launch':>11}  bits   where the time went")
    for shape in args.shapes:
        b, hq, hk, s = (int(x) for x in shape.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(b, s, h, fmha.HEAD_DIM, generator=g).to(torch.bfloat16) for h in (hq, hk, hk))
        # one-time costs (numba's compile or cache load, the decode) outside the serial time
        # (fast.MIN_WAVES waves at least, so that the compiled paths run: 8 workgroups of 8 waves)
        run_once(q[:, :256, :8].contiguous(), k[:, :256, :1].contiguous(), v[:, :256, :1].contiguous(), 1,
                 args.causal, None)
        serial = None
        for jobs in [1] + args.jobs:
            batches = None if args.batches is None else args.batches * jobs
            best = None
            for _ in range(args.repeat):
                cpu = time.process_time()
                seconds, out, lse, counts, ran, total, stats = run_once(q, k, v, jobs, args.causal, batches)
                cpu = time.process_time() - cpu
                if best is None or seconds < best[0]:
                    best = (seconds, out, lse, counts, ran, total, stats, cpu)
            seconds, out, lse, counts, ran, total, stats, cpu = best
            if serial is None:
                serial = best
            per_batch = seconds / ran
            if args.batches is None:
                same = (torch.equal(out.view(torch.int16), serial[1].view(torch.int16))
                        and torch.equal(lse.view(torch.int32), serial[2].view(torch.int32)) and counts == serial[3])
            else:
                same = (same_where_serial_wrote(serial[1], serial[2], out, lse)
                        and sum(counts) * serial[4] == sum(serial[3]) * ran)
            speedup = (serial[0] / serial[4]) / per_batch
            went = where_time_went(stats, serial[7] / serial[4] * ran)    # serial CPU for as many batches
            row = dict(shape=shape, causal=args.causal, jobs=jobs, batches=ran, launch_batches=total,
                       wave_instructions=sum(counts), seconds=seconds, seconds_per_batch=per_batch,
                       speedup=speedup, efficiency=speedup / jobs, full_launch_seconds=per_batch * total,
                       bit_identical=same, cpu_seconds=cpu, **went)
            rows.append(row)
            note = ("" if not went else
                    f"pieces {went['pieces']} in {went['processes']} proc, "
                    f"CPU {went['piece_cpu_over_serial']:.2f}x serial's "
                    f"({went['piece_system_cpu'] / went['piece_cpu']:.0%} system, "
                    f"{went['minor_faults'] / went['pieces'] / 1e3:.0f}k page faults a piece), "
                    f"busiest {went['busiest_process']:.1f}s, start {went['pool_start']:.2f}s, "
                    f"tail {went['tail']:.2f}s, take {went['take']:.2f}s, {went['footprint_mb']:.0f} MB, "
                    f"reruns {went['reruns']}")
            print(f"{shape:<14} {jobs:>4} {f'{ran}/{total}':>9} {sum(counts):>12} {seconds:>8.2f} {per_batch:>8.2f} "
                  f"{speedup:>8.2f} {speedup / jobs:>5.2f} {per_batch * total / 60:>9.1f}m  "
                  f"{'same' if same else 'DIFF'}   {note}", flush=True)
    meta = dict(cpus=os.cpu_count(), machine=platform.machine(), load_average=os.getloadavg(),
                python=platform.python_version(), batches_per_process=args.batches)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"cpus {meta['cpus']}, load average {meta['load_average']}")
    if not all(r["bit_identical"] for r in rows):
        raise SystemExit("a parallel run differs from the serial one")


if __name__ == "__main__":
    main()

"""Emulator launches over several processes: the speed-up of gfxasm.emu's jobs=N (what
GFXASM_EMU_JOBS=N gives the ops) on fmha_fwd prefill launches, and the check that every
parallel run is bit for bit the serial one (out, LSE, wave_instructions).

For each shape, the launch runs serially (jobs=1) and then with each --jobs N; wall time
of the whole op call (host checks, the emulated launch, the parallel parent's merging),
best of --repeat. Speed-up = serial time / parallel time; efficiency = speed-up / N.
Prints a table and writes bench/out/emu_parallel.json. The objects must be built (this
script does not build: the device machine has no clang, so `build/` is carried there).

    python3 bench/emu_parallel.py --jobs 2
    python3 bench/emu_parallel.py --jobs 16 --shapes 1,8,1,2048 1,64,8,2048
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

import gfxasm
import gfxasm.emu as emu
from gfxasm.ops import fmha

OUT = Path(__file__).resolve().parent / "out" / "emu_parallel.json"


def run_once(q, k, v, jobs: int, causal: bool):
    """(seconds, out, lse, wave_instructions of each launch) of one fmha_fwd call."""
    os.environ["GFXASM_EMU_JOBS"] = str(jobs)
    counts = []
    real = emu.Kernel.launch

    def counted(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        counts.append(result.wave_instructions)
        return result
    emu.Kernel.launch = counted
    try:
        out = torch.full_like(q, float("nan"))
        started = time.perf_counter()
        _, lse = gfxasm.fmha_fwd(q, k, v, causal=causal, out=out, return_lse=True)
        seconds = time.perf_counter() - started
    finally:
        emu.Kernel.launch = real
    return seconds, out, lse, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[2])
    ap.add_argument("--shapes", nargs="+", default=["1,8,1,2048"], help="batch,heads_q,heads_k,seq (seq_q = seq_k)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    rows = []
    print(f"{'shape':<18} {'jobs':>4} {'wave-insts':>12} {'seconds':>9} {'speed-up':>9} {'efficiency':>10}  bits")
    for shape in args.shapes:
        b, hq, hk, s = (int(x) for x in shape.split(","))
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(b, s, h, fmha.HEAD_DIM, generator=g).to(torch.bfloat16) for h in (hq, hk, hk))
        serial = None
        for jobs in [1] + args.jobs:
            best = None
            for _ in range(args.repeat):
                seconds, out, lse, counts = run_once(q, k, v, jobs, args.causal)
                best = seconds if best is None else min(best, seconds)
            if serial is None:
                serial = (best, out, lse, counts)
            same = (torch.equal(out.view(torch.int16), serial[1].view(torch.int16))
                    and torch.equal(lse.view(torch.int32), serial[2].view(torch.int32)) and counts == serial[3])
            speedup = serial[0] / best
            row = dict(shape=shape, causal=args.causal, jobs=jobs, wave_instructions=sum(counts), seconds=best,
                       speedup=speedup, efficiency=speedup / jobs, bit_identical=same)
            rows.append(row)
            print(f"{shape:<18} {jobs:>4} {sum(counts):>12} {best:>9.2f} {speedup:>9.2f} {speedup / jobs:>10.2f}  "
                  f"{'same' if same else 'DIFFERENT'}")
    meta = dict(cpus=os.cpu_count(), machine=platform.machine(), load_average=os.getloadavg(),
                python=platform.python_version())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"cpus {meta['cpus']}, load average {meta['load_average']}")
    if not all(r["bit_identical"] for r in rows):
        raise SystemExit("a parallel run differs from the serial one")


if __name__ == "__main__":
    main()

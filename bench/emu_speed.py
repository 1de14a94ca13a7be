"""Emulator speed: wave-instructions per second of gfxasm.emu in strict mode.

Three microkernels (an MFMA loop, a VALU loop, a memory loop) at 64, 256 and 512 waves
(workgroups of 256 threads = 4 waves), and one real kernel: the FMHA conformance case
fmha_fwd(1, 8, 1, 256, 512) of tests/conformance/cases.py (aiter's hardware-proven
fwd_hd128_bf16.co). Each measurement is the best of `--repeat` launches (the machine
may be shared; the best run is the least disturbed), by wall time and by process CPU
time (less sensitive to other processes on the core). `--only fmha_issue12` adds the FMHA
shape issue 12 quoted (B1 Hq8/Hk2 S1024, 256 waves). The emulator's compiled bookkeeping
(gfxasm.emu.fast) runs when numba is installed, for launches of at least
fast.MIN_WAVES waves; GFXASM_EMU_NUMBA=0 measures the numpy paths alone (the JSON says
which). Prints a table and writes bench/out/emu_speed.json.
Every row carries a checksum (sha256 of every buffer's bytes after each launch; the
repeats must agree; the microkernels store nothing, so theirs only shows the buffer is
left untouched — the FMHA rows are the real test): `--check OLD.json` compares them with
an earlier run's rows of the same kernel and wave count and exits 1 on any difference, so
a speed change can be shown to leave results bit for bit unchanged. Measure on one core:

    taskset -c 0 python3 bench/emu_speed.py
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

import gfxasm.emu as emu
from gfxasm.emu import fast as emu_fast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))      # run as a script: the tests' kernel writer and recipes

from tests.conformance import cases  # noqa: E402
from tests.kernel_source import assemble as assemble_source  # noqa: E402
from tests.kernel_source import kernel_source  # noqa: E402
OUT = ROOT / "bench" / "out" / "emu_speed.json"


def checksum(buffers) -> str:
    """sha256 over the bytes of every buffer, in order."""
    h = hashlib.sha256()
    for buf in buffers:
        h.update(buf.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _one_sum(sums: list[str], what: str) -> str:
    if len(set(sums)) != 1:
        raise SystemExit(f"{what}: the repeats gave different results ({sums})")
    return sums[0]

# Common prologue: s[4:5] = buffer, s10 = iterations, v1 = lane byte offset (16 B/lane,
# within one wave's 1 KiB), v2 = this work-item's LDS byte offset (16 B per work-item).
_PROLOGUE = """
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_load_dword s10, s[0:1], 0x8
  v_and_b32 v2, 0x3ff, v0
  v_lshlrev_b32 v2, 4, v2
  v_and_b32 v1, 63, v0
  v_lshlrev_b32 v1, 4, v1
  s_waitcnt lgkmcnt(0)
"""

MFMA_BODY = _PROLOGUE + """
{init}
  s_nop 4
L_loop:
{mfmas}
  s_sub_u32 s10, s10, 1
  s_cmp_lg_u32 s10, 0
  s_cbranch_scc1 L_loop
  s_nop 7
  s_nop 7
  s_nop 7
"""


def _mfma_body() -> str:
    init = [f"  v_mov_b32 v{r}, 0x3f803f80" for r in range(8, 16)]       # bf16 1.0 pairs
    init += [f"  v_accvgpr_write_b32 a{r}, 0" for r in range(32)]
    # 8 independent accumulating 4-pass XDL MFMAs (srcC = vdst: no wait states between
    # iterations, as in a GEMM main loop).
    mfmas = [f"  v_mfma_f32_16x16x32_bf16 a[{4 * i}:{4 * i + 3}], v[8:11], v[12:15], a[{4 * i}:{4 * i + 3}]"
             for i in range(8)]
    return MFMA_BODY.format(init="\n".join(init), mfmas="\n".join(mfmas))


def _valu_body() -> str:
    init = [f"  v_mov_b32 v{r}, 1.0" for r in range(8, 24)]
    ops = []
    for i in range(2):
        b = 8 + 8 * i
        ops += [f"  v_fma_f32 v{b}, v{b + 1}, 0.5, v{b}",
                f"  v_add_f32 v{b + 1}, v{b + 2}, v{b + 3}",
                f"  v_mul_f32 v{b + 2}, v{b + 3}, 1.0",
                f"  v_and_b32 v{b + 3}, 0x7fffffff, v{b + 4}",
                f"  v_lshlrev_b32 v{b + 4}, 0, v{b + 5}",
                f"  v_max_f32 v{b + 5}, v{b + 6}, v{b + 7}",
                f"  v_cvt_f32_u32 v{b + 6}, v1",
                f"  v_add_u32 v{b + 7}, v{b + 7}, 0"]
    return _PROLOGUE + "\n".join(init) + "\n  s_nop 1\nL_loop:\n" + "\n".join(ops) + """
  s_sub_u32 s10, s10, 1
  s_cmp_lg_u32 s10, 0
  s_cbranch_scc1 L_loop
"""


def _mem_body() -> str:
    return _PROLOGUE + """
  s_mov_b32 s6, 1024
  s_mov_b32 s7, 0x00020000
  s_nop 1
L_loop:
  global_load_dwordx4 v[8:11], v1, s[4:5]
  buffer_load_dwordx4 v[12:15], v1, s[4:7], 0 offen
  global_load_dword v16, v1, s[4:5] offset:4
  s_waitcnt vmcnt(0)
  ds_write_b128 v2, v[8:11]
  ds_write_b32 v2, v16 offset:4096
  s_waitcnt lgkmcnt(0)
  ds_read_b128 v[20:23], v2
  ds_read_b32 v17, v2 offset:4096
  s_waitcnt lgkmcnt(0)
  s_sub_u32 s10, s10, 1
  s_cmp_lg_u32 s10, 0
  s_cbranch_scc1 L_loop
"""


MICRO = {"mfma": (_mfma_body, 0), "valu": (_valu_body, 0), "mem": (_mem_body, 8192)}

def assemble(name: str) -> bytes:
    make, lds = MICRO[name]
    return assemble_source(kernel_source(f"speed_{name}", make() + "\n  s_endpgm", args=("buf", ("iters", 4)),
                                         lds=lds, vgprs=256, accum_offset=128, sgprs=32, max_workgroup=256))


def run_micro(name: str, waves: int, iters: int, repeat: int) -> dict:
    kernel = emu.load(assemble(name)).kernel(f"speed_{name}")
    buf = torch.zeros(256, dtype=torch.int32)
    kernarg = struct.pack("<QI", buf.data_ptr(), iters)
    times, cpu, sums, count = [], [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = kernel.launch(grid=(waves // 4, 1, 1), block=(256, 1, 1), kernarg=kernarg, buffers=[buf])
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        sums.append(checksum([buf]))
        count = res.wave_instructions
    best = min(times)
    return {"kernel": name, "waves": waves, "iters": iters, "wave_instructions": count,
            "checksum": _one_sum(sums, name),
            "seconds": best, "seconds_all": times,
            "cpu_seconds": min(cpu), "cpu_seconds_all": cpu, "wips": count / best, "wips_cpu": count / min(cpu)}


# name: fmha_fwd arguments (B, Hq, Hk, Sq, Sk). "fmha" is the default case; "fmha_issue12"
# is the shape issue 12 quoted (B1 Hq8/Hk2 S1024, 256 waves): 128 waves a step instead of
# 32, so the per-step cost is spread over 4x the wave-instructions.
FMHA_CASES = {"fmha": (1, 8, 1, 256, 512), "fmha_issue12": (1, 8, 2, 1024, 1024)}


def run_fmha(repeat: int, shape=FMHA_CASES["fmha"]) -> dict:
    times, cpu, sums, count = [], [], [], 0
    for _ in range(repeat):
        case = cases.fmha_fwd(*shape)
        kernel = emu.load(case.path).kernel(case.symbol)
        t0, c0 = time.perf_counter(), time.process_time()
        res = kernel.launch(grid=case.grid, block=case.block, kernarg=case.kernarg, buffers=case.buffers,
                            strict=True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        case.check()
        sums.append(checksum(case.buffers))
        count = res.wave_instructions
    best = min(times)
    name = "fmha_fwd(" + ",".join(map(str, shape)) + ")"
    return {"kernel": name, "waves": res.waves, "iters": None, "wave_instructions": count,
            "checksum": _one_sum(sums, name), "seconds": best, "seconds_all": times,
            "cpu_seconds": min(cpu), "cpu_seconds_all": cpu, "wips": count / best, "wips_cpu": count / min(cpu)}


def _row(r):
    print(f"{r['kernel']:28s} {r['waves']:6d} {r['wave_instructions']:11d} {r['seconds']:8.3f} "
          f"{r['cpu_seconds']:8.3f} {r['wips'] / 1e6:16.3f} {r['wips_cpu'] / 1e6:15.3f}  "
          f"{r['checksum'][:16]}", flush=True)


def compare(rows, old_path: str) -> int:
    """Rows whose checksum differs from old_path's row of the same kernel and waves (1 if
    any), and which rows had no counterpart there."""
    rows_before = json.loads(Path(old_path).read_text())["rows"]
    old = {(r["kernel"], r["waves"]): r.get("checksum") for r in rows_before}
    bad = 0
    for r in rows:
        want = old.get((r["kernel"], r["waves"]))
        if want is None:
            print(f"check: {r['kernel']} x{r['waves']}: no checksum in {old_path}")
        elif want != r["checksum"]:
            print(f"check: {r['kernel']} x{r['waves']}: checksum {r['checksum']} differs from {want}")
            bad = 1
        else:
            print(f"check: {r['kernel']} x{r['waves']}: checksum equal")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--iters", type=int, default=0, help="loop iterations (default: per kernel)")
    ap.add_argument("--waves", default="64,256,512")
    ap.add_argument("--only", default="mfma,valu,mem,fmha", help="also: fmha_issue12")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. which tree was measured)")
    ap.add_argument("--check", default="", help="an earlier emu_speed JSON whose checksums must match")
    args = ap.parse_args(argv)
    default_iters = {"mfma": 100, "valu": 100, "mem": 50}
    rows = []
    only = args.only.split(",")
    print(f"load average before: {os.getloadavg()}")
    print(f"{'kernel':28s} {'waves':>6s} {'wave-insts':>11s} {'wall s':>8s} {'cpu s':>8s} "
          f"{'M w-inst/s wall':>16s} {'M w-inst/s cpu':>15s}  checksum")
    for name in ("mfma", "valu", "mem"):
        if name not in only:
            continue
        for waves in (int(v) for v in args.waves.split(",")):
            r = run_micro(name, waves, args.iters or default_iters[name], args.repeat)
            rows.append(r)
            _row(r)
    for name, shape in FMHA_CASES.items():
        if name in only:
            r = run_fmha(args.repeat, shape)
            rows.append(r)
            _row(r)
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    meta = {"label": args.label, "emulator": str(Path(emu.__file__).resolve().parent),
            "note": "wips: wave-instructions / best wall time; wips_cpu: / best process CPU time",
            "loadavg_after": os.getloadavg(), "cpu_affinity": affinity, "python": platform.python_version(),
            "numpy": np.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "repeat": args.repeat, "best_of_repeat": True,
            "numba": emu_fast.kernels() is not None, "numba_min_waves": emu_fast.MIN_WAVES}
    print(f"load average after: {meta['loadavg_after']}, cpus {affinity}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return compare(rows, args.check) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())

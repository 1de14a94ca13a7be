"""Shared scaffolding for every kernel's benchmark.

A bench module (bench/bench_*.py) defines `cases(full: bool) -> list[BenchCase]`: one
launch per configuration — code object, kernel symbol, grid, block, kernarg bytes,
buffers — with the FLOP and byte counts of the problem (the textbook counts, not what
the kernel executes). `run(cases)` times each one:

  * on a gfx950 (torch sees a ROCm device whose arch is gfx950): real launches through
    gfxasm's HIP backend, timed with device events after warm-up — source "measured";
  * otherwise: `gfxasm.perf.estimate` (the MI355X timing model) — source "modelled".

It prints a short table, writes one JSON row per configuration, and (when matplotlib
is installed) a roofline PNG of all rows. `gfxasm bench` (gfxasm.perf.cli.bench_main)
collects every bench module's cases and calls `run`.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

MI355X = {"bf16": 2.5e15, "fp8": 5.0e15, "hbm": 8.0e12}


@dataclass
class BenchCase:
    label: str                    # e.g. "fmha_fwd_hd128_bf16 (aiter) B4 H64/8 S8192"
    group: str                    # rows comparable with each other, e.g. "fmha fwd bf16 d128"
    co: str                       # path of the .co
    kernel: str | None            # symbol (None: the only kernel)
    grid: tuple
    block: tuple
    kernarg: bytes
    buffers: list
    flops: float                  # problem FLOP (e.g. 4*B*Hq*Sq*Sk*D for attention)
    bytes: float                  # minimum bytes the problem must move to/from HBM
    dtype: str = "bf16"           # which MFMA peak applies
    published_tflops: float | None = None     # a published hardware figure, if any
    published_source: str = ""
    keep: list = field(default_factory=list)  # tensors to keep alive


def has_gfx950() -> bool:
    try:
        if not torch.cuda.is_available():
            return False
        return "gfx950" in torch.cuda.get_device_properties(0).gcnArchName
    except Exception:
        return False


def device_seconds(step, warmup: int = 5, iters: int = 20) -> float:
    """Seconds per call of step(i) on the GPU, from device events around `iters` calls after
    `warmup` (i counts on across both, for steps that cycle through buffers)."""
    for i in range(warmup):
        step(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(warmup, warmup + iters):
        step(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def measure(case: BenchCase, warmup: int = 5, iters: int = 20) -> float:
    """Seconds per launch on the gfx950, from device events (buffers must live on it)."""
    from gfxasm.backends.hip import HipBackend
    backend = HipBackend()
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    return device_seconds(lambda i: backend.launch(Path(case.co), case.kernel, tuple(case.grid), tuple(case.block),
                                                   case.kernarg, dev, stream), warmup, iters)


def evaluate(case: BenchCase, device: bool | None = None, **estimate_kw) -> dict:
    """One JSON row for a case: measured on a gfx950, modelled otherwise."""
    device = has_gfx950() if device is None else device
    t0 = time.time()
    row = {"label": case.label, "group": case.group, "co": case.co, "grid": list(case.grid),
           "block": list(case.block), "dtype": case.dtype, "flops": case.flops, "bytes": case.bytes}
    if device:
        secs = measure(case)
        row.update(source="measured", seconds=secs)
    else:
        from gfxasm.perf import estimate
        est = estimate(case.co, case.grid, case.block, case.kernarg, case.buffers, case.kernel, **estimate_kw)
        row.update(source="modelled", seconds=est.seconds, model=_model_summary(est))
        secs = est.seconds
    peak = MI355X.get(case.dtype, MI355X["bf16"])
    row["tflops"] = case.flops / secs / 1e12 if secs else 0.0
    row["pct_peak"] = 100 * case.flops / secs / peak if secs else 0.0
    row["gbps"] = case.bytes / secs / 1e9 if secs else 0.0
    row["pct_hbm"] = 100 * case.bytes / secs / MI355X["hbm"] if secs else 0.0
    row["intensity"] = case.flops / case.bytes if case.bytes else math.inf
    if case.published_tflops:
        row["published_tflops"] = case.published_tflops
        row["published_source"] = case.published_source
        row["error_pct"] = 100 * (row["tflops"] - case.published_tflops) / case.published_tflops
    row["wall_s"] = round(time.time() - t0, 2)
    return row


def _model_summary(est) -> dict:
    return {"cycles_per_round": est.cycles_per_round, "rounds": est.rounds,
            "workgroups_per_cu": est.workgroups_per_cu, "mfma_utilization": est.mfma_utilization,
            "valu_utilization": est.valu_utilization, "clock_hz": est.clock_hz, "dram_bytes": est.dram_bytes,
            "executed_mfma_flops": est.mfma_flops, "stubbed": est.stubbed}


def format_table(rows: list[dict]) -> str:
    head = f"{'configuration':58} {'source':9} {'time':>10} {'TFLOP/s':>8} {'%peak':>6} {'GB/s':>7} {'%HBM':>5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r["seconds"]
        ts = f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"
        line = (f"{r['label'][:58]:58} {r['source']:9} {ts:>10} {r['tflops']:8.0f} {r['pct_peak']:6.1f} "
                f"{r['gbps']:7.0f} {r['pct_hbm']:5.1f}")
        if "published_tflops" in r:
            line += f"   published {r['published_tflops']:.0f} ({r['error_pct']:+.1f}%)"
        lines.append(line)
    if any(r["source"] == "modelled" for r in rows):
        lines.append("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement")
    return "\n".join(lines)


def run(cases: list[BenchCase], out: str | Path = "bench/results.json", png: str | Path | None = None,
        device: bool | None = None, **estimate_kw) -> list[dict]:
    rows = []
    for case in cases:
        row = evaluate(case, device, **estimate_kw)
        rows.append(row)
        print(format_table([row]).splitlines()[2], flush=True)
    print()
    print(format_table(rows))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {out}")
    if png is not None:
        from gfxasm.perf.roofline import plot
        if plot(rows, png):
            print(f"wrote {png}")
        else:
            print("roofline PNG skipped: matplotlib is not installed (pip install matplotlib)")
    return rows


def manifest_case(kernel: str, variant: str | None, label: str, group: str, flops: float, nbytes: float,
                  dtype: str = "bf16", **args) -> BenchCase:
    """A BenchCase for one of our manifest kernels: kernarg and grid exactly as
    gfxasm.launch would build them (same checks), without launching."""
    from gfxasm import kernarg as ka
    from gfxasm.launcher import bind_scalars, check_argument_names, check_tensors, launch_grid
    from gfxasm.manifest import default_manifest
    chosen = default_manifest().kernel(kernel).variant(variant)
    check_argument_names(chosen, args)
    _, sizes = check_tensors(chosen, args)
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in chosen.args}
    kernarg_bytes = ka.pack(chosen.args, chosen.kernarg_size, values)
    bind_scalars(chosen, args, sizes)
    grid = launch_grid(chosen, sizes)
    tensors = [args[a.name] for a in chosen.args if a.type.is_pointer]
    return BenchCase(label, group, str(chosen.co_path), chosen.kernel.symbol, tuple(grid),
                     tuple(chosen.kernel.workgroup) + (1,) * (3 - len(chosen.kernel.workgroup)),
                     kernarg_bytes, tensors, flops, nbytes, dtype)

"""MX-FP8 MoE grouped GEMM benchmark: gfxasm.mxfp8_moe_gemm alone at the seed's shapes.

    python3 bench/moe_gemm.py [--only TEXT] [--tokens 1,2,4,...] [--block-m 16|32|64] [--out bench/out/moe_gemm.json]
    python3 bench/moe_gemm.py --tokens 1024,4096 --block-m 64     # prefill: the block_m 64 tiles

Shapes: the seed's two grouped GEMMs (MiniMax-M3 at EP2: E = 128 local experts, top_k = 4),
  gate_up  N 1536, K 6144, a_div 4 (one activation row per token),
  down     N 6144, K 768,  a_div 1 (one activation row per slot),
for T = 1, 2, 4, 8, 16, 32, 64 tokens (--tokens) routed uniformly at random (top_k distinct
experts per token, seeded), block_m 16 (--block-m), aligned by gfxasm.moe_align_block_size
(vLLM's layout), with topk_weights (as the down projection takes them). The tile width is
the op's own choice (mxfp8_moe_gemm.choose_nt).

Bytes: the minimum is the routed experts' weights and scales once, the activations once and
the output once (N*K*(1+1/32) per routed expert + M*K*(1+1/32) + 2*T*top_k*N); beside it, the
model's DRAM bytes (distinct lines the sampled workgroups touch, scaled to the grid, caches
assumed to catch all reuse) and the bytes the loads request before any cache.

Time: device events on a gfx950 (none here), else gfxasm.perf.estimate — the MI355X timing
model (labelled "modelled"; a launch overhead included). GB/s and % of 8 TB/s are the
minimum bytes over the time. The model runs compute unit 0's workgroups and scales them to
the grid, as if all did the same work; but the aligned layout has more blocks than tokens
use (vLLM sizes it for the worst case), and the workgroups of blocks past
num_tokens_post_padded end after two scalar loads. So each row is modelled twice: the launch
as aligned ("aligned": charges those workgroups as full ones, an overestimate), and with
sorted_token_ids / expert_ids cut to the used blocks ("used": the work, without the
skipped workgroups' small cost). The truth lies between.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import gfxasm                                                   # noqa: E402
from gfxasm.ops import mxfp8_moe_gemm as moe                   # noqa: E402

from bench.common import device_seconds, has_gfx950, manifest_case   # noqa: E402

HBM = 8.0e12
E, TOP_K, BLOCK_M = 128, 4, 16
SHAPES = {"gate_up": dict(N=1536, K=6144, a_div=TOP_K), "down": dict(N=6144, K=768, a_div=1)}
TOKENS = (1, 2, 4, 8, 16, 32, 64)


def routed(T: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + T)
    return torch.stack([torch.randperm(E, generator=gen)[:TOP_K] for _ in range(T)]).to(torch.int32)


def problem(shape: str, T: int, device: str = "cpu", block_m: int = BLOCK_M) -> dict:
    """The op's arguments: zero operands (finite for the emulator), unit scales, the routing."""
    N, K, a_div = SHAPES[shape]["N"], SHAPES[shape]["K"], SHAPES[shape]["a_div"]
    M = T * TOP_K // a_div
    topk_ids = routed(T)
    sorted_ids, expert_ids, post = gfxasm.moe_align_block_size(topk_ids, block_m, E, pad_sorted_ids=True)
    e4m3 = lambda *s: torch.zeros(s, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)   # noqa: E731
    unit = lambda *s: torch.full(s, 127, dtype=torch.uint8, device=device)                        # noqa: E731
    return dict(a=e4m3(M, K), a_scale=unit(M, K // 32), w=e4m3(E, N, K), w_scale=unit(E, N, K // 32),
                sorted_token_ids=sorted_ids.to(device), expert_ids=expert_ids.to(device),
                num_tokens_post_padded=post.to(device), a_div=a_div,
                topk_weights=torch.rand(T, TOP_K, device=device), experts=int(topk_ids.unique().numel()),
                block_m=block_m)


def minimum_bytes(p: dict) -> float:
    M, K = p["a"].shape
    N = p["w"].shape[1]
    return p["experts"] * N * K * (1 + 1 / 32) + M * K * (1 + 1 / 32) + 2 * M * p["a_div"] * N


def modelled(p: dict, used_only: bool = False) -> dict:
    """gfxasm.perf.estimate of the op's launch; used_only cuts the routing to the used blocks."""
    from gfxasm.perf import estimate
    args = [p[k] for k in ("a", "a_scale", "w", "w_scale", "sorted_token_ids", "expert_ids", "num_tokens_post_padded")]
    if used_only:
        used = int(p["num_tokens_post_padded"]) // p["block_m"]
        args[4], args[5] = args[4][:used * p["block_m"]], args[5][:used]
    out = torch.zeros(p["a"].shape[0] * p["a_div"], p["w"].shape[1], dtype=torch.bfloat16)
    sizes = moe.validate(*args, p["a_div"], p["topk_weights"], out, torch.bfloat16)
    kernel, variant, kargs = moe.launch_args(*args, p["a_div"], p["topk_weights"], out, torch.bfloat16, sizes)
    case = manifest_case(kernel, variant, "", "", 0, 0, **kargs)
    est = estimate(case.co, case.grid, case.block, case.kernarg, case.buffers, case.kernel)
    return dict(variant=variant, grid=list(case.grid), seconds=est.seconds, dram_bytes=est.dram_bytes,
                requested_bytes=est.requested_global_bytes, rounds=est.rounds,
                workgroups_per_cu=est.workgroups_per_cu, clock_hz=est.clock_hz)


def measured(shape: str, T: int, block_m: int, iters: int = 50) -> float:
    p = problem(shape, T, device="cuda", block_m=block_m)
    args = [p[k] for k in ("a", "a_scale", "w", "w_scale", "sorted_token_ids", "expert_ids", "num_tokens_post_padded")]
    return device_seconds(lambda i: gfxasm.mxfp8_moe_gemm(*args, a_div=p["a_div"], topk_weights=p["topk_weights"]),
                          iters=iters)


def _table(rows: list[dict]) -> str:
    head = (f"{'shape':8} {'T':>3} {'experts':>7} {'blocks':>10} {'variant':28} {'min MB':>7} {'DRAM/min':>8} "
            f"{'req/min':>7} {'time used':>10} {'aligned':>8} {'source':8} {'GB/s':>5} {'%8TB/s':>6} {'aligned':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        u = r.get("used", r)                      # a measured row has no "used" half
        lines.append(f"{r['shape']:8} {r['T']:3} {r['experts']:7} {r['blocks']:4}/{r['aligned_blocks']:<5} "
                     f"{u.get('variant', '-'):28} {r['min_bytes'] / 1e6:7.2f} {u.get('dram_over_min', 0):8.3f} "
                     f"{u.get('requested_over_min', 0):7.3f} {u['seconds'] * 1e6:8.2f}us {r['seconds'] * 1e6:6.2f}us "
                     f"{r['source']:8} {u['gbps']:5.0f} {u['pct_hbm']:6.1f} {r['pct_hbm']:7.1f}")
    if any(r["source"] == "modelled" for r in rows):
        lines.append("blocks: used / aligned. 'used': the launch on the used blocks only (variant, bytes, time, GB/s, "
                     "%); 'aligned': the whole aligned grid (time, %)")
        lines.append("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="only rows whose 'shape T' label contains this, e.g. 'down T1'")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--block-m", type=int, choices=moe.BLOCK_MS, default=BLOCK_M)
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "moe_gemm.json"))
    args = ap.parse_args(argv)
    moe.build_kernels()
    device = has_gfx950()
    rows = []
    for shape in SHAPES:
        for T in (int(t) for t in args.tokens.split(",")):
            label = f"{shape} T{T} "
            if args.only and args.only not in label:
                continue
            t0 = time.time()
            p = problem(shape, T, block_m=args.block_m)
            least = minimum_bytes(p)
            row = dict(shape=shape, T=T, top_k=TOP_K, E=E, block_m=args.block_m, **SHAPES[shape],
                       experts=p["experts"], blocks=int(p["num_tokens_post_padded"]) // args.block_m,
                       aligned_blocks=p["expert_ids"].numel(), min_bytes=least)
            if device:
                row.update(source="measured", seconds=measured(shape, T, args.block_m))
            else:
                for half, used_only in ((row, False), (row.setdefault("used", {}), True)):
                    m = modelled(p, used_only)
                    half.update(source="modelled", workgroups=m["grid"][0] * m["grid"][1],
                                dram_over_min=m["dram_bytes"] / least, requested_over_min=m["requested_bytes"] / least,
                                **m)
            for half in (row, row.get("used", {})) if not device else (row,):
                half.update(gbps=least / half["seconds"] / 1e9, pct_hbm=100 * least / half["seconds"] / HBM)
            row.update(wall_s=round(time.time() - t0, 1))
            rows.append(row)
            print(_table([row]).splitlines()[2], flush=True)
    print()
    print(_table(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(device="gfx950" if device else None, rows=rows), indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bf16 queries over an FP8 KV cache (batch_prefill through loader/ops/fp8_query.py), modelled:
the Q pre-pass's two launches and the whole call against our bf16 paged prefill at the same
shape (issue 22: the FP8 call at >= 0.9x bf16's throughput, i.e. at most 1/0.9 of its time).

    python3 bench/prefill_fp8_query.py [--only TEXT] [--out bench/out/prefill_fp8_query.json]

Shapes as bench/prefill.py's (one sequence, Sq = Sk = S, page size 1, a shuffled SGLang
table, per-tensor descales) plus one of many heads. The pre-pass (quant_q_fp8_amax, then
quant_q_fp8) is gfxasm.perf.estimate of each launch on a q [S, Hq, 128] bf16 with the grid
the op gives it; the attention launches are bench/causal_model.py's (bench/prefill.py's
models of the FP8 and bf16 paged kernels). Every time includes the model's fitted per-launch
overhead. Numbers are the MI355X timing model's (labelled modelled), never measurements.
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

from gfxasm import build, kernarg                             # noqa: E402
from gfxasm.manifest import default_manifest                  # noqa: E402
from gfxasm.ops import batch_prefill as bp                    # noqa: E402
from gfxasm.ops import fp8_query as fq                        # noqa: E402
from gfxasm.perf import estimator                             # noqa: E402

from bench import attention_launches as launches             # noqa: E402
from bench.causal_model import modelled_seconds               # noqa: E402

SHAPES = [(6, 1, 1024, True), (6, 1, 8192, True), (64, 8, 2048, True), (40, 40, 4096, False)]   # (Hq, Hkv, S, causal)
TARGET = 0.9                                                  # FP8 call throughput over bf16 paged's


def pre_pass_seconds(S: int, Hq: int) -> dict[str, float]:
    """Modelled seconds of each pre-pass launch on a contiguous bf16 q [S, Hq, 128]."""
    q = torch.zeros(S, Hq, fq.HEAD_DIM, dtype=torch.bfloat16)
    chunks = S * Hq * fq.ROW_CHUNKS
    args = fq.launch_args(q, torch.empty(q.shape, dtype=fq.E4M3), torch.empty(1), fq.workspace(chunks, "cpu"))
    out = {}
    for name in fq.KERNELS:
        variant = default_manifest().kernel(name).variant(None)
        values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in variant.args}
        raw = kernarg.pack(variant.args, variant.kernarg_size, values)
        grid = tuple(expr.evaluate({k: v for k, v in args.items() if isinstance(v, int)}) for expr in variant.kernel.grid)
        est = estimator.estimate(str(variant.co_path), grid + (1,) * (3 - len(grid)), variant.kernel.workgroup, raw,
                                 [args[a.name] for a in variant.args if a.type.is_pointer], variant.kernel.symbol)
        out[name] = est.seconds
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="only rows whose label contains this text")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "prefill_fp8_query.json"))
    args = ap.parse_args(argv)
    build.build_kernels([bp.KERNEL, *fq.KERNELS])
    head = (f"{'problem':22} {'amax us':>8} {'quant us':>8} {'fp8 attn us':>11} {'bf16 paged us':>13} "
            f"{'call TFLOP/s':>12} {'bf16 TFLOP/s':>12} {'call/bf16 thr':>13} {'wall s':>6}")
    print(head)
    print("-" * len(head))
    rows = []
    for Hq, Hk, S, causal in SHAPES:
        label = f"h{Hq}/{Hk} s{S // 1024}k {'c' if causal else 'nc'}"
        if args.only and args.only not in label:
            continue
        t0 = time.time()
        flops = launches.flops(1, Hq, S, causal)
        pre = pre_pass_seconds(S, Hq)
        fp8_s, _ = modelled_seconds(launches.paged(bp.FP8), 1, Hq, Hk, S, causal)
        bf16_s, _ = modelled_seconds(launches.paged(torch.bfloat16), 1, Hq, Hk, S, causal)
        call_s = sum(pre.values()) + fp8_s
        row = dict(label=label, Hq=Hq, Hk=Hk, S=S, causal=causal, page=1, flops=flops, pre_pass_s=pre,
                   fp8_attention_s=fp8_s, call_s=call_s, bf16_paged_s=bf16_s,
                   call_tflops=flops / call_s / 1e12, bf16_paged_tflops=flops / bf16_s / 1e12,
                   call_over_bf16_throughput=bf16_s / call_s, meets_target=bf16_s / call_s >= TARGET,
                   source="modelled", wall_s=round(time.time() - t0, 1))
        rows.append(row)
        print(f"{label:22} {pre[fq.KERNELS[0]] * 1e6:8.2f} {pre[fq.KERNELS[1]] * 1e6:8.2f} {fp8_s * 1e6:11.1f} "
              f"{bf16_s * 1e6:13.1f} {row['call_tflops']:12.0f} {row['bf16_paged_tflops']:12.0f} "
              f"{row['call_over_bf16_throughput']:13.2f} {row['wall_s']:6.0f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"modelled (gfxasm.perf MI355X model, per-launch overhead included); target call/bf16 >= {TARGET}; "
          f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

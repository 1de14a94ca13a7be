"""Batch prefill benchmark: gfxasm's batch_prefill_d128 on the issue's table (CK tile's V3
FP8 batch prefill PR, MI355X), modelled, beside our dense fmha_fwd at the same shape.

    python3 bench/prefill.py [--only TEXT] [--max-tokens N] [--out bench/out/prefill.json]

Rows modelled replace the rows of the same label in --out; rows not run (--only,
--max-tokens) are kept as they were.

Rows: one sequence of S tokens (seqlen_q = seqlen_k = S), heads Hq/Hkv, causal or not,
page size 1 through an SGLang table whose page ids are a random permutation of the pool
(the worst case for locality: every K/V row its own page). Ours: FP8 e4m3 with per-tensor
descales (bf16 out) and bf16, both paged; the bf16 paged / dense ratio is the paging
overhead. KV block scales (kv_block_descale) run as CK's second column does: page size 1024.
A second table puts block scales at small pages (1 and 16: the per-key _blks variants)
beside per-tensor FP8 at the same page size and shape; there the block scales are random
(0.5 .. 2, seeded), so each tile's largest v scale differs and O is rescaled at every tile,
as with real scales (at page 1024 they are ones, as before).

Numbers are gfxasm.perf's MI355X timing model (labelled modelled), never measurements; every
launch, paged or dense, is modelled by bench/causal_model.py as bench/fmha.py's are (causal:
the workgroups of five Q tiles sampled, interpolated, list-scheduled on 256 CUs), the
launches built by bench/attention_launches.py. Inputs are zeros (as the steady state: no
rescale), the page table a permutation. FLOPs: 4 Hq S^2 D, causal counting only visible
pairs (CK's convention, as far as its table says).
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

from gfxasm import build                                       # noqa: E402
from gfxasm.ops import batch_prefill as bp                    # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

from bench import attention_launches as launches             # noqa: E402
from bench.causal_model import modelled_seconds               # noqa: E402

# (Hq, Hkv, S, causal) -> CK V3 TFLOP/s (per-tensor FP8 page 1 SGLang; KV block-scale page 1024)
CK = {
    (6, 1, 1024, True): (47.7, 45.2), (6, 1, 2048, True): (120.1, 111.6), (6, 1, 4096, True): (259.5, 241.1),
    (6, 1, 8192, True): (549.4, 509.7), (6, 1, 16384, True): (1066.1, 1013.1),
    (6, 1, 32768, True): (1282.3, 1205.4), (6, 1, 65536, True): (1375.5, 1313.5),
    (6, 1, 131072, True): (1390.2, 1330.3), (16, 1, 65536, True): (1381.8, 1324.2),
    (40, 40, 37 * 1024, False): (1304.3, 1251.6),
}
CK_SOURCE = "CK PR #6054 (V3 FP8 batch prefill), MI355X, stock ROCm 7.1.1"
SMALL_PAGE_SHAPES = [(6, 1, 8192, True)]           # (Hq, Hkv, S, causal): block scales below page 64
SMALL_PAGES = (1, 16)


def _small_pages(args, rows: list, save) -> None:
    """Block scales below page 64 (the per-key _blks variants) beside per-tensor FP8 at the
    same page size and shape, modelled; rows appended to `rows` (and saved) as they finish."""
    head = f"{'block scales, small pages':30} {'ours fp8':>8} {'ours fp8 blk':>12} {'blk/fp8 time':>12} {'wall s':>6}"
    print(f"\n{head}\n{'-' * len(head)}")
    for (Hq, Hk, S, causal), page in ((shape, page) for shape in SMALL_PAGE_SHAPES for page in SMALL_PAGES):
        label = f"h{Hq}/{Hk} s{S // 1024}k {'c' if causal else 'nc'} page {page}"
        if (args.only and args.only not in label) or S > args.max_tokens:
            continue
        t0 = time.time()
        flops = launches.flops(1, Hq, S, causal)
        fp8_s, fp8_detail = modelled_seconds(launches.paged(bp.FP8, page=page), 1, Hq, Hk, S, causal)
        blk_s, blk_detail = modelled_seconds(launches.paged(bp.FP8, block_scales=True, page=page), 1, Hq, Hk, S, causal)
        rows.append(dict(label=label, Hq=Hq, Hk=Hk, S=S, causal=causal, page=page, flops=flops,
                         ours_fp8_tflops=flops / fp8_s / 1e12, ours_fp8_block_tflops=flops / blk_s / 1e12,
                         block_over_tensor_time=blk_s / fp8_s, source="modelled",
                         detail=dict(fp8=fp8_detail, fp8_block=blk_detail), wall_s=round(time.time() - t0, 1)))
        r = rows[-1]
        print(f"{label:30} {r['ours_fp8_tflops']:8.0f} {r['ours_fp8_block_tflops']:12.0f} "
              f"{r['block_over_tensor_time']:12.3f} {r['wall_s']:6.0f}", flush=True)
        save()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="only rows whose label contains this text")
    ap.add_argument("--max-tokens", type=int, default=1 << 20, help="skip rows with more tokens (model time)")
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "prefill.json"))
    ap.add_argument("--no-build", action="store_true", help="model the objects already built")
    args = ap.parse_args(argv)
    if not args.no_build:
        build.build_kernels([bp.KERNEL, "fmha_fwd_d128"])    # this op's and the dense one it is set beside
    head = (f"{'problem':22} {'CK fp8':>7} {'ours fp8':>8} {'CK fp8 blk':>10} {'ours fp8 blk':>12} {'ours bf16 paged':>15} "
            f"{'dense bf16':>10} {'paged/dense':>11} {'wall s':>6}")
    print(head)
    print("-" * len(head))
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(out.read_text()) if out.exists() else {}

    def save():
        """This run's rows in place of the saved rows of their labels; the rest kept."""
        merged = {}
        for key, new in (("runs", rows), ("small_pages", small)):
            labels = {r["label"] for r in new}
            merged[key] = [r for r in kept.get(key, []) if r["label"] not in labels] + new
        out.write_text(json.dumps(merged, indent=1, default=str))

    small: list[dict] = []
    for (Hq, Hk, S, causal), (ck, ck_block) in CK.items():
        label = f"h{Hq}/{Hk} s{S // 1024}k {'c' if causal else 'nc'}"
        if (args.only and args.only not in label) or S > args.max_tokens:
            continue
        t0 = time.time()
        flops = launches.flops(1, Hq, S, causal)
        fp8_s, fp8_detail = modelled_seconds(launches.paged(bp.FP8), 1, Hq, Hk, S, causal)
        blk_s, blk_detail = modelled_seconds(launches.paged(bp.FP8, block_scales=True), 1, Hq, Hk, S, causal)
        paged_s, paged_detail = modelled_seconds(launches.paged(torch.bfloat16), 1, Hq, Hk, S, causal)
        dense_s, dense_detail = modelled_seconds(launches.DENSE_BF16, 1, Hq, Hk, S, causal)
        row = dict(label=label, Hq=Hq, Hk=Hk, S=S, causal=causal, flops=flops, ck_fp8_tflops=ck,
                   ck_fp8_block_tflops=ck_block, ours_fp8_tflops=flops / fp8_s / 1e12,
                   ours_fp8_block_tflops=flops / blk_s / 1e12,
                   paged_bf16_tflops=flops / paged_s / 1e12,
                   dense_bf16_tflops=flops / dense_s / 1e12, paged_over_dense_time=paged_s / dense_s,
                   source="modelled", detail=dict(fp8=fp8_detail, fp8_block=blk_detail, paged=paged_detail, dense=dense_detail),
                   wall_s=round(time.time() - t0, 1))
        rows.append(row)
        print(f"{label:22} {ck:7.0f} {row['ours_fp8_tflops']:8.0f} {ck_block:10.0f} {row['ours_fp8_block_tflops']:12.0f} "
              f"{row['paged_bf16_tflops']:15.0f} "
              f"{row['dense_bf16_tflops']:10.0f} {row['paged_over_dense_time']:11.3f} {row['wall_s']:6.0f}", flush=True)
        save()                                                 # (row by row: long rows)
    print(f"ours: modelled (gfxasm.perf MI355X model), bf16 peak {P.PEAK_FLOPS['bf16'] / 1e12:.0f} TFLOP/s; "
          f"CK: {CK_SOURCE}; paged/dense = modelled time ratio (> 1: paging costs)")
    _small_pages(args, small, save)
    save()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

Numbers are gfxasm.perf's MI355X timing model (labelled modelled), never measurements; the
causal launches are modelled as bench/fmha.py models them (the workgroups of five Q tiles
sampled, interpolated, list-scheduled on 256 CUs), reusing its code with our launch in
place of fmha_fwd's. Inputs are zeros (as the steady state: no rescale), the page table a
permutation. FLOPs: 4 Hq S^2 D,
causal counting only visible pairs (CK's convention, as far as its table says).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm import kernarg                                    # noqa: E402
from gfxasm import build                                       # noqa: E402
from gfxasm.manifest import default_manifest                  # noqa: E402
from gfxasm.ops import batch_prefill as bp                    # noqa: E402
from gfxasm.perf import estimator                             # noqa: E402
from gfxasm.perf import params as P                           # noqa: E402

from bench import fmha as dense                               # noqa: E402

D = bp.HEAD_DIM
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


def _paged_parts(B, Hq, Hk, Sq, Sk, causal, dtype=torch.bfloat16, block_scales=False, page=None):
    """bench/fmha.py's _launch_parts for batch_prefill_d128: one sequence, page size `page`
    (default 1; block scales: 1024, CK's configuration)."""
    assert B == 1 and Sq == Sk
    g = torch.Generator().manual_seed(0)
    page = page or (1024 if block_scales else 1)
    pages = -(-Sk // page)
    q = torch.zeros(Sq, Hq, D, dtype=dtype)           # (zeros: an e4m3 NaN byte would stop the emulator)
    k = torch.zeros(pages, page, Hk, D, dtype=dtype)
    v = torch.zeros(pages, page, Hk, D, dtype=dtype)
    o = torch.empty(Sq, Hq, D, dtype=bp.out_dtype(dtype))
    lse = torch.empty(Hq, Sq, dtype=torch.float32)
    e = q.element_size()
    args = dict(q=q, k_cache=k, v_cache=v, o=o, lse=lse, qo_indptr=torch.tensor([0, Sq], dtype=torch.int32),
                kv_start=torch.zeros(1, dtype=torch.int32), seqlen_k=torch.tensor([Sk], dtype=torch.int32),
                page_list=torch.randperm(pages, generator=g).to(torch.int32), descales=torch.ones(3),
                kv_scales=(torch.rand(pages * Hk * 2, generator=g) * 1.5 + 0.5 if page < bp.BLOCK_SCALE_MIN_PAGE
                           else torch.ones(pages * Hk * 2)), heads_k=Hk, max_seq_q=Sq,
                q_seq_stride=q.stride(0) * e, q_head_stride=q.stride(1) * e, k_seq_stride=k.stride(1) * e,
                k_head_stride=k.stride(2) * e, v_seq_stride=v.stride(1) * e, v_head_stride=v.stride(2) * e,
                o_seq_stride=o.stride(0) * 2, o_head_stride=o.stride(1) * 2, lse_head_stride=lse.stride(0) * 4,
                page_shift=page.bit_length() - 1, kv_head_magic=0 if Hq == Hk else -(-2**32 // (Hq // Hk)),
                scale_log2=bp.LOG2E / math.sqrt(D), store_lse=1)
    variant = default_manifest().kernel(bp.KERNEL).variant(bp.variant_name(dtype, causal, block_scales, page))
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in variant.args}
    raw = kernarg.pack(variant.args, variant.kernarg_size, values)
    grid = (math.ceil(Sq / bp.Q_TILE), Hq, B)
    return variant, grid, raw, [args[a.name] for a in variant.args if a.type.is_pointer]


@contextlib.contextmanager
def _paged(dtype, block_scales=False, page=None):
    """bench/fmha.py's modelling with our launch in place of fmha_fwd's. FP8: the timing
    run executes the MFMAs instead of stubbing them (gfxasm.perf.trace.record's default), so
    the scores are real: a stub leaves stale registers, whose NaN the emulator's e4m3
    conversion of P refuses (its NaN byte is unverified). Timing is unaffected."""
    saved, saved_record = dense._launch_parts, estimator.record
    dense._launch_parts = functools.partial(_paged_parts, dtype=dtype, block_scales=block_scales, page=page)
    if dtype == bp.FP8:
        estimator.record = functools.partial(saved_record, skip_mfma=False)
    try:
        yield
    finally:
        dense._launch_parts, estimator.record = saved, saved_record


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
        flops = dense.flops(1, Hq, S, causal)
        with _paged(bp.FP8, page=page):
            fp8_s, fp8_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
        with _paged(bp.FP8, block_scales=True, page=page):
            blk_s, blk_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
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
        flops = dense.flops(1, Hq, S, causal)
        with _paged(bp.FP8):
            fp8_s, fp8_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
        with _paged(bp.FP8, block_scales=True):
            blk_s, blk_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
        with _paged(torch.bfloat16):
            paged_s, paged_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
        dense_s, dense_detail = dense.modelled_seconds(1, Hq, Hk, S, causal)
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

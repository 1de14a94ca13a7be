"""Decode attention benchmark: gfxasm.decode_attention on issue 9's shapes, modelled.

    python3 bench/decode.py [--only TEXT] [--out bench/out/decode.json]
    python3 bench/decode.py --features       # softcap and windows vs none, one shape

Every figure here is "modelled": gfxasm.perf.estimate (the MI355X timing model, see
loader/perf/README.md) of exactly the launches gfxasm.decode_attention makes
(decode_attention.launches: decode_attn, then decode_attn_merge when split), summed. No
gfx950 was run.

Configurations (Sq = 1, causal, every sequence at full length):
  * FP8 (e4m3) contiguous cache, B128 Hq8/Hkv1 D128, 8192 keys, with per-token (scale,
    shift) pairs (issue target <= 45 us) and with per-tensor descales;
  * bf16 contiguous cache, same shape (issue target <= 80 us);
  * fp16 paged cache, page 64, B16 Hq64/Hkv8 D64, 1k/2k/4k/8k keys (target <= 0.8 x the
    published 9.74 / 16.2 / 25.3 / 45.3 us);
  * bf16 paged cache, page 16, B16 Hq64/Hkv8 D128, 8k keys, side by side with aiter's
    pa_bf16_noquant_gqa8_1tg_4w (the corpus object, launched as tests/conformance/cases.py's
    paged_attention recipe does, modelled the same way; needs `gfxasm corpus fetch`).

--features: bf16 paged-16 Hq64/Hkv8 S8192 at B16 D128 and at B1 D64 (gpt-oss's decode,
where the split model matters) with no option, softcap 50 (the SOFTCAP variant: 6 more
VALU ops per score), window_size (4096, 0) (half the keys visible; pages wholly before the
window are not read) and (128, 0) (gpt-oss's sliding layers; the splits are sized to the
window), and cache_leftpad 4096 for every sequence (the same keys skipped as padding).

Bytes: the minimum is the problem's (every visible K and V byte once, Q read, O written);
"moved" adds what this implementation also moves (block table, split partials written and
read back by the merge). %HBM = minimum bytes / modelled time / 8 TB/s. Buffers are
torch.empty (the model needs addresses and control flow, not values); cache_seqlens and
the block table hold real values, since they steer the kernel. The block table is a
shuffled permutation of the pool.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gfxasm import kernarg                                    # noqa: E402
from gfxasm.launcher import fill_strides                      # noqa: E402
from gfxasm.manifest import default_manifest                  # noqa: E402

da = importlib.import_module("gfxasm.ops.decode_attention")

HBM = 8.0e12
# (label, q dtype, cache kind, paged page size or None, B, Hq, Hkv, D, keys, issue target in seconds, published);
# cache kind: "16" (q's dtype), "fp8" (e4m3, per-tensor descales), "fp8_ss" (e4m3, per-token scale/shift)
CONFIGS = [
    ("fp8 scale/shift contiguous B128 Hq8/Hkv1 D128 S8192", torch.bfloat16, "fp8_ss", None, 128, 8, 1, 128, 8192,
     45e-6, "xformers fp8 ~105 us (MI350)"),
    ("fp8 descale contiguous B128 Hq8/Hkv1 D128 S8192", torch.bfloat16, "fp8", None, 128, 8, 1, 128, 8192, None, ""),
    ("bf16 contiguous B128 Hq8/Hkv1 D128 S8192", torch.bfloat16, "16", None, 128, 8, 1, 128, 8192, 80e-6,
     "xformers bf16 ~110 us (MI350)"),
    ("fp16 paged64 B16 Hq64/Hkv8 D64 S1024", torch.float16, "16", 64, 16, 64, 8, 64, 1024, 0.8 * 9.74e-6, "9.74 us"),
    ("fp16 paged64 B16 Hq64/Hkv8 D64 S2048", torch.float16, "16", 64, 16, 64, 8, 64, 2048, 0.8 * 16.2e-6, "16.2 us"),
    ("fp16 paged64 B16 Hq64/Hkv8 D64 S4096", torch.float16, "16", 64, 16, 64, 8, 64, 4096, 0.8 * 25.3e-6, "25.3 us"),
    ("fp16 paged64 B16 Hq64/Hkv8 D64 S8192", torch.float16, "16", 64, 16, 64, 8, 64, 8192, 0.8 * 45.3e-6, "45.3 us"),
    ("bf16 paged16 B16 Hq64/Hkv8 D128 S8192 (aiter pa_bf16_noquant_gqa8 shape)", torch.bfloat16, "16", 16, 16, 64,
     8, 128, 8192, None, ""),
]


def problem(dtype, kind, page, batch, heads_q, heads_kv, dim, keys, seed=0):
    """(q, k_cache, v_cache, cache_seqlens, block_table) with empty data, real lengths and pages."""
    q = torch.empty(batch, 1, heads_q, dim, dtype=dtype)
    kv_dtype = dtype if kind == "16" else da.E4M3
    seqlens = torch.full((batch,), keys, dtype=torch.int32)
    if page is None:
        shape = (batch, keys, heads_kv, dim)
        return q, torch.empty(shape, dtype=kv_dtype), torch.empty(shape, dtype=kv_dtype), seqlens, None
    per_seq = keys // page
    pages = batch * per_seq
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32).view(batch, per_seq)
    shape = (pages, page, heads_kv, dim)
    return q, torch.empty(shape, dtype=kv_dtype), torch.empty(shape, dtype=kv_dtype), seqlens, table


def kernel_launch(kernel: str, variant: str, args: dict):
    """(code object, grid, block, kernarg bytes, buffers) exactly as gfxasm.launch packs them."""
    chosen = default_manifest().kernel(kernel).variant(variant)
    args = fill_strides(chosen, args)
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in chosen.args}
    raw = kernarg.pack(chosen.args, chosen.kernarg_size, values)
    if kernel == da.KERNEL:
        grid = (args["num_splits"], args["heads_kv"] * args["row_tiles"], args["q"].shape[0])
    else:
        grid = (args["heads_q"], args["seq_q"], args["o"].shape[0])
    block = tuple(chosen.kernel.workgroup) + (1,) * (3 - len(chosen.kernel.workgroup))
    return chosen.co_path, grid, block, raw, [args[a.name] for a in chosen.args if a.type.is_pointer]


FEATURE_SHAPES = [("bf16 paged16 B16 Hq64/Hkv8 D128 S8192", (torch.bfloat16, "16", 16, 16, 64, 8, 128, 8192, None, "")),
                  ("bf16 paged16 B1 Hq64/Hkv8 D64 S8192", (torch.bfloat16, "16", 16, 1, 64, 8, 64, 8192, None, ""))]
FEATURES = [("no option", {}), ("softcap 50", dict(softcap=50.0)), ("window (4096, 0)", dict(window_size=(4096, 0))),
            ("window (128, 0)", dict(window_size=(128, 0))), ("cache_leftpad 4096", dict(leftpad=4096))]


def bench(label, dtype, kind, page, batch, heads_q, heads_kv, dim, keys, target, published, options=None) -> dict:
    """One configuration, modelled; `options`: decode_attention's keyword arguments (leftpad:
    one cache_leftpad for every sequence)."""
    from gfxasm.perf import estimate
    q, k, v, seqlens, table = problem(dtype, kind, page, batch, heads_q, heads_kv, dim, keys)
    scales = {}
    if kind == "fp8":
        scales = dict(k_descale=torch.ones(1), v_descale=torch.ones(1))
    elif kind == "fp8_ss":
        pairs = torch.empty(*k.shape[:3], 2, dtype=torch.float16)
        scales = dict(k_scale_shift=pairs, v_scale_shift=pairs)
    options = dict(options or {})
    if "leftpad" in options:
        options["cache_leftpad"] = torch.full((batch,), options.pop("leftpad"), dtype=torch.int32)
    _, _, runs = da.launches(q, k, v, seqlens, block_table=table, **scales, **options)
    e = q.element_size()
    # the minimum: K and V once, their (scale, shift) pairs once, Q read, O written
    minimum = 2 * batch * keys * heads_kv * (dim * k.element_size() + 4 * (kind == "fp8_ss")) + 2 * q.numel() * e
    moved = minimum + (table.numel() * 4 if table is not None else 0)
    row = dict(label=label, source="modelled", launches=[], target_s=target, published=published)
    total = 0.0
    t0 = time.time()
    for kernel, variant, args in runs:
        co, grid, block, raw, buffers = kernel_launch(kernel, variant, args)
        est = estimate(str(co), grid, block, raw, buffers)
        total += est.seconds
        row["launches"].append(dict(variant=variant, grid=list(grid), seconds=est.seconds,
                                    workgroups_per_cu=est.workgroups_per_cu, rounds=est.rounds,
                                    dram_bytes=est.dram_bytes, stubbed=est.stubbed))
        if kernel == da.MERGE:
            moved += 2 * args["ws_o"].numel() * 4 + 2 * args["ws_lse"].numel() * 4
    row.update(seconds=total, min_bytes=minimum, moved_bytes=moved, pct_hbm=100 * minimum / total / HBM,
               tbps=minimum / total / 1e12, splits=runs[0][2]["num_splits"], chunk=runs[0][2]["chunk"],
               model_wall_s=round(time.time() - t0, 1))
    return row


def small_cases() -> list:
    """BenchCases of each decode kernel at a small shape (B2 Hq8/Hkv1 D128, 512 keys: bf16 and
    fp8 scale/shift contiguous, fp16 paged 64): known launches for `gfxasm stats --lds`."""
    from bench.common import BenchCase
    out = []
    for dtype, kind, page in ((torch.bfloat16, "16", None), (torch.bfloat16, "fp8_ss", None), (torch.float16, "16", 64)):
        q, k, v, seqlens, table = problem(dtype, kind, page, 2, 8, 1, 128, 512)
        scales = {}
        if kind == "fp8_ss":
            pairs = torch.empty(*k.shape[:3], 2, dtype=torch.float16)
            scales = dict(k_scale_shift=pairs, v_scale_shift=pairs)
        for kernel, variant, args in da.launches(q, k, v, seqlens, block_table=table, **scales)[2]:
            co, grid, block, raw, buffers = kernel_launch(kernel, variant, args)
            symbol = default_manifest().kernel(kernel).variant(variant).kernel.symbol
            out.append(BenchCase(f"{variant} B2 Hq8/Hkv1 D128 S512", "decode", str(co), symbol, grid, block, raw,
                                 buffers, 0.0, 0.0, keep=[q, k, v, seqlens, table]))
    return out


def aiter_pa_row(batch=16, heads_kv=8, gqa=8, page=16, keys=8192) -> dict:
    """aiter's pa_bf16_noquant_gqa8_1tg_4w on the same shape, same model (its own grid: one
    4-wave workgroup per (KV head, sequence), no split)."""
    from gfxasm.perf import estimate
    from tests.conformance.cases import paged_attention
    case = paged_attention([keys] * batch, Hk=heads_kv, gqa=gqa, block_size=page)
    est = estimate(str(case.path), case.grid, case.block, case.kernarg, case.buffers, case.symbol)
    minimum = 2 * batch * keys * heads_kv * 128 * 2 + 2 * batch * heads_kv * gqa * 128 * 2
    return dict(label=f"aiter {Path(case.co).name} B{batch} Hq{heads_kv * gqa}/Hkv{heads_kv} D128 S{keys} page{page}",
                source="modelled", seconds=est.seconds, min_bytes=minimum, moved_bytes=minimum,
                pct_hbm=100 * minimum / est.seconds / HBM, tbps=minimum / est.seconds / 1e12, splits=1, chunk=keys,
                launches=[dict(variant=case.symbol, grid=list(case.grid), seconds=est.seconds,
                               workgroups_per_cu=est.workgroups_per_cu, rounds=est.rounds, stubbed=est.stubbed)],
                target_s=None, published="")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the configurations whose label contains this text")
    ap.add_argument("--out", default="bench/out/decode.json")
    ap.add_argument("--no-aiter", action="store_true", help="leave out aiter's paged-attention object")
    ap.add_argument("--features", action="store_true", help="softcap and windows vs none at one shape (docstring)")
    opts = ap.parse_args(argv)
    da.build_kernels()
    if opts.features:
        return features(Path(opts.out).with_name("decode_features.json"))
    rows = []
    print(f"{'configuration (all times modelled)':66} {'splits':>6} {'time':>9} {'TB/s':>5} {'%8TB/s':>6} "
          f"{'moved/min':>9} {'target':>8}")
    todo = [lambda c=c: bench(*c) for c in CONFIGS if opts.only in c[0]]
    if not opts.no_aiter and opts.only in "aiter":
        todo.append(aiter_pa_row)
    for make in todo:
        r = make()
        rows.append(r)
        target = f"{r['target_s'] * 1e6:.1f} us" if r["target_s"] else "-"
        print(f"{r['label'][:66]:66} {r['splits']:6} {r['seconds'] * 1e6:7.1f}us {r['tbps']:5.2f} "
              f"{r['pct_hbm']:6.1f} {r['moved_bytes'] / r['min_bytes']:9.3f} {target:>8}", flush=True)
    ours = [r for r in rows if "paged16" in r["label"]]
    theirs = [r for r in rows if r["label"].startswith("aiter")]
    if ours and theirs:
        print(f"same shape, same model: ours / aiter = {ours[0]['seconds'] / theirs[0]['seconds']:.2f}")
    print("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement")
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {out}")
    return rows


def features(out: Path) -> list[dict]:
    """The modelled cost of softcap and of windows against none, at FEATURE_SHAPES."""
    rows = []
    for label, shape in FEATURE_SHAPES:
        print(f"{label}, modelled: option, splits, time, time / no option's")
        for name, options in FEATURES:
            r = bench(f"{label} {name}", *shape, options=options)
            rows.append(r)
            base = rows[-1 - FEATURES.index((name, options))]
            print(f"  {name:20} {r['splits']:3} {r['seconds'] * 1e6:8.2f} us  {r['seconds'] / base['seconds']:6.3f}",
                  flush=True)
    print("modelled = gfxasm.perf MI355X timing model (no gfx950 here); not a measurement")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1, default=str))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()

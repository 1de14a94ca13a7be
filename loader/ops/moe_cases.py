"""`gfxasm run` cases of the MoE kernels: random inputs and their references for every kernel
of loader/ops/mxfp8_moe_gemm.py (the grouped GEMM, its SWIGLU and DIRECT forms) and for the
layer's moe_sum (loader/ops/moe_layer.py). Importing this module (gfxasm.ops does) registers
them."""
from __future__ import annotations

import torch

from ..runcases import RunCase, run_case
from .moe_align import reference as align
from .mxfp8_gemm import BLOCK, E4M3, E8M0, OPERAND_RANGES, dequantize, random_operands
from .mxfp8_moe_gemm import (DIRECT_SWIGLU_KERNEL, direct_kernel_names, direct_sum_launch_args,
                             direct_swiglu_launch_args, kernel_names, launch_args, reference, sum_reference,
                             swiglu_kernel_names, swiglu_launch_args, validate)
from .moe_layer import FUSED_KERNEL, fused_launch_args
from .swiglu_quant import activation_reference, quantize_reference


def gemm_case(variant, gen: torch.Generator, T: int = 5, top_k: int = 3, E: int = 6, N: int = 40,
              K: int = 416) -> RunCase:
    """T tokens on top_k random experts, experts 1 and 4 absent (-1: their rows stay NaN),
    a_div = top_k, topk weights; K % 128 = 32 (a partial step), N off every tile."""
    out_dtype = torch.float16 if variant.defines["OUT_F16"] else torch.bfloat16
    block_m = 16 * variant.defines["MT"]
    a, a_scale, _, _ = random_operands(T, 1, K, gen, **OPERAND_RANGES[out_dtype])
    _, _, w, w_scale = random_operands(1, E * N, K, gen, **OPERAND_RANGES[out_dtype])
    w, w_scale = w.view(E, N, K), w_scale.view(E, N, K // BLOCK)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).flatten().tolist()
    expert_map = [-1 if e in (1, 4) else e for e in range(E)]
    routing = tuple(torch.tensor(x, dtype=torch.int32).reshape(-1) for x in align(ids, block_m, E, expert_map, True))
    tw = torch.rand(T, top_k, generator=gen)
    out = torch.full((T * top_k, N), float("nan"), dtype=out_dtype)
    call = (a, a_scale, w, w_scale, *routing, top_k, tw, out, out_dtype)
    _, _, args = launch_args(*call, validate(*call))
    values, written = reference(a, a_scale, w, w_scale, *routing, top_k, tw)
    values[~written] = float("nan")
    magnitude, _ = reference(a, a_scale, w, w_scale, *routing, top_k, tw, absolute=True)
    rtol = 2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11
    atol = (float(((K / 16 + 128) * 2.0 ** -24 * magnitude).max())
            + 2.0 ** -24 * float(values.nan_to_num().abs().max()))
    return RunCase(args=args, expected={"out": values.float()}, atol=atol, rtol=rtol,
                   note=f"T={T} top_k={top_k} E={E} N={N} K={K} block_m={block_m}")


def ones(gen, *shape) -> torch.Tensor:
    """e4m3 codes in {-1, 0, 1}."""
    return torch.randint(-1, 2, shape, generator=gen).float().to(E4M3)


def unit(*shape) -> torch.Tensor:
    """E8M0 scales 2^0."""
    return torch.full(shape, 127, dtype=torch.uint8).view(E8M0)


def swiglu_case(variant, gen: torch.Generator, T: int = 5, top_k: int = 3, E: int = 6, I: int = 64,
                K: int = 160) -> RunCase:
    """gate_up_swiglu (or its DIRECT form) with alpha = beta = 0 and no clamp on codes in {-1, 0,
    1} with unit scales: every h is an integer of magnitude <= K < 256 (exact in f32 and bf16)
    and y = gate * up / 2 is exact, so q and scale are compared bit for bit; experts 1 and 4
    absent (rows stay NaN)."""
    direct = variant.defines.get("DIRECT", 0)
    block_m = 16 * variant.defines["MT"]
    a, a_scale = ones(gen, T, K), unit(T, K // BLOCK)
    w, w_scale = ones(gen, E, 2 * I, K), unit(E, 2 * I, K // BLOCK)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).to(torch.int32)
    expert_map = [-1 if e in (1, 4) else e for e in range(E)]
    routing = tuple(torch.tensor(x, dtype=torch.int32).reshape(-1)
                    for x in align(ids.flatten().tolist(), block_m, E, expert_map, True))
    S = T * top_k
    q = torch.full((S, I), 0x7F, dtype=torch.uint8).view(E4M3)                            # NaN
    scale = torch.full((S, I // BLOCK), 0xFF, dtype=torch.uint8).view(E8M0)                 # NaN
    if direct:
        _, _, args = direct_swiglu_launch_args(a, a_scale, w, w_scale, ids, torch.tensor(expert_map).int(), E, q,
                                               scale, 0.0, 0.0, float("inf"))
    else:
        _, _, args = swiglu_launch_args(a, a_scale, w, w_scale, *routing, top_k, q, scale, 0.0, 0.0, float("inf"))
    h, written = reference(a, a_scale, w, w_scale, *routing, top_k)
    q_want, s_want = quantize_reference(activation_reference(h, 0.0, 0.0, float("inf")))
    q_want.view(torch.uint8)[~written], s_want.view(torch.uint8)[~written] = 0x7F, 0xFF
    return RunCase(args=args, expected=dict(q=q_want, scale=s_want), atol=0, rtol=0,
                   note=f"T={T} top_k={top_k} E={E} I={I} K={K} " + ("direct" if direct else f"block_m={block_m}")
                   + ", alpha = 0 (exact)")


def direct_sum_case(variant, gen: torch.Generator, T: int = 3, top_k: int = 5, E: int = 6, N: int = 40,
                    K: int = 416) -> RunCase:
    """The DIRECT down GEMM + top-k sum on codes in {-1, 0, 1} with unit scales: each slot's
    row is an integer below 2^24 (exact in f32 whatever the order), so bf16(weight * row) and
    the f32 sum in slot order are known bit for bit (sum_reference). Experts 1 and 4
    absent, one id out of range; K % 128 = 32 (a partial step), N off every tile."""
    S = T * top_k
    a, a_scale, w, w_scale = ones(gen, S, K), unit(S, K // BLOCK), ones(gen, E, N, K), unit(E, N, K // BLOCK)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).to(torch.int32)
    ids[1, 2] = E
    expert_map = torch.tensor([-1 if e in (1, 4) else e for e in range(E)], dtype=torch.int32)
    tw = torch.rand(T, top_k, generator=gen)
    out = torch.full((T, N), float("nan"), dtype=torch.bfloat16)
    _, _, args = direct_sum_launch_args(a, a_scale, w, w_scale, ids, expert_map, E, tw, out, variant.defines["NT"])
    rows = torch.zeros(S, N, dtype=torch.float32)
    for t, e in enumerate(ids.flatten().tolist()):
        if 0 <= e < E and expert_map[e] >= 0:
            rows[t] = (dequantize(a[t:t + 1], a_scale[t:t + 1]) @ dequantize(w[expert_map[e]],
                                                                             w_scale[expert_map[e]]).T).float()
    y = (tw.reshape(-1, 1) * rows).to(torch.bfloat16)
    return RunCase(args=args, expected=dict(out=sum_reference(y, ids, E, expert_map)), atol=0, rtol=0,
                   note=f"T={T} top_k={top_k} E={E} N={N} K={K}, codes in {{-1, 0, 1}} (exact)")


@run_case("moe_sum")
def sum_case(variant, gen: torch.Generator, T: int = 5, top_k: int = 4, H: int = 264, E: int = 8) -> RunCase:
    """The layer's top-k sum on random rows: some ids out of range, a map with absent experts
    and local ids past the 2 local experts (all skipped); exact (sum_reference)."""
    y = torch.randn(T * top_k, H, generator=gen).to(torch.bfloat16)
    ids = torch.randint(-1, E + 1, (T, top_k), generator=gen, dtype=torch.int32)   # some out of range
    expert_map = torch.randint(-1, 3, (E,), generator=gen, dtype=torch.int32)      # some absent, some >= 2
    return RunCase(args=dict(y=y, topk_ids=ids.view(-1), expert_map=expert_map,
                             out=torch.full((T, H), float("nan"), dtype=torch.bfloat16), T=T, H=H, top_k=top_k,
                             num_experts=E, has_map=1, num_local=2),
                   expected=dict(out=sum_reference(y, ids, E, expert_map, 2)), atol=0, rtol=0,
                   note=f"T={T} top_k={top_k} H={H}, expert map")


@run_case(FUSED_KERNEL)
def fused_case(variant, gen: torch.Generator, T: int = 2, top_k: int = 3, E: int = 6, H: int = 160,
               I: int = 64) -> RunCase:
    """The decode form in one launch (both roles, the counter zeroed): q and scale as
    swiglu_case's exact recipe gives them (alpha = 0, codes in {-1, 0, 1}, unit scales), then
    out = the top-k sum of bf16(weight * q' @ w2'^T) with w2 random; experts 1 and 4 absent,
    one id out of range, H = 160 in five 32-column down tiles. out within bf16's rounding of the sum
    plus one flip of a slot row's bf16 rounding (the row's f32 order is the kernel's own)."""
    x, x_scale = ones(gen, T, H), unit(T, H // BLOCK)
    w1, w1_scale = ones(gen, E, 2 * I, H), unit(E, 2 * I, H // BLOCK)
    _, _, w2, w2_scale = random_operands(1, E * H, I, gen, **OPERAND_RANGES[torch.bfloat16])
    w2, w2_scale = w2.view(E, H, I), w2_scale.view(E, H, I // BLOCK)
    ids = torch.stack([torch.randperm(E, generator=gen)[:top_k] for _ in range(T)]).to(torch.int32)
    ids[1, 2] = E
    expert_map = torch.tensor([-1 if e in (1, 4) else e for e in range(E)], dtype=torch.int32)
    tw = torch.rand(T, top_k, generator=gen)
    S = T * top_k
    q = torch.full((S, I), 0x7F, dtype=torch.uint8).view(E4M3)                            # NaN
    scale = torch.full((S, I // BLOCK), 0xFF, dtype=torch.uint8).view(E8M0)                 # NaN
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    _, _, args = fused_launch_args(x, x_scale, w1, w1_scale, w2, w2_scale, tw, ids, expert_map, E, q, scale,
                                   torch.zeros(1, dtype=torch.int32).view(torch.uint32), out, 0.0, 0.0, float("inf"))
    routed = [t for t, e in enumerate(ids.flatten().tolist()) if 0 <= e < E and expert_map[e] >= 0]
    local = [int(expert_map[e]) for e in ids.flatten()[routed].tolist()]
    h = torch.stack([(dequantize(x[t // top_k:t // top_k + 1], x_scale[t // top_k:t // top_k + 1])
                      @ dequantize(w1[e], w1_scale[e]).T)[0] for t, e in zip(routed, local)])
    q_want, s_want = quantize_reference(activation_reference(h.to(torch.bfloat16).float(), 0.0, 0.0, float("inf")))
    rows = torch.zeros(S, H, dtype=torch.float64)
    for r, (t, e) in enumerate(zip(routed, local)):
        rows[t] = (dequantize(q_want[r:r + 1], s_want[r:r + 1]).double()
                   @ dequantize(w2[e], w2_scale[e]).double().T)[0]
    y = (tw.reshape(-1, 1).double() * rows).to(torch.bfloat16)
    atol = 2.0 ** -8 * float(y.float().abs().max())       # a one-ulp flip of the largest slot's bf16 row
    return RunCase(args=args, expected=dict(out=sum_reference(y, ids, E, expert_map)), atol=atol, rtol=2.0 ** -7,
                   note=f"T={T} top_k={top_k} E={E} H={H} I={I}, one launch (concurrent schedule)")


for name in kernel_names():
    run_case(name)(gemm_case)
for name in swiglu_kernel_names() + [DIRECT_SWIGLU_KERNEL]:
    run_case(name)(swiglu_case)
for name in direct_kernel_names()[1:]:
    run_case(name)(direct_sum_case)


# ------------------------------------------------------------------ moe_align's three phases
# Each phase alone, from the state the previous one leaves (computed here from the ids), so a
# run names the phase that is wrong. 700 slots in chunks of 64 (the last one partial), 13
# experts, some ids out of range (skipped); map_mode 0. poison: what no phase may write.

ALIGN_POISON = -7


def _align_state(gen: torch.Generator, slots: int = 700, E: int = 13, block_m_log2: int = 4):
    """(ids, per-chunk counts [chunks, E], padded totals, key starts, args): chunks of 64
    slots, the outputs and workspace poisoned."""
    ids = torch.randint(-2, E + 2, (slots,), generator=gen, dtype=torch.int32)
    chunk, block_m = 64, 1 << block_m_log2
    chunks = -(-slots // chunk)
    keys = ids.long()
    valid = (keys >= 0) & (keys < E)
    counts = torch.zeros(chunks, E, dtype=torch.int64)
    counts.index_put_((torch.arange(slots)[valid] // chunk, keys[valid]), torch.ones(int(valid.sum()),
                                                                                   dtype=torch.int64),
                      accumulate=True)
    padded = -(-counts.sum(0) // block_m) * block_m
    starts = torch.cumsum(padded, 0) - padded
    max_padded = slots + E * (block_m - 1)
    args = dict(topk_ids=ids, expert_map=torch.empty(0, dtype=torch.int32),
                sorted_token_ids=torch.full((max_padded,), ALIGN_POISON, dtype=torch.int32),
                expert_ids=torch.full((-(-max_padded // block_m),), ALIGN_POISON, dtype=torch.int32),
                num_tokens_post_padded=torch.full((1,), ALIGN_POISON, dtype=torch.int32),
                counts=torch.full((chunks * E,), ALIGN_POISON, dtype=torch.int32),
                slots=slots, num_experts=E, block_m_log2=block_m_log2, max_padded=max_padded,
                max_blocks=-(-max_padded // block_m), map_mode=0, chunk=chunk, chunks=chunks)
    return ids, counts, padded, starts, args


def _chunk_offsets(counts: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """counts rewritten as each (chunk, key)'s first place: the key's start plus the counts
    of the chunks before."""
    return starts + torch.cumsum(counts, 0) - counts


@run_case("moe_align_count")
def align_count_case(variant, gen: torch.Generator) -> RunCase:
    ids, counts, _, _, args = _align_state(gen)
    expected = dict(sorted_token_ids=torch.full_like(args["sorted_token_ids"], args["slots"]),
                    counts=counts.reshape(-1).int())
    return RunCase(args=args, expected=expected, atol=0, rtol=0, note="700 slots, 13 experts, chunks of 64")


def _scan_outputs(padded: torch.Tensor, starts: torch.Tensor, args: dict) -> dict:
    """What the scan writes besides the offsets: each block's key, and the padded total."""
    block_m = 1 << args["block_m_log2"]
    expert_ids = torch.zeros(args["max_blocks"], dtype=torch.int32)
    for key in range(args["num_experts"]):
        expert_ids[int(starts[key]) // block_m:int(starts[key] + padded[key]) // block_m] = key
    return dict(expert_ids=expert_ids, num_tokens_post_padded=padded.sum().reshape(1).int())


def _placed(ids: torch.Tensor, starts: torch.Tensor, args: dict, fill: int) -> torch.Tensor:
    """sorted_token_ids with every in-range slot at its key's next place, `fill` elsewhere."""
    placed = torch.full_like(args["sorted_token_ids"], fill)
    place = starts.clone()
    for t, key in enumerate(ids.tolist()):
        if 0 <= key < args["num_experts"]:
            placed[place[key]] = t
            place[key] += 1
    return placed


@run_case("moe_align_scan")
def align_scan_case(variant, gen: torch.Generator) -> RunCase:
    ids, counts, padded, starts, args = _align_state(gen)
    args["counts"] = counts.reshape(-1).int()
    expected = dict(_scan_outputs(padded, starts, args), counts=_chunk_offsets(counts, starts).reshape(-1).int())
    return RunCase(args=args, expected=expected, atol=0, rtol=0, note="700 slots, 13 experts, chunks of 64")


@run_case("moe_align_scatter")
def align_scatter_case(variant, gen: torch.Generator) -> RunCase:
    ids, counts, _, starts, args = _align_state(gen)
    args["counts"] = _chunk_offsets(counts, starts).reshape(-1).int()
    expected = _placed(ids, starts, args, ALIGN_POISON)      # only the slots' places written
    return RunCase(args=args, expected=dict(sorted_token_ids=expected), atol=0, rtol=0,
                   note="700 slots, 13 experts, chunks of 64")


@run_case("moe_align_one")
def align_one_case(variant, gen: torch.Generator) -> RunCase:
    """The three phases in one workgroup (11 waves of 64 slots, the counts in LDS): the whole
    routing, the sentinel fill included."""
    ids, _, padded, starts, args = _align_state(gen)
    del args["counts"]
    expected = dict(_scan_outputs(padded, starts, args), sorted_token_ids=_placed(ids, starts, args, args["slots"]))
    return RunCase(args=args, expected=expected, atol=0, rtol=0, note="700 slots, 13 experts, one launch")

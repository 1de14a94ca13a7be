"""Launch recipe for aiter's fused-MoE stage 1 (gate/up GEMM + SiLU), see cases.py.

Host code: aiter_meta/csrc/py_itfs_cu/asm_moe_2stage.cu, struct KernelArgs and
moe_stage1_g1u1(), called by aiter/fused_moe.py asm_stage1() (ksplit 0: the kernel applies
the activation and writes out [tokens, topk, inter_dim] bf16). Routing comes from
moe_sorting: sorted_ids hold (topk slot << 24 | token) per expert, padded to block_m with
(topk << 24 | tokens); sorted_expert_ids one expert per block_m rows; num_valid_ids =
(padded row count, tokens) -- written here as aiter's op_tests/test_moe_sorting.py
moe_sorting_native does. fp8 (e4m3) activations with one f32 scale per token, fp8 w1
[E, 2*inter_dim (gate then up), model_dim] with one f32 scale per output row, pre-shuffled
by aiter/ops/shuffle.py shuffle_weight (layout (16, 16)).
"""
from __future__ import annotations

import math

import torch

from .cases import Case, Kernarg, aiter_symbol, poison

SILU = 0        # aiter_enum.h ActivationType::Silu


def moe_stage1_fp8(tokens: int, experts: int, topk: int, model_dim: int, inter_dim: int,
                   block_m: int = 32, seed: int = 0) -> Case:
    if inter_dim % 128 or model_dim % 128:
        raise ValueError(f"inter_dim and model_dim must be multiples of 128, got {inter_dim}, {model_dim}")
    g = torch.Generator().manual_seed(seed)
    x_f = torch.randn(tokens, model_dim, generator=g)
    a1_scale = x_f.abs().amax(-1, keepdim=True) / 448
    # Padding rows of sorted_ids name token `tokens`: the kernel loads that row (one past X)
    # and its scale, and drops the results. Give X and a1_scale one row of finite slack.
    x = torch.cat([(x_f / a1_scale), torch.ones(1, model_dim)]).to(torch.float8_e4m3fn)[:tokens]
    a1_scale = torch.cat([a1_scale, torch.ones(1, 1)])[:tokens]
    w_f = torch.randn(experts, 2 * inter_dim, model_dim, generator=g) / math.sqrt(model_dim)
    w1_scale = w_f.abs().amax(-1, keepdim=True) / 448
    w1 = (w_f / w1_scale).to(torch.float8_e4m3fn)
    topk_ids = torch.stack([torch.randperm(experts, generator=g)[:topk] for _ in range(tokens)]).to(torch.int32)
    sorted_ids, sorted_expert_ids, num_valid = _moe_sorting(topk_ids, experts, block_m)
    w1_shuf = w1.view(torch.uint8).view(experts, 2 * inter_dim // 16, 16, model_dim // 32, 2, 16)
    w1_shuf = w1_shuf.permute(0, 1, 3, 4, 2, 5).contiguous()
    out = poison((tokens, topk, inter_dim), torch.bfloat16)
    xb = x.view(torch.uint8)

    stride_gu = model_dim                         # dim * w1.element_size()
    ka = Kernarg(16 * 23)
    for off, t in ((0, out), (16, xb), (32, w1_shuf), (48, num_valid), (64, a1_scale), (80, w1_scale),
                   (112, sorted_ids), (128, sorted_expert_ids)):
        ka.ptr(off, t)
    ka.u32(144, model_dim)                        # dim = w2.size(1)
    ka.u32(160, inter_dim)
    ka.u32(176, tokens)
    ka.u32(192, experts)
    ka.u32(208, xb.stride(0))
    ka.u32(224, stride_gu)
    ka.u32(240, out.stride(0) * 2)
    ka.u32(256, stride_gu * inter_dim * 2)        # eGUs, doubled for g1u1
    ka.u32(272, w1_scale.stride(0) * 4)           # eGUQs
    ka.u32(288, inter_dim * 4)                    # eSMQs
    ka.u32(304, topk)
    ka.u32(320, 0)                                # splitk
    ka.u32(336, SILU)

    def check():
        xd = x.double() * a1_scale.double()
        wd = w1.double() * w1_scale.double()
        ref = torch.empty(tokens, topk, inter_dim, dtype=torch.float64)
        for t in range(tokens):
            for k in range(topk):
                h = wd[int(topk_ids[t, k])] @ xd[t]
                gate, up = h[:inter_dim], h[inter_dim:]
                ref[t, k] = torch.nn.functional.silu(gate) * up
        assert not out.isnan().any(), "out not fully written"
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())

    name = f"fmoe_stage1_bf16_pertokenFp8_g1u1_{block_m}x128_3tg_pf2"
    return Case(f"fmoe_2stages/{name}.co", aiter_symbol(name),
                (inter_dim // 128, sorted_expert_ids.numel(), 1), (256, 1, 1), ka.bytes(),
                [xb, w1_shuf, num_valid, a1_scale, w1_scale, sorted_ids, sorted_expert_ids, out], check)


def _moe_sorting(topk_ids: torch.Tensor, experts: int, block_m: int):
    tokens, topk = topk_ids.shape
    padded = topk_ids.numel() + experts * block_m - topk
    sorted_ids = torch.full((padded,), topk << 24 | tokens, dtype=torch.int32)
    sorted_expert_ids = torch.full((math.ceil(padded / block_m),), -1, dtype=torch.int32)
    row = blocks = 0
    for e in range(experts):
        tok, slot = torch.where(topk_ids == e)
        n = math.ceil(tok.numel() / block_m)
        sorted_ids[row:row + tok.numel()] = (slot << 24 | tok).to(torch.int32)
        sorted_expert_ids[blocks:blocks + n] = e
        row, blocks = row + n * block_m, blocks + n
    return sorted_ids, sorted_expert_ids, torch.tensor([row, tokens], dtype=torch.int32)

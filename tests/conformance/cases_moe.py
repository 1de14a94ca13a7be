"""Launch recipe for aiter's fused-MoE stage 1 (gate/up GEMM + SiLU), see cases.py.

Host code: aiter_meta/csrc/py_itfs_cu/asm_moe_2stage.cu, struct KernelArgs and
moe_stage1_g1u1(), called by aiter/fused_moe.py asm_stage1() (ksplit 0: the kernel applies
the activation and writes out [tokens, topk, inter_dim] bf16). The kernarg, grid and
moe_sorting buffers come from gfxasm.perf.aiter_fmoe (which cites the host code); this
file adds real data and the reference. fp8 (e4m3) activations with one f32 scale per token, fp8 w1
[E, 2*inter_dim (gate then up), model_dim] with one f32 scale per output row, pre-shuffled
by aiter/ops/shuffle.py shuffle_weight (layout (16, 16)).
"""
from __future__ import annotations

import math

import torch

from gfxasm.perf import aiter_fmoe

from .cases import Case, aiter_symbol, poison


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
    sorted_ids, _, sorted_expert_ids, num_valid = aiter_fmoe.moe_sorting(topk_ids, None, experts, block_m)
    w1_shuf = w1.view(torch.uint8).view(experts, 2 * inter_dim // 16, 16, model_dim // 32, 2, 16)
    w1_shuf = w1_shuf.permute(0, 1, 3, 4, 2, 5).contiguous()
    out = poison((tokens, topk, inter_dim), torch.bfloat16)
    xb = x.view(torch.uint8)

    w1_arg = w1_shuf.view(experts, 2 * inter_dim, model_dim)     # shuffle_weight keeps w1's shape
    ka = aiter_fmoe.kernarg(out, xb, w1_arg, num_valid, a1_scale, w1_scale, sorted_ids, sorted_expert_ids,
                            model_dim=model_dim, inter_dim=inter_dim, activation=aiter_fmoe.ACTIVATIONS["Silu"])

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
    cfg = aiter_fmoe.configs()[aiter_symbol(name)]
    return Case(f"fmoe_2stages/{name}.co", cfg.symbol, aiter_fmoe.grid(cfg, inter_dim, sorted_expert_ids.numel()),
                aiter_fmoe.BLOCK, ka,
                [xb, w1_shuf, num_valid, a1_scale, w1_scale, sorted_ids, sorted_expert_ids, out], check)


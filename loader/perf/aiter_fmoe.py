"""Launch aiter's asm fused-MoE stage-1 objects (`aiter_meta/hsa/gfx950/fmoe_2stages/*.co`) as aiter does.

Host side (amd-aiter 0.1.7.post2.dev18): `moe_stage1_g1u1` in the corpus file
`aiter_meta/csrc/py_itfs_cu/asm_moe_2stage.cu`, called by `aiter/fused_moe.py asm_stage1`.
`struct __attribute__((packed)) KernelArgs` is 23 16-byte slots (a pointer + `p2`, or a
32-bit value + `p3`, `aiter_meta/csrc/include/aiter_hip_common.h`): O, X, GU, XC
(num_valid_ids), XQ (a1_scale), GUQ (w1_scale), SMQ (never set: 0), STP (sorted_token_ids),
SEP (sorted_expert_ids), dim, hidden_dim, token_cnt, eprt_cnt, Xs, GUs, Os, eGUs, eGUQs,
eSMQs, topk, splitk, activation, SW (sorted_weights); the objects declare a 368-byte
kernarg segment. `get_cfg` picks the `_doweight` objects exactly when sorted_weights is
given, so the two families differ in the kernarg only by SW. Grid: x = ceil(inter_dim /
tile_N), y = sorted_expert_ids.size(0) (moe_sorting's max_num_m_blocks, not the blocks in
use: blocks past num_valid_ids exit), z = 2^ksplit; block 256. tile_M / tile_N per object:
the CSVs beside the objects (`fmoe_stage1_bf16_pertokenFp8[_doweight]_g1u1.csv`, read by
`fmoe_2stages/codegen.py` into `asm_moe_2stage_configs.hpp`); the host requires block_m ==
tile_M and inter_dim % tile_N == 0.

Data, as aiter's tuner makes it (`generate_data` / `generate_asm_stage1` in the corpus's
`aiter_meta/hsa/gfx942/fmoe_2stages/tune.py`, which the gfx950 tuner imports): fp8 X
[token, model_dim] with one f32 scale per token, fp8 w1 [E, 2*inter_dim, model_dim]
pre-shuffled in place (same shape) with one f32 scale per row, bf16 out [token, topk,
inter_dim]. Routing: `fused_topk(input, score, topk, renormalize=True)` of
`score = torch.randn(token, expert)` after `torch.manual_seed(0)`, on the GPU. Its CUDA
random stream cannot be reproduced here, so `routing()` draws the same distribution (top-k
of i.i.d. normal scores, softmax weights renormalised over the k) from a seeded CPU
generator: the experts each token picks match in law, not in draw. `moe_sorting` follows
aiter's `moe_sorting` (fused_moe.py): max_num_tokens_padded = topk_ids.numel() + E *
block_m - topk; slots (k << 24 | token) grouped by expert in token order, each expert
padded to block_m with (topk << 24 | token_cnt); num_valid_ids = (padded rows, tokens).

`per_Tensor` rows launch the same kernarg: asm_stage1 repeats the scalar scales into the
per-token [token, 1] and per-row [E, 2*inter_dim] shapes first (their two small copy
kernels fall inside the tuner's timing; not modelled). Only the 2-stage fp8 per-token
objects are covered; the 1-stage `fmoe_bf16_pertokenFp8_g1u1_vs_*` objects are launched by
other host code (`asm_fmoe.cu`) and are not.

Only sizes, addresses and the routing arrays matter to the timing model, so activations,
weights, scales and the output are `torch.empty`; X and its scales get one row of slack
because padding slots name token `token_cnt` and the kernel loads that row (and drops it).
"""
from __future__ import annotations

import csv
import math
import struct
from dataclasses import dataclass

import torch

from .aiter_f4gemm import _ptr, _slot_ptr, _slot_u32

KERNARG_BYTES = 368            # .kernarg_segment_size of every fmoe_stage1 object
BLOCK = (256, 1, 1)
CO_DIR = "aiter_meta/hsa/gfx950/fmoe_2stages"
CONFIG_CSVS = ("fmoe_stage1_bf16_pertokenFp8_g1u1.csv", "fmoe_stage1_bf16_pertokenFp8_doweight_g1u1.csv")
ACTIVATIONS = {"Silu": 0, "Gelu": 1}     # aiter_meta/csrc/include/aiter_enum.h ActivationType


@dataclass(frozen=True)
class FmoeConfig:
    symbol: str
    co: str              # corpus-relative path of the code object
    tile_m: int
    tile_n: int
    doweight: bool       # launched with sorted_weights (SW)


def configs() -> dict[str, FmoeConfig]:
    """symbol -> FmoeConfig for the fp8 per-token stage-1 objects, from the CSVs beside them."""
    from .. import corpus
    out = {}
    for name in CONFIG_CSVS:
        with open(corpus.path(f"{CO_DIR}/{name}"), newline="") as f:
            for row in csv.DictReader(f):
                out[row["knl_name"]] = FmoeConfig(row["knl_name"], f"{CO_DIR}/{row['co_name']}", int(row["tile_m"]),
                                                  int(row["tile_n"]), "_doweight_" in name)
    return out


def kernarg(out, x, w1, num_valid_ids, a1_scale, w1_scale, sorted_ids, sorted_expert_ids, *, model_dim: int,
            inter_dim: int, activation: int = ACTIVATIONS["Silu"], ksplit: int = 0, sorted_weights=None) -> bytes:
    """KernelArgs of asm_moe_2stage.cu as moe_stage1_g1u1 fills it. Shapes as the host reads
    them: token_cnt = x.size(0), topk = out.size(1), eprt = w1.size(0); `model_dim` is its
    `dim = w2.size(1)`. Strides in bytes; eGUs doubles when w1 holds gate and up."""
    for name, v in (("model_dim", model_dim), ("inter_dim", inter_dim)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if w1.dim() != 3 or w1.shape[2] != model_dim:
        raise ValueError(f"w1 must be [experts, N, model_dim={model_dim}], got {tuple(w1.shape)}")
    if out.dim() != 3:
        raise ValueError(f"out must be [tokens, topk, inter_dim], got {tuple(out.shape)}")
    stride_gu = model_dim * w1.element_size()
    stride_expert_gu = stride_gu * inter_dim * (2 if w1.shape[1] == 2 * inter_dim else 1)
    stride_expert_guq = w1_scale.stride(0) * 4 if w1_scale is not None else 0
    raw = b"".join([
        _slot_ptr(_ptr(out)), _slot_ptr(_ptr(x)), _slot_ptr(_ptr(w1)), _slot_ptr(_ptr(num_valid_ids)),
        _slot_ptr(_ptr(a1_scale)), _slot_ptr(_ptr(w1_scale)), _slot_ptr(0),     # ptr_SMQ: left unset
        _slot_ptr(_ptr(sorted_ids)), _slot_ptr(_ptr(sorted_expert_ids)),
        _slot_u32(model_dim), _slot_u32(inter_dim), _slot_u32(x.shape[0]), _slot_u32(w1.shape[0]),
        _slot_u32(x.stride(0) * x.element_size()), _slot_u32(stride_gu), _slot_u32(out.stride(0) * out.element_size()),
        _slot_u32(stride_expert_gu), _slot_u32(stride_expert_guq), _slot_u32(inter_dim * 4),
        _slot_u32(out.shape[1]), _slot_u32(ksplit), _slot_u32(activation),
        _slot_ptr(_ptr(sorted_weights)),
    ])
    assert len(raw) == KERNARG_BYTES
    return raw


def grid(cfg: FmoeConfig, inter_dim: int, m_blocks: int, ksplit: int = 0) -> tuple[int, int, int]:
    if inter_dim % cfg.tile_n:
        raise ValueError(f"{cfg.symbol} needs inter_dim % {cfg.tile_n} == 0, got inter_dim={inter_dim}")
    return (math.ceil(inter_dim / cfg.tile_n), m_blocks, 1 << ksplit)


def routing(tokens: int, experts: int, topk: int, seed: int = 0):
    """(topk_ids int32 [tokens, topk], topk_weights f32): fused_topk of N(0, 1) scores, renormalised."""
    if not 0 < topk <= experts:
        raise ValueError(f"topk must be in [1, experts={experts}], got {topk}")
    g = torch.Generator().manual_seed(seed)
    weights, ids = torch.randn(tokens, experts, generator=g).softmax(-1).topk(topk, dim=-1)
    return ids.to(torch.int32), weights / weights.sum(-1, keepdim=True)


def moe_sorting(topk_ids: torch.Tensor, topk_weights: torch.Tensor | None, experts: int, block_m: int):
    """(sorted_ids, sorted_weights, sorted_expert_ids, num_valid_ids) in moe_sorting's buffers.
    Blocks past the used ones get expert -1 (aiter leaves them unwritten; the kernel skips them)."""
    tokens, topk = topk_ids.shape
    padded = topk_ids.numel() + experts * block_m - topk
    sorted_ids = torch.full((padded,), topk << 24 | tokens, dtype=torch.int32)
    sorted_weights = torch.zeros(padded, dtype=torch.float32)
    sorted_expert_ids = torch.full((math.ceil(padded / block_m),), -1, dtype=torch.int32)
    row = blocks = 0
    for e in range(experts):
        tok, slot = torch.where(topk_ids == e)
        n = math.ceil(tok.numel() / block_m)
        sorted_ids[row:row + tok.numel()] = (slot << 24 | tok).to(torch.int32)
        if topk_weights is not None:
            sorted_weights[row:row + tok.numel()] = topk_weights[tok, slot]
        sorted_expert_ids[blocks:blocks + n] = e
        row, blocks = row + n * block_m, blocks + n
    return sorted_ids, sorted_weights, sorted_expert_ids, torch.tensor([row, tokens], dtype=torch.int32)


def weight_bytes(topk_ids: torch.Tensor, inter_dim: int, model_dim: int) -> int:
    """fp8 w1 bytes of the experts the routing uses (each read at least once)."""
    return int(topk_ids.unique().numel()) * 2 * inter_dim * model_dim


def launch(cfg: FmoeConfig, tokens: int, model_dim: int, inter_dim: int, experts: int, topk: int,
           activation: str = "Silu", seed: int = 0, used_blocks_only: bool = False) -> dict:
    """Keyword arguments for gfxasm.perf.estimate (co path, kernel, grid, block, kernarg, buffers).
    used_blocks_only: grid y cut to the blocks the routing fills (not how aiter launches: the
    timing model charges every workgroup of its sample alike, and the blocks past
    num_valid_ids only exit, so this and the full grid bracket the model's answer)."""
    from .. import corpus
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    ids, weights = routing(tokens, experts, topk, seed)
    sorted_ids, sorted_weights, sorted_expert_ids, num_valid = moe_sorting(ids, weights, experts, cfg.tile_m)
    x = torch.empty(tokens + 1, model_dim, dtype=torch.uint8)[:tokens]        # fp8 bytes, one row of slack
    a1_scale = torch.empty(tokens + 1, 1, dtype=torch.float32)[:tokens]
    w1 = torch.empty(experts, 2 * inter_dim, model_dim, dtype=torch.uint8)
    w1_scale = torch.empty(experts, 2 * inter_dim, 1, dtype=torch.float32)
    out = torch.empty(tokens, topk, inter_dim, dtype=torch.bfloat16)
    sw = sorted_weights if cfg.doweight else None
    ka = kernarg(out, x, w1, num_valid, a1_scale, w1_scale, sorted_ids, sorted_expert_ids, model_dim=model_dim,
                 inter_dim=inter_dim, activation=ACTIVATIONS[activation], sorted_weights=sw)
    buffers = [out, x, w1, num_valid, a1_scale, w1_scale, sorted_ids, sorted_expert_ids] + ([sw] if cfg.doweight else [])
    m_blocks = int(num_valid[0]) // cfg.tile_m if used_blocks_only else sorted_expert_ids.numel()
    return dict(co=str(corpus.path(cfg.co)), kernel=cfg.symbol, grid=grid(cfg, inter_dim, m_blocks),
                block=BLOCK, kernarg=ka, buffers=buffers)

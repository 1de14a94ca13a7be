"""MoE routing on the device: `gfxasm.moe_align_block_size` on asm/moe_align.s.

    sorted_token_ids, expert_ids, num_tokens_post_padded = gfxasm.moe_align_block_size(
        topk_ids, num_experts, block_m, expert_map=None)

vLLM's moe_align_block_size (vllm/model_executor/layers/fused_moe/moe_align_block_size.py,
with pad_sorted_ids=True), computed by one workgroup without a host sync:
  * slot t = token * top_k + k indexes topk_ids flattened (numel slots);
  * sorted_token_ids (int32) lists the slots of expert 0, then expert 1, ..., each expert's run
    padded with the sentinel numel to a multiple of block_m; every entry past the last run is
    the sentinel too. Within an expert the slots are in increasing order (vLLM leaves that
    order to its kernel; here it is fixed, so results are reproducible bit for bit);
  * expert_ids (int32) has one entry per block of block_m entries: the block's expert, or,
    with expert_map, expert_map[expert] (the local id, -1 for an expert not on this rank:
    such experts are still aligned, as in vLLM, and their blocks are skipped by the GEMMs);
    blocks past the last expert's are -1 (vLLM leaves 0 there, mapped; readers stop at
    num_tokens_post_padded either way);
  * num_tokens_post_padded (int32 [1]) = sum over experts of roundup(count, block_m).
  Sizes: max_num_tokens_padded = roundup(numel + num_experts * (block_m - 1), block_m), or
  numel * block_m when numel < num_experts (fewer slots than experts: at most numel runs);
  expert_ids has max_num_tokens_padded / block_m entries. So len(sorted_token_ids) /
  len(expert_ids) == block_m exactly, as gfxasm.mxfp8_moe_gemm requires.
  An id outside [0, num_experts) is skipped on the device (not checked on the host: that
  would need a sync): its slot appears nowhere and counts for no expert.

Limits (ValueError/TypeError naming the argument, before launch): topk_ids int32, 1-D or
2-D, contiguous, at most MAX_SLOTS (16384) entries (the ids live in LDS; the stable scatter
costs O(numel^2 / 256) VALU work, sized for decode); 1 <= num_experts <= MAX_EXPERTS (1024);
block_m a power of two in [1, 1024]; expert_map int32 [num_experts], contiguous; every tensor
on one device. numel = 0 gives empty outputs and a zero total without a launch.

torch op (declared on loader/ops/framework.py, no _out form):
gfxasm::moe_align_block_size(topk_ids, num_experts, block_m, expert_map) -> (sorted_token_ids,
expert_ids, num_tokens_post_padded), with a fake kernel; the checked launch is cached per layout.
"""
from __future__ import annotations

import torch

from ..gridexpr import cdiv
from ..launcher import prepare
from ..manifest import default_manifest
from . import arguments, framework

OP = "moe_align_block_size"
MAX_SLOTS = 16384                  # LDS holds one int32 id per slot (kernels.yaml: lds_bytes)
MAX_EXPERTS = 1024                 # ... and one count per expert
MAX_BLOCK_M = 1024


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def sizes(numel: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(len(sorted_token_ids), len(expert_ids)) for numel slots."""
    padded = cdiv(numel + num_experts * (block_m - 1), block_m) * block_m
    if numel < num_experts:
        padded = min(numel * block_m, padded)
    return padded, padded // block_m


def validate(topk_ids, num_experts, block_m, expert_map) -> tuple[int, int]:
    """Check what metadata tells (the fake kernel runs this); return the output sizes."""
    # dynamic-shape tracing passes the ints as SymInts; they size the outputs: specialise them
    num_experts, block_m = (int(v) if isinstance(v, torch.SymInt) else v for v in (num_experts, block_m))
    arguments.tensor(OP, "topk_ids", topk_ids, what="[T, top_k] int32")
    if topk_ids.dtype != torch.int32:
        _fail(TypeError, f"'topk_ids' dtype must be torch.int32, got {topk_ids.dtype}")
    if topk_ids.dim() not in (1, 2):
        _fail(ValueError, f"'topk_ids' must be [T, top_k] or flat, got shape {tuple(topk_ids.shape)}")
    if topk_ids.numel() and not topk_ids.is_contiguous():
        _fail(ValueError, f"'topk_ids' must be contiguous, got strides {topk_ids.stride()}")
    if topk_ids.numel() > MAX_SLOTS:
        _fail(ValueError, f"'topk_ids' has {topk_ids.numel()} entries; the kernel takes at most {MAX_SLOTS}")
    for name, value, top in (("num_experts", num_experts, MAX_EXPERTS), ("block_m", block_m, MAX_BLOCK_M)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            _fail(ValueError, f"'{name}' must be an int in [1, {top}], got {value!r}")
    if block_m & (block_m - 1):
        _fail(ValueError, f"'block_m' must be a power of two, got {block_m}")
    if expert_map is not None:
        if not isinstance(expert_map, torch.Tensor):
            _fail(TypeError, f"'expert_map' must be a torch.Tensor or None, got {type(expert_map).__name__}")
        if expert_map.dtype != torch.int32:
            _fail(TypeError, f"'expert_map' dtype must be torch.int32, got {expert_map.dtype}")
        if tuple(expert_map.shape) != (num_experts,):
            _fail(ValueError, f"'expert_map' must be [num_experts] = [{num_experts}], got shape "
                              f"{tuple(expert_map.shape)}")
        if not expert_map.is_contiguous():
            _fail(ValueError, f"'expert_map' must be contiguous, got strides {expert_map.stride()}")
    return sizes(topk_ids.numel(), num_experts, block_m)


def launch_args(topk_ids, num_experts, block_m, expert_map, outs) -> dict:
    """moe_align's kernel arguments for a validated call writing `outs` (shared with bench/moe.py)."""
    no_map = torch.empty(0, dtype=torch.int32, device=topk_ids.device)
    return dict(topk_ids=topk_ids.reshape(-1), expert_map=no_map if expert_map is None else expert_map,
                sorted_token_ids=outs[0], expert_ids=outs[1], num_tokens_post_padded=outs[2], slots=topk_ids.numel(),
                num_experts=num_experts, block_m_log2=block_m.bit_length() - 1, max_padded=outs[0].numel(),
                max_blocks=outs[1].numel(), has_map=int(expert_map is not None))


def _check(call) -> tuple[int, int]:
    return validate(call.topk_ids, call.num_experts, call.block_m, call.expert_map)


def _allocate(call, names: frozenset) -> dict:
    padded, blocks = _check(call)
    new = lambda n: torch.empty(n, dtype=torch.int32, device=call.topk_ids.device)   # noqa: E731
    return dict(sorted_token_ids=new(padded), expert_ids=new(blocks), num_tokens_post_padded=new(1))


def _zero_total(call) -> None:
    call.num_tokens_post_padded.zero_()


def _plan(_sizes: tuple[int, int], call) -> framework.Plan:
    if call.topk_ids.numel() == 0:
        return framework.Plan(empty=_zero_total)
    outs = (call.sorted_token_ids, call.expert_ids, call.num_tokens_post_padded)
    return framework.Plan((prepare(default_manifest().kernel("moe_align").variant(None),
                                   launch_args(call.topk_ids, call.num_experts, call.block_m, call.expert_map, outs)),))


MOE_ALIGN_BLOCK_SIZE = framework.define(framework.Spec(
    OP,
    params=(framework.Param("topk_ids", "Tensor"), framework.Param("num_experts", "SymInt"),
            framework.Param("block_m", "SymInt"), framework.Param("expert_map", "Tensor?")),
    outputs=(framework.Output("sorted_token_ids"), framework.Output("expert_ids"),
             framework.Output("num_tokens_post_padded")),
    check=_check, allocate=_allocate, plan=_plan, out_form=False))


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int,
                         expert_map: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM's layout (module docstring).

    topk_ids [T, top_k] int32; num_experts: the global expert count; block_m: rows per GEMM
    block (a power of two); expert_map: int32 [num_experts], global -> local expert id or -1."""
    return MOE_ALIGN_BLOCK_SIZE(topk_ids, num_experts, block_m, expert_map)


# ------------------------------------------------------------------ reference

def reference(ids: list[int], num_experts: int, block_m: int, expert_map: list[int] | None = None
              ) -> tuple[list[int], list[int], int]:
    """The contract above in plain Python (lists and loops, no sorting routine): (sorted_token_ids,
    expert_ids, num_tokens_post_padded) for the flattened ids."""
    n = len(ids)
    padded, blocks = sizes(n, num_experts, block_m)
    sorted_ids, expert_ids, pos = [n] * padded, [-1] * blocks, 0
    for e in range(num_experts):
        run = [t for t in range(n) if ids[t] == e]
        sorted_ids[pos:pos + len(run)] = run
        for b in range(cdiv(len(run), block_m)):
            expert_ids[pos // block_m + b] = e if expert_map is None else expert_map[e]
        pos += cdiv(len(run), block_m) * block_m
    return sorted_ids, expert_ids, pos


def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    @run_case("moe_align")
    def align_case(variant, gen, T=37, top_k=5, E=129, block_m=16) -> RunCase:
        ids = torch.randint(-1, E + 1, (T * top_k,), generator=gen, dtype=torch.int32)   # a few out of range
        want = reference(ids.tolist(), E, block_m)
        padded, blocks = sizes(ids.numel(), E, block_m)
        poison = lambda n: torch.full((n,), -7, dtype=torch.int32)   # noqa: E731
        return RunCase(args=dict(topk_ids=ids, expert_map=torch.empty(0, dtype=torch.int32),
                                 sorted_token_ids=poison(padded), expert_ids=poison(blocks),
                                 num_tokens_post_padded=poison(1), slots=ids.numel(), num_experts=E,
                                 block_m_log2=block_m.bit_length() - 1, max_padded=padded, max_blocks=blocks,
                                 has_map=0),
                       expected=dict(sorted_token_ids=torch.tensor(want[0], dtype=torch.int32),
                                     expert_ids=torch.tensor(want[1], dtype=torch.int32),
                                     num_tokens_post_padded=torch.tensor([want[2]], dtype=torch.int32)),
                       atol=0, rtol=0, note=f"{T}x{top_k} slots, {E} experts, block_m {block_m}")


_register_run_case()

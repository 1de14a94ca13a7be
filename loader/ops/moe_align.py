"""MoE routing alignment: gfxasm.moe_align_block_size on asm/moe_align.s, a drop-in for vLLM's.

    sorted_token_ids, expert_ids, num_tokens_post_padded = gfxasm.moe_align_block_size(
        topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False,
        ignore_invalid_experts=False)

vLLM's moe_align_block_size (vllm/model_executor/layers/fused_moe/moe_align_block_size.py and
csrc/moe/moe_align_sum_kernels.cu at main): the same signature, output sizes and contents,
computed on the device without a host sync:
  * slot t = token * top_k + k indexes topk_ids flattened (numel slots). A slot's key is its
    expert e = topk_ids[t]; with expert_map and ignore_invalid_experts, its local expert
    expert_map[e], and the slots of experts the map marks -1 are left out entirely;
  * sorted_token_ids (int32) lists the slots of key 0, then key 1, ..., each key's run padded
    with the sentinel numel to a multiple of block_size; every other entry is the sentinel.
    Within a run the slots are in increasing order (vLLM leaves that order to its atomics;
    here it is fixed, so results are reproducible bit for bit);
  * expert_ids (int32) has one entry per block of block_size entries: the block's key; with
    expert_map and not ignore_invalid_experts, expert_map[expert] (every expert is aligned
    and an expert not on this rank has -1: the GEMMs skip its blocks). Blocks past the last
    run hold 0 (as vLLM: mapped through expert_map in that case, i.e. expert_map[0]);
  * num_tokens_post_padded (int32 [1]) = sum over keys of roundup(count, block_size).
  Sizes (vLLM's): max_num_tokens_padded = numel + num_experts * (block_size - 1), rounded up to
  a multiple of block_size with pad_sorted_ids; when numel < num_experts, at most
  numel * block_size (fewer slots than experts: at most numel runs). expert_ids has
  cdiv(max_num_tokens_padded, block_size) entries. gfxasm.mxfp8_moe_gemm takes block_m =
  len(sorted_token_ids) / len(expert_ids), so it needs pad_sorted_ids=True (or numel <
  num_experts), where that division is exact.
  An id outside [0, num_experts), or a local id outside it (negative ones included), is
  skipped on the device (no host check: that would need a sync): its slot appears nowhere and
  counts for no key. (vLLM skips ids >= num_experts; a negative one is out of its contract.)

Kernels (three launches, each O(slots) or less; asm/moe_align.s has the details): the slots
are cut into `chunks` chunks of `chunk` slots, one wave each. 1. count: the sentinel fill, and
each chunk's count per key into a workspace counts [chunks, num_experts]; 2. scan (one
workgroup, a work-item per key): each key's total and start, expert_ids, the total, and counts
rewritten as each (chunk, key)'s first place; 3. scatter: each chunk places its slots from
those offsets, 64 at a time, a slot's rank within the 64 from the lower lanes' keys.
choose_chunk balances the scatter's rounds per chunk against the scan's walk down the chunks.
Up to ONE_LAUNCH_MAX_SLOTS (7,168) slots, one launch instead (moe_align_one): one workgroup
of 16 waves, a chunk each, runs the same three phases with s_barrier between them and the
counts in LDS (no workspace); its output is bit for bit the three launches'. Modelled (gfxasm.perf,
launch overheads included; bench/moe.py --align, top-8 routing on 129 experts, block_size 64):
1,024 slots 6.32 us (three launches: 13.15), 7,168 slots 16.93 (17.96); above it three launches:
16,384 slots 21.34, 262,144 slots 55.19.

Limits (ValueError/TypeError naming the argument, before launch): topk_ids int32, [T, top_k]
or flat, contiguous, at most MAX_SLOTS entries; 1 <= num_experts <= MAX_EXPERTS (1024, the
LDS tables); block_size a power of two in [1, 1024]; expert_map int32 [num_experts],
contiguous; pad_sorted_ids and ignore_invalid_experts bools; every tensor on one device.
numel = 0 gives empty outputs and a zero total without a launch.

torch op (declared on loader/ops/framework.py, no _out form): gfxasm::moe_align_block_size(
topk_ids, block_size, num_experts, expert_map, pad_sorted_ids, ignore_invalid_experts) ->
(sorted_token_ids, expert_ids, num_tokens_post_padded), with a fake kernel; the checked
launches are cached per layout, each call binding a fresh workspace.
"""
from __future__ import annotations

import math

import torch

from ..gridexpr import cdiv
from ..launcher import PreparedLaunch, prepare
from ..manifest import default_manifest
from . import arguments, framework

OP = "moe_align_block_size"
THREE_LAUNCHES = ("moe_align_count", "moe_align_scan", "moe_align_scatter")   # in launch order
ONE_LAUNCH = "moe_align_one"
KERNELS = (ONE_LAUNCH, *THREE_LAUNCHES)   # every kernel the op may launch
MAX_SLOTS = 1 << 24                # slot ids and places stay below 2^31 bytes of int32
MAX_EXPERTS = 1024                 # each wave's LDS table holds one entry per key
MAX_BLOCK_SIZE = 1024
# A chunk of 64 r slots costs the scatter ~r round trips in turn, and chunks / 16 cost the scan
# as many (bench/moe.py --align, modelled): r ~ sqrt(slots / CHUNK_BALANCE) balances the two.
CHUNK_BALANCE = 1024
# Up to this many slots one workgroup does all three phases in one launch (ONE_LAUNCH_WAVES
# chunks, counts in LDS, no workspace): two launch overheads fewer, but the scatter runs on 16
# waves only, each wave one round of 64 slots per 1,024 slots. Modelled (top-8 on 129 experts,
# block_size 64; module docstring): one launch 16.93 us against three 17.96 at 7,168 slots
# (7 rounds a wave), 18.54 against 17.96 at 7,176 (8 rounds): the crossover.
ONE_LAUNCH_WAVES = 16
ONE_LAUNCH_MAX_SLOTS = ONE_LAUNCH_WAVES * 7 * 64


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def sizes(numel: int, block_size: int, num_experts: int, pad_sorted_ids: bool) -> tuple[int, int]:
    """(len(sorted_token_ids), len(expert_ids)) for numel slots, as vLLM sizes them."""
    padded = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        padded = cdiv(padded, block_size) * block_size
    if numel < num_experts:
        padded = min(numel * block_size, padded)
    return padded, cdiv(padded, block_size)


def one_launch(numel: int) -> bool:
    """Whether numel slots take the one-launch form (moe_align_one)."""
    return numel <= ONE_LAUNCH_MAX_SLOTS


def choose_chunk(numel: int) -> tuple[int, int]:
    """(chunk, chunks): slots per wave and their number. One launch: the slots spread over its
    ONE_LAUNCH_WAVES waves, cdiv(numel, 64 ONE_LAUNCH_WAVES) rounds each. Three launches: 64 r
    with r = isqrt(cdiv(numel, CHUNK_BALANCE)) >= 1 rounds (16,384 slots: 256; 262,144: 1,024)."""
    if one_launch(numel):
        chunk = 64 * cdiv(numel, 64 * ONE_LAUNCH_WAVES)
    else:
        chunk = 64 * max(1, math.isqrt(cdiv(numel, CHUNK_BALANCE)))
    return chunk, cdiv(numel, chunk)


def map_mode(expert_map, ignore_invalid_experts: bool) -> int:
    """The kernels' map_mode: 0 no map, 1 expert_ids through the map, 2 keys through the map."""
    return 0 if expert_map is None else 2 if ignore_invalid_experts else 1


def validate(topk_ids, block_size, num_experts, expert_map, pad_sorted_ids, ignore_invalid_experts
             ) -> tuple[int, int]:
    """Check what metadata tells (the fake kernel runs this); return the output sizes."""
    # dynamic-shape tracing passes the ints as SymInts; they size the outputs: specialise them
    block_size, num_experts = (int(v) if isinstance(v, torch.SymInt) else v for v in (block_size, num_experts))
    arguments.tensor(OP, "topk_ids", topk_ids, what="[T, top_k] int32")
    if topk_ids.dtype != torch.int32:
        _fail(TypeError, f"'topk_ids' dtype must be torch.int32, got {topk_ids.dtype}")
    if topk_ids.dim() not in (1, 2):
        _fail(ValueError, f"'topk_ids' must be [T, top_k] or flat, got shape {tuple(topk_ids.shape)}")
    if topk_ids.numel() and not topk_ids.is_contiguous():
        _fail(ValueError, f"'topk_ids' must be contiguous, got strides {topk_ids.stride()}")
    if topk_ids.numel() > MAX_SLOTS:
        _fail(ValueError, f"'topk_ids' has {topk_ids.numel()} entries; the kernels take at most {MAX_SLOTS}")
    for name, value, top in (("block_size", block_size, MAX_BLOCK_SIZE), ("num_experts", num_experts, MAX_EXPERTS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            _fail(ValueError, f"'{name}' must be an int in [1, {top}], got {value!r}")
    if block_size & (block_size - 1):
        _fail(ValueError, f"'block_size' must be a power of two, got {block_size}")
    for name, value in (("pad_sorted_ids", pad_sorted_ids), ("ignore_invalid_experts", ignore_invalid_experts)):
        if not isinstance(value, bool):
            _fail(TypeError, f"'{name}' must be a bool, got {type(value).__name__}")
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
    return sizes(topk_ids.numel(), block_size, num_experts, pad_sorted_ids)


def workspace_numel(numel: int, num_experts: int) -> int:
    """The int32 elements of the counts [chunks, num_experts] the three launches share (one
    per call); 0 for the one-launch form, whose counts stay in LDS."""
    return 0 if one_launch(numel) else num_experts * choose_chunk(numel)[1]


def workspace(numel: int, num_experts: int, device) -> torch.Tensor:
    """A fresh workspace (`workspace_numel`)."""
    return torch.empty(workspace_numel(numel, num_experts), dtype=torch.int32, device=device)


def launch_args(topk_ids, block_size, num_experts, expert_map, ignore_invalid_experts, outs, counts) -> dict:
    """The kernels' arguments (the three launches take the same; the one launch all but
    `counts`) for a validated call writing `outs` with workspace `counts` (shared with
    moe_layer and bench/moe.py)."""
    no_map = torch.empty(0, dtype=torch.int32, device=topk_ids.device)
    chunk, chunks = choose_chunk(topk_ids.numel())
    return dict(topk_ids=topk_ids.reshape(-1), expert_map=no_map if expert_map is None else expert_map,
                sorted_token_ids=outs[0], expert_ids=outs[1], num_tokens_post_padded=outs[2], counts=counts,
                slots=topk_ids.numel(), num_experts=num_experts, block_m_log2=block_size.bit_length() - 1,
                max_padded=outs[0].numel(), max_blocks=outs[1].numel(),
                map_mode=map_mode(expert_map, ignore_invalid_experts), chunk=chunk, chunks=chunks)


def kernel_args(kernel: str, args: dict) -> dict:
    """The arguments of `args` (launch_args) that `kernel` takes: the one launch has no workspace."""
    return {k: v for k, v in args.items() if k != "counts"} if kernel == ONE_LAUNCH else args


def prepared(args: dict) -> tuple[PreparedLaunch, ...]:
    """The launches on `args` (launch_args), in order: one_launch(slots)'s form."""
    manifest = default_manifest()
    names = (ONE_LAUNCH,) if one_launch(args["slots"]) else THREE_LAUNCHES
    return tuple(prepare(manifest.kernel(name).variant(None), kernel_args(name, args)) for name in names)


def _check(call) -> tuple[int, int]:
    return validate(call.topk_ids, call.block_size, call.num_experts, call.expert_map, call.pad_sorted_ids,
                    call.ignore_invalid_experts)


def _allocate(call, names: frozenset) -> dict:
    padded, blocks = _check(call)
    new = lambda n: torch.empty(n, dtype=torch.int32, device=call.topk_ids.device)   # noqa: E731
    return dict(sorted_token_ids=new(padded), expert_ids=new(blocks), num_tokens_post_padded=new(1))


def _zero_total(call) -> None:
    call.num_tokens_post_padded.zero_()


def _plan(_sizes: tuple[int, int], call) -> framework.Plan:
    numel, device = call.topk_ids.numel(), call.topk_ids.device
    if numel == 0:
        return framework.Plan(empty=_zero_total)
    outs = (call.sorted_token_ids, call.expert_ids, call.num_tokens_post_padded)
    args = launch_args(call.topk_ids, call.block_size, call.num_experts, call.expert_map,
                       call.ignore_invalid_experts, outs, workspace(numel, call.num_experts, device))
    if one_launch(numel):
        return framework.Plan(prepared(args))
    # a workspace per call: concurrent calls of one layout must not share one
    counts = (workspace_numel(numel, call.num_experts),)
    return framework.Plan(prepared(args), scratch=dict(counts=(counts, torch.int32)))


MOE_ALIGN_BLOCK_SIZE = framework.define(framework.Spec(
    OP,
    params=(framework.Param("topk_ids", "Tensor"), framework.Param("block_size", "SymInt"),
            framework.Param("num_experts", "SymInt"), framework.Param("expert_map", "Tensor?"),
            framework.Param("pad_sorted_ids", "bool"), framework.Param("ignore_invalid_experts", "bool")),
    outputs=(framework.Output("sorted_token_ids"), framework.Output("expert_ids"),
             framework.Output("num_tokens_post_padded")),
    check=_check, allocate=_allocate, plan=_plan, out_form=False))


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int,
                         expert_map: torch.Tensor | None = None, pad_sorted_ids: bool = False,
                         ignore_invalid_experts: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM's op (module docstring).

    topk_ids [T, top_k] int32 (global expert ids); block_size: rows per GEMM block (a power of
    two); num_experts: the global expert count; expert_map: int32 [num_experts], global ->
    local expert id or -1; pad_sorted_ids: len(sorted_token_ids) a multiple of block_size;
    ignore_invalid_experts: leave out the experts expert_map marks -1 (runs by local id)."""
    return MOE_ALIGN_BLOCK_SIZE(topk_ids, block_size, num_experts, expert_map, pad_sorted_ids,
                                ignore_invalid_experts)


# ------------------------------------------------------------------ reference

def reference(ids: list[int], block_size: int, num_experts: int, expert_map: list[int] | None = None,
              pad_sorted_ids: bool = False, ignore_invalid_experts: bool = False
              ) -> tuple[list[int], list[int], int]:
    """The contract above in plain Python (lists and loops, no sorting routine): (sorted_token_ids,
    expert_ids, num_tokens_post_padded) for the flattened ids."""
    n = len(ids)
    padded, blocks = sizes(n, block_size, num_experts, pad_sorted_ids)
    keys = [e if 0 <= e < num_experts else -1 for e in ids]
    by_key = expert_map is not None and ignore_invalid_experts
    if by_key:
        keys = [expert_map[e] if e >= 0 else -1 for e in keys]
        keys = [k if 0 <= k < num_experts else -1 for k in keys]
    value = (lambda k: k) if expert_map is None or by_key else (lambda k: expert_map[k])   # noqa: E731
    sorted_ids, expert_ids, pos = [n] * padded, [value(0)] * blocks, 0
    for k in range(num_experts):
        run = [t for t in range(n) if keys[t] == k]
        sorted_ids[pos:pos + len(run)] = run
        for b in range(cdiv(len(run), block_size)):
            expert_ids[pos // block_size + b] = value(k)
        pos += cdiv(len(run), block_size) * block_size
    return sorted_ids, expert_ids, pos

"""MX-FP8 grouped GEMM over sorted tokens (MoE): `gfxasm.mxfp8_moe_gemm` on asm/mxfp8_moe_gemm.s.

    out = gfxasm.mxfp8_moe_gemm(a, a_scale, w, w_scale, sorted_token_ids, expert_ids,
                                num_tokens_post_padded, a_div=top_k, topk_weights=None)
    out[t, n] = topk_weights[t] * sum_k A'[t // a_div, k] * W'[expert of t, n, k]

with A' = a * 2^(a_scale - 127), W' = w * 2^(w_scale - 127) (OCP MX-FP8: e4m3 codes, one E8M0
scale per 32 elements along K). a [M, K], a_scale [M, K/32]; w [E, N, K], w_scale [E, N, K/32]
(float8_e4m3fn; scales float8_e8m0fnu or raw uint8 exponent bytes, plain row-major).

Routing, vLLM's moe_align_block_size layout: a slot t = token * top_k + k (num_valid =
M * a_div slots; a_div = top_k for gate_up, where a holds one row per token, and 1 for down,
where a holds one row per slot). sorted_token_ids [S] lists slots grouped by expert, each
expert's run padded to a multiple of block_m with the sentinel num_valid; expert_ids [S /
block_m] names each block's expert; num_tokens_post_padded (int32 [1], on the device) ends
the used blocks. block_m = S / len(expert_ids) must divide exactly and be 16, 32 or 64
(gfxasm.moe_align_block_size(..., pad_sorted_ids=True) sizes them so).

One output row per slot (no sum over top_k): out is [num_valid, N]. Rows of slots that no
processed block names are left untouched (pass `out` to keep their contents; a fresh
output's untouched rows are uninitialised). On the device, without a host sync:
  * blocks at or past num_tokens_post_padded are skipped;
  * a block whose expert id is -1 (expert not on this rank) or otherwise outside [0, E) is
    skipped: its rows are not written;
  * a slot id >= num_valid (the padding sentinel) or negative is skipped.
topk_weights (float32, [T, top_k] or flattened [num_valid]), when given, scales row t by
topk_weights[t] (in f32, before the rounding to out_dtype).

Limits (checked before launch; a violation is a ValueError/TypeError naming the argument):
0 < K < 2^24, K % 32 == 0; a, a_scale, out and one expert's weights (N * K bytes) each below 2^31 bytes
(32-bit buffer offsets); the weight tensor itself may be any size: each block addresses its
expert through a 64-bit base (expert * N * K computed in 64 bits), so E = 256 x 1536 x 6144
(2.4 GB) works. num_valid < 2^24, 1 <= a_div <= 64 (and a_div in {1, top_k} when
topk_weights is [T, top_k]), every tensor contiguous, a and w 16-byte aligned, out not
overlapping an input. Output bf16 or fp16.

Kernel (asm/mxfp8_moe_gemm.s): one workgroup per (block, 16*NT output columns), the scaled MFMA
v_mfma_scale_f32_16x16x128_f8f6f4 on block_m gathered activation rows against the block's
expert's weight rows, K split over the 4 waves. A block's expert weights are read once per
block: an expert with more than block_m slots has several blocks and re-reads them (through
L2 when they run together); in decode, with block_m at least the largest expert's slot
count, every expert present is read exactly once per launch. Tile width: choose_nt (16, 32 or
64 columns for block_m 16 and 64, 16 or 32 for 32). Modelled speed at the seed's shapes:
bench/moe_gemm.py; in the MoE layer at T = 1 ... 16,384 tokens: bench/moe.py.

torch ops (declared on loader/ops/framework.py): gfxasm::mxfp8_moe_gemm(a, a_scale, w, w_scale,
sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, topk_weights, out_dtype) -> out and
gfxasm::mxfp8_moe_gemm_out(..., topk_weights, out!, out_dtype), with fake kernels. The checked
launch is cached per tensor layout and scalars, so a repeated call only checks pointers and launches.

The MoE layer (gfxasm.mxfp8_moe) runs its gate_up product through `gate_up_swiglu`, a private
fused form (the SWIGLU variant of the same kernel): each workgroup takes 32 gate columns and
the matching up columns, rounds the sums to bf16 as this op would, and applies
swiglu_mxfp8_quant's activation and MX-FP8 quantisation (the same assembly) in its epilogue,
writing e4m3 q and E8M0 scales instead of bf16 h: bit-equal to this op followed by
gfxasm.swiglu_mxfp8_quant, one launch and the h round trip fewer.

`reference` is the exact product of the quantized operands (float64).
"""
from __future__ import annotations

import torch

from ..gridexpr import cdiv, magic_u32
from ..launcher import launch, prepare
from ..manifest import default_manifest
from . import arguments, framework
from .mxfp8_gemm import BLOCK, E4M3, E8M0, OUT_DTYPES, SCALE_DTYPES, dequantize

OP = "mxfp8_moe_gemm"
BLOCK_MS = (16, 32, 64)            # rows per block: MT = block_m / 16 MFMA row tiles
MAX_A_DIV = 64                     # the kernel's t // a_div by multiply-high is exact up to here
MAX_VALID = 2**24                  # ... for slot ids below this
MAX_K = 2**24                      # weight-row offsets (N + 63) * K stay below 2^32
_MAX_BYTES = 2**31                 # 32-bit buffer offsets (OOB_OFFSET = 2^31)
CUS = 256                          # compute units of an MI355X
WIDE_SLACK = 1.25                  # choose_nt: how much less even a wider tile may spread the columns


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def _tensor(name: str, value, what: str) -> torch.Tensor:
    return arguments.tensor(OP, name, value, what=what)


def _shape(name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        _fail(ValueError, f"'{name}' must be {what} = {list(shape)}, got shape {tuple(t.shape)}")


def _check_a_div(a_div) -> None:
    if isinstance(a_div, bool) or not isinstance(a_div, int) or not 1 <= a_div <= MAX_A_DIV:
        _fail(ValueError, f"'a_div' must be an int in [1, {MAX_A_DIV}] (top_k for gate_up, 1 for down), got "
                          f"{a_div!r}")


def validate(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, topk_weights,
             out, out_dtype) -> dict:
    """Check everything metadata can tell (the fake kernels run this); return the sizes.
    The devices are the framework's to check (one device for every tensor of the call)."""
    if out_dtype not in OUT_DTYPES:
        _fail(TypeError, f"'out_dtype' must be torch.bfloat16 or torch.float16, got {out_dtype}")
    what = {"a": "[M, K] activations", "a_scale": "[M, K/32] E8M0 scales", "w": "[E, N, K] expert weights",
            "w_scale": "[E, N, K/32] E8M0 scales", "sorted_token_ids": "[S] int32 slot ids",
            "expert_ids": "[S / block_m] int32 expert per block", "num_tokens_post_padded": "int32 [1]"}
    tensors = {name: _tensor(name, value, what[name]) for name, value in
               (("a", a), ("a_scale", a_scale), ("w", w), ("w_scale", w_scale), ("sorted_token_ids", sorted_token_ids),
                ("expert_ids", expert_ids), ("num_tokens_post_padded", num_tokens_post_padded))}
    for name in ("a", "w"):
        if tensors[name].dtype != E4M3:
            _fail(TypeError, f"'{name}' dtype must be torch.float8_e4m3fn, got {tensors[name].dtype}")
    for name in ("a_scale", "w_scale"):
        if tensors[name].dtype not in SCALE_DTYPES:
            _fail(TypeError, f"'{name}' dtype must be torch.float8_e8m0fnu or torch.uint8 (E8M0 exponent bytes), "
                             f"got {tensors[name].dtype}")
    for name in ("sorted_token_ids", "expert_ids", "num_tokens_post_padded"):
        if tensors[name].dtype != torch.int32:
            _fail(TypeError, f"'{name}' dtype must be torch.int32, got {tensors[name].dtype}")
    for name, rank in (("a", 2), ("a_scale", 2), ("w", 3), ("w_scale", 3), ("sorted_token_ids", 1),
                       ("expert_ids", 1)):
        if tensors[name].dim() != rank:
            _fail(ValueError, f"'{name}' must be {rank}-D ({what[name]}), got shape {tuple(tensors[name].shape)}")
    if num_tokens_post_padded.numel() != 1:
        _fail(ValueError, f"'num_tokens_post_padded' must hold one int32, got shape "
                          f"{tuple(num_tokens_post_padded.shape)}")
    M, K = a.shape
    E, N, Kw = w.shape
    if K % BLOCK or not 0 < K < MAX_K:
        _fail(ValueError, f"K (a.shape[1]) must be a positive multiple of {BLOCK} below 2^24, got {K}")
    if Kw != K:
        _fail(ValueError, f"'w' must be [E, N, K] with K = {K} (a's), got shape {tuple(w.shape)}")
    _shape("a_scale", a_scale, (M, K // BLOCK), "[M, K/32]")
    _shape("w_scale", w_scale, (E, N, K // BLOCK), "[E, N, K/32]")
    S, blocks = sorted_token_ids.numel(), expert_ids.numel()
    if blocks == 0 or S % blocks or S // blocks not in BLOCK_MS:
        _fail(ValueError, f"block_m = len(sorted_token_ids) / len(expert_ids) must be exactly one of {BLOCK_MS}, got "
                          f"{S} / {blocks} (moe_align_block_size sizes them so with pad_sorted_ids=True)")
    block_m = S // blocks
    _check_a_div(a_div)
    valid = M * a_div
    if topk_weights is not None:
        tw = _tensor("topk_weights", topk_weights, "[T, top_k] or [T*top_k] float32 router weights")
        if tw.dtype != torch.float32:
            _fail(TypeError, f"'topk_weights' dtype must be torch.float32, got {tw.dtype}")
        if tw.dim() == 2 and a_div not in (1, tw.shape[1]):
            _fail(ValueError, f"'a_div' must be 1 or top_k = topk_weights.shape[1] = {tw.shape[1]}, got {a_div}")
        if tw.dim() not in (1, 2) or tw.numel() != valid:
            _fail(ValueError, f"'topk_weights' must be [T, top_k] or flat with M * a_div = {valid} elements (one "
                              f"per slot), got shape {tuple(tw.shape)}")
    if valid >= MAX_VALID:
        _fail(ValueError, f"M * a_div = {valid} slots; the kernel needs fewer than 2^24")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(TypeError, f"'out' must be a torch.Tensor or None, got {type(out).__name__}")
        if out.dtype != out_dtype:
            _fail(TypeError, f"'out' dtype must be out_dtype ({out_dtype}), got {out.dtype}")
        _shape("out", out, (valid, N), "[M * a_div, N]")
    named = dict(tensors, **({"topk_weights": topk_weights} if topk_weights is not None else {}),
                 **({"out": out} if out is not None else {}))
    for name, t in named.items():
        if t.numel() and not t.is_contiguous():
            _fail(ValueError, f"'{name}' must be contiguous, got strides {t.stride()}")
    for name, nbytes in (("a", M * K), ("a_scale", M * K // BLOCK), ("w (one expert, N * K)", N * K),
                         ("out", valid * N * 2), ("sorted_token_ids", 4 * S)):
        if nbytes >= _MAX_BYTES:
            _fail(ValueError, f"'{name}' is {nbytes} bytes; the kernel addresses it with 32-bit offsets and needs "
                              f"it below 2^31 bytes")
    return dict(M=M, K=K, E=E, N=N, valid=valid, blocks=blocks, block_m=block_m)


def choose_nt(sizes: dict) -> int:
    """16-column strips per workgroup: the widest tile (fewer, longer workgroups: each pays
    its prologue's dependent loads once) whose spread of the weight columns over the CUS
    compute units is within WIDE_SLACK of the most even one. The blocks that carry tokens
    number about min(blocks, slots / block_m + min(experts, slots)) (each expert's slots fill
    whole blocks but its last), and a CU streams about ceil(workgroups / CUS) * NT strips.
    block_m 16 and 64 take NT 4, 2 or 1, 32 takes 2 or 1 (VGPRs: MT * NT
    D tiles and the K loop's two or three register sets; block_m 32 at 64 columns halves the
    workgroups per CU and the timing model finds it no faster at T = 256, bench/moe.py).
    Checked against the timing model in bench/moe_gemm.py (decode) and bench/moe.py (prefill:
    the layer's down GEMM at T = 4,096, block_m 64, 842 us at 16 columns, 365 us at 64)."""
    busy = min(sizes["blocks"], sizes["valid"] // sizes["block_m"] + min(sizes["E"], sizes["valid"]))
    choices = {16: (4, 2, 1), 32: (2, 1), 64: (4, 2, 1)}[sizes["block_m"]]
    cost = {nt: cdiv(busy * cdiv(sizes["N"], 16 * nt), CUS) * nt for nt in choices}
    return next(nt for nt in choices if cost[nt] <= WIDE_SLACK * min(cost.values()))


TILE_KERNEL = "mxfp8_moe_gemm_m{}_n{}"          # each tile (block_m, 16 * NT columns) is a kernel


def variant_for(kernel: str, out_dtype: torch.dtype) -> str:
    """The variant of one of this source's kernels that writes `out_dtype`, chosen by its
    OUT_F16 define (the SwiGLU and decode-form kernels have the bf16 one only)."""
    return default_manifest().kernel(kernel).variant_with(OUT_F16=out_dtype == torch.float16).name


def launch_args(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, topk_weights,
                out, out_dtype, sizes: dict) -> tuple[str, str, dict]:
    """(kernel, variant, kernel arguments) of a validated call (`sizes` from validate)."""
    kernel = TILE_KERNEL.format(sizes["block_m"], 16 * choose_nt(sizes))
    variant = variant_for(kernel, out_dtype)
    has_w = topk_weights is not None
    tw = topk_weights.reshape(-1) if has_w else torch.empty(0, dtype=torch.float32, device=a.device)
    magic = magic_u32(a_div)
    return kernel, variant, dict(
        a=a, a_scale=_scales(a_scale), w=w, w_scale=_scales(w_scale),
        sorted_token_ids=sorted_token_ids.view(sizes["blocks"], sizes["block_m"]),
        expert_ids=expert_ids, num_tokens_post_padded=num_tokens_post_padded.reshape(1), topk_weights=tw, out=out,
        M=sizes["M"], N=sizes["N"], K=sizes["K"], E=sizes["E"], valid=sizes["valid"], blocks=sizes["blocks"],
        block_m=sizes["block_m"], a_div_magic=magic, has_weights=int(has_w))


def _scales(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == E8M0 else t.view(E8M0)


# ------------------------------------------------------------------ the op

def _check(call) -> dict:
    return validate(**call.values)


def _allocate(call, names: frozenset) -> dict:
    try:
        _check_a_div(call.a_div)                                    # before sizing an allocation by it
        return {"out": torch.empty((call.a.shape[0] * call.a_div, call.w.shape[1]), dtype=call.out_dtype,
                                   device=call.a.device)}
    except (AttributeError, IndexError, TypeError, RuntimeError, ValueError):
        validate(**call.values, out=None)        # names the first thing wrong (no output yet)
        raise


def _plan(sizes: dict, call) -> framework.Plan:
    if sizes["valid"] * sizes["N"] * sizes["K"] == 0:
        return framework.Plan()
    kernel, variant, args = launch_args(**call.values, sizes=sizes)
    # the kernel's pointer arguments are the call's tensors under their own names (the
    # launch reads only their addresses: uint8 scales and [T, top_k] weights need no view)
    return framework.Plan((prepare(default_manifest().kernel(kernel).variant(variant), args),))


_ALIGNED = dict(align=16)          # 16-byte loads of a and w
MXFP8_MOE_GEMM = framework.define(framework.Spec(
    OP,
    params=(framework.Param("a", "Tensor", **_ALIGNED), framework.Param("a_scale", "Tensor"),
            framework.Param("w", "Tensor", **_ALIGNED), framework.Param("w_scale", "Tensor"),
            framework.Param("sorted_token_ids", "Tensor"), framework.Param("expert_ids", "Tensor"),
            framework.Param("num_tokens_post_padded", "Tensor"), framework.Param("a_div", "SymInt"),
            framework.Param("topk_weights", "Tensor?"), framework.Param("out_dtype", "ScalarType")),
    outputs=(framework.Output("out"),),
    check=_check, allocate=_allocate, plan=_plan, out_after="topk_weights"))


def mxfp8_moe_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                   sorted_token_ids: torch.Tensor, expert_ids: torch.Tensor, num_tokens_post_padded: torch.Tensor,
                   *, a_div: int, topk_weights: torch.Tensor | None = None, out: torch.Tensor | None = None,
                   out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """out[t, n] = topk_weights[t] * (A'[t // a_div] . W'[expert(t), n]) per slot t (module
    docstring: layouts, what is skipped on the device, limits). Returns out [M * a_div, N]
    (bf16 or fp16); rows of slots no processed block names are left untouched. Runs
    torch.ops.gfxasm.mxfp8_moe_gemm (or mxfp8_moe_gemm_out when `out` is given)."""
    if torch.compiler.is_compiling():     # see mxfp8_gemm: Inductor and float8_e8m0fnu mutating ops
        a_scale, w_scale = (s.view(torch.uint8) if isinstance(s, torch.Tensor) and s.dtype == E8M0 else s
                            for s in (a_scale, w_scale))
    return MXFP8_MOE_GEMM(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div,
                          topk_weights, out_dtype, out=out)


# every (block_m, NT) choose_nt can pick
TILES = ((16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (64, 1), (64, 2), (64, 4))


def kernel_names() -> list[str]:
    """The manifest kernels of TILES."""
    return [TILE_KERNEL.format(bm, 16 * nt) for bm, nt in TILES]


# ------------------------------------------------------------------ the layer's fused gate_up step

SWIGLU_KERNEL = "mxfp8_moe_gemm_swiglu_m{}"


def swiglu_launch_args(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, q,
                       scale, alpha, beta, limit) -> tuple[str, str, dict]:
    """(kernel, variant, kernel arguments) of gate_up_swiglu, checked (shared with bench/moe.py)."""
    from .swiglu_quant import activation_args
    sizes = validate(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, None,
                     None, torch.bfloat16)
    I = sizes["N"] // 2
    if sizes["N"] % (2 * BLOCK):
        _fail(ValueError, f"'w' must be [E, 2I, K] with I % {BLOCK} == 0 for the fused SwiGLU, got shape "
                          f"{tuple(w.shape)}")
    _shape("q", q, (sizes["valid"], I), "[M * a_div, I]")
    _shape("scale", scale, (sizes["valid"], I // BLOCK), "[M * a_div, I/32]")
    if q.dtype != E4M3 or scale.dtype != E8M0:
        _fail(TypeError, f"'q', 'scale' must be float8_e4m3fn, float8_e8m0fnu, got {q.dtype}, {scale.dtype}")
    _, _, args = launch_args(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div,
                             None, None, torch.bfloat16, sizes)
    del args["out"]
    kernel = SWIGLU_KERNEL.format(sizes["block_m"])
    return kernel, variant_for(kernel, torch.bfloat16), dict(args, q=q, scale=scale,
                                                             **activation_args(alpha, beta, limit))


def swiglu_kernel_names() -> list[str]:
    """The manifest kernels of gate_up_swiglu, one per block_m."""
    return [SWIGLU_KERNEL.format(bm) for bm in BLOCK_MS]


def gate_up_swiglu(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div, q, scale,
                   alpha, beta, limit) -> None:
    """The MoE layer's private fused step (asm/mxfp8_moe_gemm.s SWIGLU): h = the gate_up
    product as mxfp8_moe_gemm(..., a_div=a_div) with w = [gate | up] rows [E, 2I, K], rounded to
    bf16, then q, scale = swiglu_mxfp8_quant(h, alpha, beta, limit) for the slots the routing
    processes, written into q [M * a_div, I] e4m3 and scale [M * a_div, I/32] E8M0; other rows
    untouched. No h in memory. Arguments as mxfp8_moe_gemm's (checked by its validate) and
    swiglu_mxfp8_quant's; I % 32 == 0; q and scale fresh, contiguous (the caller's). Checked and
    prepared on every call: the layer prepares this launch once per layout in its own plan."""
    kernel, variant, args = swiglu_launch_args(a, a_scale, w, w_scale, sorted_token_ids, expert_ids,
                                               num_tokens_post_padded, a_div, q, scale, alpha, beta, limit)
    launch(kernel, variant=variant, **args)


# ------------------------------------------------------------------ the layer's decode form (DIRECT)

DIRECT_SWIGLU_KERNEL = "mxfp8_moe_gemm_swiglu_direct"
DIRECT_SUM_KERNEL = "mxfp8_moe_gemm_direct_sum_n{}"
MAX_DIRECT_TOP_K = 16              # the sum form's slots are the rows of one 16-row MFMA tile


def direct_kernel_names() -> list[str]:
    """The manifest kernels of the layer's decode form (asm/mxfp8_moe_gemm.s DIRECT)."""
    return [DIRECT_SWIGLU_KERNEL] + [DIRECT_SUM_KERNEL.format(16 * nt) for nt in (1, 2, 4)]


def _direct_routing(topk_ids, expert_map, num_experts: int) -> dict:
    T, top_k = topk_ids.shape
    no_map = torch.empty(0, dtype=torch.int32, device=topk_ids.device)
    return dict(topk_ids=topk_ids.reshape(-1), expert_map=no_map if expert_map is None else expert_map,
                top_k=top_k, num_experts=num_experts, has_map=int(expert_map is not None), tokens=T)


def direct_swiglu_launch_args(a, a_scale, w, w_scale, topk_ids, expert_map, num_experts, q, scale, alpha, beta,
                              limit) -> tuple[str, str, dict]:
    """(kernel, variant, arguments) of the decode form's first launch: for every slot t of
    topk_ids [T, top_k] (global ids; expert_map as moe_align_block_size's), what gate_up_swiglu
    writes for it, with no routing arrays. Arguments checked by the layer (moe_layer.validate)."""
    from .swiglu_quant import activation_args
    M, K = a.shape
    E, N, _ = w.shape
    top_k = topk_ids.shape[1]
    magic = magic_u32(top_k)
    args = dict(a=a, a_scale=_scales(a_scale), w=w, w_scale=_scales(w_scale), topk_weights=torch.empty(
        0, dtype=torch.float32, device=a.device), q=q, scale=scale, M=M, N=N, K=K, E=E, valid=M * top_k,
        a_div_magic=magic, has_weights=0, **_direct_routing(topk_ids, expert_map, num_experts),
        **activation_args(alpha, beta, limit))
    return DIRECT_SWIGLU_KERNEL, variant_for(DIRECT_SWIGLU_KERNEL, torch.bfloat16), args


def choose_direct_nt(tokens: int, N: int) -> int:
    """16-column strips per workgroup of the sum form: choose_nt's rule with one busy block per
    token (checked against the timing model in bench/moe.py)."""
    cost = {nt: cdiv(tokens * cdiv(N, 16 * nt), CUS) * nt for nt in (4, 2, 1)}
    return next(nt for nt in (4, 2, 1) if cost[nt] <= WIDE_SLACK * min(cost.values()))


def direct_sum_launch_args(q, q_scale, w, w_scale, topk_ids, expert_map, num_experts, topk_weights, out,
                           nt: int | None = None) -> tuple[str, str, dict]:
    """(kernel, variant, arguments) of the decode form's second launch: out [T, N] bf16 =
    moe_sum of the down GEMM's weighted rows (mxfp8_moe_gemm(q, ..., a_div=1, topk_weights)
    over the slots of topk_ids), one workgroup per (token, 16*nt columns); top_k <= 16.
    Arguments checked by the layer."""
    S, K = q.shape
    E, N, _ = w.shape
    T, top_k = topk_ids.shape
    if top_k > MAX_DIRECT_TOP_K:
        _fail(ValueError, f"the sum form takes top_k <= {MAX_DIRECT_TOP_K}, got {top_k}")
    kernel = DIRECT_SUM_KERNEL.format(16 * (nt or choose_direct_nt(T, N)))
    args = dict(a=q, a_scale=_scales(q_scale), w=w, w_scale=_scales(w_scale), topk_weights=topk_weights.reshape(-1),
                out=out, M=S, N=N, K=K, E=E, valid=S, a_div_magic=0, has_weights=1,
                **_direct_routing(topk_ids, expert_map, num_experts))
    return kernel, variant_for(kernel, torch.bfloat16), args


def build_kernels(force: bool = False) -> None:
    """Assemble (incrementally) and check this op's kernels only."""
    from .. import build    # the toolchain is needed only here, not to import the op
    build.build_kernels(kernel_names() + swiglu_kernel_names() + direct_kernel_names(), force)


# ------------------------------------------------------------------ reference

def reference(a, a_scale, w, w_scale, sorted_token_ids, expert_ids, num_tokens_post_padded, a_div,
              topk_weights=None, absolute: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [M * a_div, N], written bool [M * a_div]): the exact product of the
    quantized operands for every slot a processed block names, following the routing
    rules of the module docstring; rows not written are 0 in `values`. absolute=True gives
    the same sums of |a'| |w'| |topk weight| (for error bounds)."""
    magnitude = torch.abs if absolute else (lambda x: x)
    M, K = a.shape
    E, N, _ = w.shape
    valid = M * a_div
    block_m = sorted_token_ids.numel() // expert_ids.numel()
    values = torch.zeros((valid, N), dtype=torch.float64)
    written = torch.zeros(valid, dtype=torch.bool)
    A = magnitude(dequantize(a, a_scale))
    used = min(int(num_tokens_post_padded.reshape(-1)[0]), sorted_token_ids.numel())
    for b in range(cdiv(used, block_m)):
        e = int(expert_ids[b])
        if not 0 <= e < E:
            continue
        slots = [int(t) for t in sorted_token_ids[b * block_m:(b + 1) * block_m] if 0 <= int(t) < valid]
        if not slots:
            continue
        rows = torch.tensor(slots)
        values[rows] = A[rows // a_div] @ magnitude(dequantize(w[e], w_scale[e])).T
        if topk_weights is not None:
            values[rows] *= magnitude(topk_weights.reshape(-1)[rows].double())[:, None]
        written[rows] = True
    return values, written


# ------------------------------------------------------------------ reference of the top-k sum

def sum_reference(y: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                  expert_map: torch.Tensor | None = None, num_local: int | None = None) -> torch.Tensor:
    """The top-k sum of moe_sum and of the DIRECT down GEMM, exactly: per token, the rows
    of the slots whose expert is in [0, num_experts) and whose local expert is in
    [0, num_local) (default num_experts) added in slot order in f32 (IEEE, as v_add_f32),
    rounded to bf16."""
    T, top_k = topk_ids.shape
    acc = torch.zeros(T, y.shape[1], dtype=torch.float32)
    rows = y.float().view(T, top_k, -1)
    for j in range(top_k):
        e = topk_ids[:, j].long()
        ok = (e >= 0) & (e < num_experts)
        local = e if expert_map is None else expert_map[e.clamp(0, num_experts - 1)].long()
        ok &= (local >= 0) & (local < (num_experts if num_local is None else num_local))
        acc = torch.where(ok[:, None], acc + rows[:, j], acc)
    return acc.to(torch.bfloat16)

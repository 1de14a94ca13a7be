"""The MX-FP8 mixture-of-experts layer: `gfxasm.mxfp8_moe`, one, two or six launches and no host sync.

    out = gfxasm.mxfp8_moe(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids)

x [T, H] float8_e4m3fn with x_scale [T, H/32] E8M0 (the quantised hidden states); w1 [E, 2I, H]
(gate rows 0..I-1, up rows I..2I-1 of each expert) and w2 [E, H, I], e4m3, with E8M0 scales
[E, 2I, H/32] and [E, H, I/32]; topk_weights [T, top_k] float32, topk_ids [T, top_k] int32
(global expert ids). out [T, H] bf16:

    out[t] = sum over j of topk_weights[t, j] * W2'[e] @ requant(SwiGLU-OAI(bf16(W1'[e] @ x'[t])))
             with e = local id of topk_ids[t, j]

Three forms, chosen by choose_form (the same result up to the order of f32 additions inside
the down GEMM's per-slot sums: bit-equal when cdiv(I, 128) % 4 == 0; the decode form's one
and two launches are bit-equal always).

The sorted form (block_m given, top_k > 16, or more than DIRECT_MAX_TOKENS tokens): launches,
in order (each its own kernel; intermediates allocated per call):
  1. gfxasm.moe_align_block_size(topk_ids, block_m, E_global, expert_map, pad_sorted_ids=True,
     ignore_invalid_experts=True): absent experts' slots are left out (asm/moe_align.s, three
     launches)
  2. the gate_up GEMM fused with the activation (mxfp8_moe_gemm.gate_up_swiglu, the SWIGLU
     variant of asm/mxfp8_moe_gemm.s): h = gfxasm.mxfp8_moe_gemm(x, ..., w1, ..., a_div=top_k)
     rounded to bf16, then gfxasm.swiglu_mxfp8_quant(h, alpha, beta, limit), bit for bit,
     without h leaving the workgroup -> q [T*top_k, I] e4m3, s [T*top_k, I/32]
  3. gfxasm.mxfp8_moe_gemm(q, s, w2, ..., a_div=1, topk_weights) -> y [T*top_k, H] bf16 (weighted)
  4. moe_sum (asm/moe_sum.s): out[t] = bf16(sum over j in order, f32, of y[t*top_k + j]),
     skipping slots whose expert is outside [0, E_global) or whose local expert is outside
     [0, E) (expert_map -1: absent), as the GEMMs skip them.
The decode form (block_m None, top_k <= 16, T <= DIRECT_MAX_TOKENS): two launches, no routing
arrays (asm/mxfp8_moe_gemm.s DIRECT):
  1. mxfp8_moe_gemm.direct_swiglu_launch_args: step 2 with one workgroup per slot, its expert
     read from topk_ids (and expert_map) on the device -> q, s as step 2 writes them;
  2. mxfp8_moe_gemm.direct_sum_launch_args: steps 3 and 4 in one launch, one workgroup per
     (token, 16..64 columns): its top_k slots are the rows of one MFMA tile, each streaming its
     own expert's weights, then bf16(topk weight * row) summed over the slots in order in f32
     (moe_sum's arithmetic) and rounded to bf16 into out. No atomics: each out element has one
     writer, and the order of every addition is fixed.
  An expert routed to by several slots has its weights read once per slot (the sorted form
  reads them once per block), so the form pays off only while few slots share an expert.
The decode form in one launch (T <= FUSED_MAX_TOKENS; asm/mxfp8_moe_gemm.s FUSED, kernels.yaml
mxfp8_moe_gemm_fused_direct, declared `schedule: concurrent`): both launches' workgroups in one
grid, the gate_up ones first (the producers); each down-and-sum workgroup (32 columns) issues
its first weight loads, then waits on a grid-wide counter that every producer bumps with an
agent-scope release once its q and scale are stored, and acquires before reading them. The
counter is one uint32 the plan allocates zeroed per call (on a GPU torch.zeros queues a fill
on the stream before the launch; the kernel never resets it). Safe on hardware whatever the
resident capacity: a producer never waits and the producers have the lowest workgroup ids, so
the dispatcher places every producer before any waiting workgroup can hold a slot. The
emulator runs it under its concurrent schedule (gfxasm.emu.concurrent), which is much slower
per instruction than the serial one.
The requantisation of step 2 is the layer's only approximation beyond roundings: h is
rounded to bf16, the activation is quantised to MX-FP8 (the down GEMM's input format), y
rows are rounded to bf16 before the sum. Slots no GEMM processes (absent or out-of-range
experts) leave their q, s and y rows unwritten, and nothing reads them.

block_m (None: chosen; given: the sorted form): the sorted form's row block, 16, 32 or 64.
An expert with more slots than block_m takes several blocks and its weights are re-read for
each, while a bigger block wastes MFMA rows on padding. The expected slots per expert is
T*top_k/E; the choice is the smallest block_m >= twice that (16 up to 8 expected slots, 32
up to 16, else 64), so decode (T*top_k around E or below) uses 16 and prefill 64: at the
issue's shape (E 129, top-5) T = 256 takes 32 (10 expected slots), T >= 413 takes 64.
Prefill tiles: at block_m 64 the down GEMM takes mxfp8_moe_gemm.choose_nt's widest tile, 64
columns (m64_n64: 16 MFMA tiles per wave, the most the VGPRs hold beside the K loop's two
register sets), and the gate_up GEMM its one tile (64 rows x 32 gate + 32 up columns).
Modelled (bench/moe.py, the gfxasm.perf MI355X model; FLOPs 2*T*top_k*3*H*I): T = 4,096 in
1,003 us, 578 TFLOP/s, 11.6% of the 5.0 PFLOP/s FP8 peak (the 16-column down tile took
1,480 us); block_m 64 at T = 256 models slower than 32 (down 174 against 158 us). What
limits it (the model): each wave loads its own 4 activation and 4 weight strips per 128-K
step, 1 KiB of L2 traffic per MFMA, against the fitted L2-to-CU rate (26 B/clk per CU), so
the MFMA pipes are ~14% busy; sharing the block's operands between the waves through LDS is
the next step, not built.

Expert parallelism: expert_map [E_global] int32 maps a global id to this rank's expert (an
index into w1/w2) or -1; topk_ids hold global ids. Slots of absent experts contribute
nothing to out (another rank adds them). An id outside [0, E_global) is skipped in every
step.

Limits: those of the four ops (each checks its own arguments and names them; the decode form
runs on arguments that pass the sorted form's checks), plus: H and I
multiples of 32, x [T, H], w1 [E, 2I, H], w2 [E, H, I] with matching E, H and I, topk_weights
and topk_ids [T, top_k] (top_k <= 64), out bf16 [T, H] not overlapping an input. T = 0
launches nothing. T*top_k*max(H, 2I)*2 < 2^31 bytes (MAX_ROW_BYTES: y [T*top_k, H] bf16 and
the gate_up GEMM's bound are addressed with 32-bit offsets; at the issue's shape, H 6144 and
top-5, up to 34,952 tokens; refused by name before any launch) and T*top_k < 2^24 (moe_align,
the GEMMs' slot ids).

torch ops (declared on loader/ops/framework.py): gfxasm::mxfp8_moe(...) -> out and
gfxasm::mxfp8_moe_out(..., out!), fake kernels. Each form's launches are prepared once per
tensor layout and scalars (one plan, cached by the framework): a repeated call allocates the
intermediates, checks pointers and launches.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..gridexpr import cdiv, magic_u32
from ..launcher import PreparedLaunch, prepare
from ..manifest import default_manifest
from . import arguments, framework, moe_align, mxfp8_moe_gemm, swiglu_quant
from .mxfp8_gemm import BLOCK, E4M3, E8M0
from .mxfp8_moe_gemm import BLOCK_MS, MAX_A_DIV

OP = "mxfp8_moe"
# The decode form up to here. It reads an expert's weights once per slot routed to it, the
# sorted form once per block: at the shape (129 experts, top-5) 40 slots touch ~36
# experts at T = 8 (+11% weight bytes) but ~59 at T = 16 (+36%). bench/moe.py (modelled): the
# decode form is faster at T = 1, 4, 8; at T = 16 the sorted form's model brackets it.
DIRECT_MAX_TOKENS = 8
# The decode form in one launch (asm/mxfp8_moe_gemm.s FUSED) up to here, two launches above.
# bench/moe.py --one-launch (modelled, the shape, its phases timed by the model): T = 1
# in 20.69 us at the ASSUMED 1.5 us flag latency (19.69 at 0.5 us, 23.19 at 4 us) against 21.58
# for the two launches: it pays across the bracket but its slow end. T = 4 / 8: 60.03 / 114.37
# us (60.08 / 114.37 at 4 us) against 58.74 / 110.70 in two launches: their 1,248 / 2,496
# workgroups wait for slots (512 resident), not for the flag, and 32-column down workgroups
# are twice as many as 64-column ones (59.00 / 114.78 us with those, before the producers'
# release lost a round trip). So one launch at T = 1 only.
FUSED_MAX_TOKENS = 1
FUSED_KERNEL = "mxfp8_moe_gemm_fused_direct"
FUSED_NT = 2                       # its down role's 32 columns per workgroup (asm/mxfp8_moe_gemm.s SUM_STRIPS)
# The per-slot intermediates (y [T*top_k, H] bf16, and the gate_up GEMM's checks of its
# [T*top_k, 2I] product) are addressed with 32-bit buffer offsets (module docstring: Limits).
MAX_ROW_BYTES = 2**31


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def choose_form(T: int, top_k: int, block_m: int | None) -> str:
    """'fused' (the decode form in one launch), 'direct' (in two) or 'sorted' (module docstring)."""
    direct = block_m is None and top_k <= mxfp8_moe_gemm.MAX_DIRECT_TOP_K and T <= DIRECT_MAX_TOKENS
    if not direct:
        return "sorted"
    return "fused" if T <= FUSED_MAX_TOKENS else "direct"


def choose_block_m(T: int, top_k: int, E: int) -> int:
    """The smallest of 16/32/64 at least twice the expected slots per expert (module docstring)."""
    expected = T * top_k / max(E, 1)
    return next((bm for bm in BLOCK_MS if bm >= 2 * expected), BLOCK_MS[-1])


def validate(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, expert_map, alpha, beta, limit, block_m,
             out=None) -> dict:
    """Everything metadata tells, the steps' checks included (the fake kernels run this); the sizes."""
    named = (("x", x, "[T, H] e4m3"), ("w1", w1, "[E, 2I, H] e4m3"), ("w2", w2, "[E, H, I] e4m3"),
             ("topk_weights", topk_weights, "[T, top_k] float32"), ("topk_ids", topk_ids, "[T, top_k] int32"))
    for name, t, what in named:
        arguments.tensor(OP, name, t, what=what)
    for name, t in (("x", x), ("w1", w1), ("w2", w2)):
        if t.dtype != E4M3:
            _fail(TypeError, f"'{name}' dtype must be torch.float8_e4m3fn, got {t.dtype}")
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        _fail(ValueError, f"x [T, H], w1 [E, 2I, H] and w2 [E, H, I] expected, got shapes {tuple(x.shape)}, "
                          f"{tuple(w1.shape)}, {tuple(w2.shape)}")
    T, H = x.shape
    E, I2, H1 = w1.shape
    if H % BLOCK or H1 != H:
        _fail(ValueError, f"'w1' must be [E, 2I, H] with H = {H} (x's, a multiple of {BLOCK}), got shape "
                          f"{tuple(w1.shape)}")
    if I2 % (2 * BLOCK) or tuple(w2.shape) != (E, H, I2 // 2):
        _fail(ValueError, f"'w2' must be [E, H, I] = [{E}, {H}, {I2 // 2}] (w1 is [E, 2I, H] with I % {BLOCK} == "
                          f"0), got shape {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T or not 1 <= topk_ids.shape[1] <= MAX_A_DIV:
        _fail(ValueError, f"'topk_ids' must be [T, top_k] with T = {T} and 1 <= top_k <= {MAX_A_DIV}, got shape "
                          f"{tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        _fail(ValueError, f"'topk_weights' must be [T, top_k] = {list(topk_ids.shape)}, got shape "
                          f"{tuple(topk_weights.shape)}")
    if block_m is not None and block_m not in BLOCK_MS:
        _fail(ValueError, f"'block_m' must be one of {BLOCK_MS} or None, got {block_m!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(TypeError, f"'out' must be a torch.Tensor or None, got {type(out).__name__}")
        if out.dtype != torch.bfloat16 or tuple(out.shape) != (T, H):
            _fail(ValueError, f"'out' must be bf16 [T, H] = [{T}, {H}], got {out.dtype} {tuple(out.shape)}")
        if out.numel() and not out.is_contiguous():
            _fail(ValueError, f"'out' must be contiguous, got strides {out.stride()}")
    E_global = expert_map.numel() if isinstance(expert_map, torch.Tensor) else E
    top_k = int(topk_ids.shape[1])             # specialised under dynamic shapes: it sizes the GEMMs
    row_bytes = 2 * max(H, I2)                 # bf16 y [T*top_k, H]; the gate_up GEMM's [T*top_k, 2I] bound
    if T * top_k * row_bytes >= MAX_ROW_BYTES:
        _fail(ValueError, f"T * top_k = {T * top_k} slots of {row_bytes} bytes (bf16 rows of max(H, 2I) = "
                          f"{max(H, I2)}) is {T * top_k * row_bytes} bytes; the GEMMs and moe_sum address the "
                          f"per-slot intermediates with 32-bit offsets, below 2^31 bytes: at most "
                          f"{(MAX_ROW_BYTES - 1) // (row_bytes * top_k)} tokens at top_k = {top_k}")
    sizes = dict(T=T, H=H, I=I2 // 2, E=E, E_global=E_global, top_k=top_k,
                 block_m=block_m or choose_block_m(T, top_k, E_global), form=choose_form(T, top_k, block_m))
    _validate_steps(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, expert_map, alpha, beta, limit,
                    sizes)
    return sizes


def _validate_steps(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, expert_map, alpha, beta, limit,
                    sizes) -> None:
    """Every step's own checks, on stand-ins of the intermediates, before the first launch."""
    moe_align.validate(topk_ids, sizes["block_m"], sizes["E_global"], expert_map, True, True)
    swiglu_quant.validate(torch.empty((0, 2 * sizes["I"]), dtype=torch.bfloat16, device=x.device), alpha, beta, limit)
    if sizes["T"] == 0:
        return
    t = _intermediates(sizes, torch.device("meta"), "sorted")        # metadata is all the checks read
    routing = (t["sorted_token_ids"], t["expert_ids"], t["num_tokens_post_padded"])
    mxfp8_moe_gemm.validate(x, x_scale, w1, w1_scale, *routing, sizes["top_k"], None, None, torch.bfloat16)
    mxfp8_moe_gemm.validate(t["q"], t["scale"], w2, w2_scale, *routing, 1, topk_weights, None, torch.bfloat16)


FLAG = "flag"          # the fused form's counter: zero at launch (on a GPU torch.zeros queues the fill first)


def _intermediate_layouts(sizes: dict, form: str) -> dict:
    """The tensors between the steps, (shape, dtype) by the names the plan's launches take
    them under: q and scale (the down GEMM's activations); for the sorted form the routing
    arrays, moe_align's workspace and y (the weighted rows); for the fused form the counter
    `flag` (FLAG: made zero)."""
    S, I = sizes["T"] * sizes["top_k"], sizes["I"]
    made = dict(q=((S, I), E4M3), scale=((S, I // BLOCK), E8M0))
    if form == "fused":
        made[FLAG] = ((1,), torch.uint32)
    if form == "sorted":
        padded, blocks = moe_align.sizes(S, sizes["block_m"], sizes["E_global"], True)
        made.update(counts=((moe_align.workspace_numel(S, sizes["E_global"]),), torch.int32),
                    sorted_token_ids=((padded,), torch.int32), expert_ids=((blocks,), torch.int32),
                    num_tokens_post_padded=((1,), torch.int32), y=((S, sizes["H"]), torch.bfloat16))
    return made


def _intermediates(sizes: dict, device: torch.device, form: str) -> dict:
    """Stand-ins of the tensors between the steps (`_intermediate_layouts`), for the checks
    and the plan's launches, which read their layouts only: a call's own come from the
    plan's scratch (the flag zeroed there)."""
    return {name: torch.empty(shape, dtype=dtype, device=device)
            for name, (shape, dtype) in _intermediate_layouts(sizes, form).items()}


def sum_launch_args(y, topk_ids, expert_map, out, sizes) -> dict:
    """moe_sum's kernel arguments (shared with bench/moe.py)."""
    no_map = torch.empty(0, dtype=torch.int32, device=y.device)
    return dict(y=y, topk_ids=topk_ids.reshape(-1), expert_map=no_map if expert_map is None else expert_map, out=out,
                T=sizes["T"], H=sizes["H"], top_k=sizes["top_k"], num_experts=sizes["E_global"],
                has_map=int(expert_map is not None), num_local=sizes["E"])


# Both GEMMs' kernels call their operands a, a_scale, w, w_scale (and the sorted form's down
# GEMM its output out): in the layer's plan, whose launches take their tensors from one
# namespace, those are the layer's tensors and intermediates. (The gate_up kernels' topk_weights
# is the layer's too, though they do not read it: has_weights 0.)
_GATE_UP = dict(a="x", a_scale="x_scale", w="w1", w_scale="w1_scale")
_DOWN = dict(a="q", a_scale="scale", w="w2", w_scale="w2_scale")


def _prepared(kernel: str, variant: str | None, args: dict, **names: str) -> PreparedLaunch:
    """The launch of `kernel` on `args`, taking its pointer arguments under `names` (kernel
    argument -> the plan's name) where the layer's names differ from the kernel's."""
    launch = prepare(default_manifest().kernel(kernel).variant(variant), args)
    return replace(launch, pointers=tuple((names.get(name, name), offset, untouched)
                                          for name, offset, untouched in launch.pointers))


def _sorted_launches(sizes: dict, call, t: dict) -> tuple[PreparedLaunch, ...]:
    """moe_align, the fused gate_up, the down GEMM, moe_sum (module docstring)."""
    routing = (t["sorted_token_ids"], t["expert_ids"], t["num_tokens_post_padded"])
    down = (t["q"], t["scale"], call.w2, call.w2_scale, *routing, 1, call.topk_weights, t["y"], torch.bfloat16)
    return (
        *moe_align.prepared(moe_align.launch_args(call.topk_ids, sizes["block_m"], sizes["E_global"], call.expert_map,
                                                  True, routing, t["counts"])),
        _prepared(*mxfp8_moe_gemm.swiglu_launch_args(call.x, call.x_scale, call.w1, call.w1_scale, *routing,
                                                     sizes["top_k"], t["q"], t["scale"], call.alpha, call.beta,
                                                     call.limit), **_GATE_UP),
        _prepared(*mxfp8_moe_gemm.launch_args(*down, mxfp8_moe_gemm.validate(*down)), **_DOWN, out="y"),
        _prepared("moe_sum", None, sum_launch_args(t["y"], call.topk_ids, call.expert_map, call.out, sizes)))


def _direct_launches(sizes: dict, call, t: dict) -> tuple[PreparedLaunch, ...]:
    """The decode form's gate_up and down-and-sum (module docstring)."""
    return (
        _prepared(*mxfp8_moe_gemm.direct_swiglu_launch_args(call.x, call.x_scale, call.w1, call.w1_scale, call.topk_ids,
                                                            call.expert_map, sizes["E_global"], t["q"], t["scale"],
                                                            call.alpha, call.beta, call.limit), **_GATE_UP),
        _prepared(*mxfp8_moe_gemm.direct_sum_launch_args(t["q"], t["scale"], call.w2, call.w2_scale, call.topk_ids,
                                                         call.expert_map, sizes["E_global"], call.topk_weights,
                                                         call.out), **_DOWN))


def fused_launch_args(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, expert_map, num_experts, q,
                      scale, flag, out, alpha, beta, limit) -> tuple[str, str, dict]:
    """(kernel, variant, arguments) of the decode form in one launch (asm/mxfp8_moe_gemm.s
    FUSED): the first launch's arguments, the second's (32 columns per workgroup) as the d_*
    block, the counter `flag` (0 at launch) and the grid's split into the two roles."""
    _, _, up = mxfp8_moe_gemm.direct_swiglu_launch_args(x, x_scale, w1, w1_scale, topk_ids, expert_map, num_experts,
                                                        q, scale, alpha, beta, limit)
    _, _, down = mxfp8_moe_gemm.direct_sum_launch_args(q, scale, w2, w2_scale, topk_ids, expert_map, num_experts,
                                                       topk_weights, out, nt=FUSED_NT)
    up_tiles, down_tiles = up["N"] // (2 * BLOCK), cdiv(down["N"], 16 * FUSED_NT)
    producers = up_tiles * up["valid"]
    check_id_division(up_tiles, producers)
    check_id_division(down_tiles, down_tiles * down["tokens"])
    args = dict(up, **{f"d_{name}": value for name, value in down.items() if name != "out"}, out=down["out"],
                flag=flag, producers=producers, up_tiles=up_tiles, up_magic=magic_u32(up_tiles), down_tiles=down_tiles,
                down_magic=magic_u32(down_tiles))
    return FUSED_KERNEL, mxfp8_moe_gemm.variant_for(FUSED_KERNEL, torch.bfloat16), args


def check_id_division(tiles: int, ids: int) -> None:
    """The kernel divides workgroup ids below `ids` by `tiles` with a magic multiply
    (ceil(2^32 / tiles)), exact while (ids - 1) * tiles < 2^32."""
    if (ids - 1) * tiles >= 2**32:
        _fail(ValueError, f"the one-launch form divides workgroup ids < {ids} by {tiles} tiles exactly only while "
                          f"(ids - 1) * tiles < 2^32")


# The one-launch form's pointer arguments under the plan's names (the d_* block is the down
# GEMM's: its a is q, the first role's output)
_FUSED = dict(_GATE_UP, d_a="q", d_a_scale="scale", d_w="w2", d_w_scale="w2_scale", d_topk_ids="topk_ids",
              d_expert_map="expert_map", d_topk_weights="topk_weights")


def _fused_launches(sizes: dict, call, t: dict) -> tuple[PreparedLaunch, ...]:
    """The decode form in one launch (module docstring)."""
    return (_prepared(*fused_launch_args(call.x, call.x_scale, call.w1, call.w1_scale, call.w2, call.w2_scale,
                                         call.topk_weights, call.topk_ids, call.expert_map, sizes["E_global"],
                                         t["q"], t["scale"], t["flag"], call.out, call.alpha, call.beta, call.limit),
                      **_FUSED),)


_LAUNCHES = dict(sorted=_sorted_launches, direct=_direct_launches, fused=_fused_launches)


def _plan(sizes: dict, call) -> framework.Plan:
    """sizes['form']'s launches, prepared on stand-ins of the intermediates; each call gets
    fresh ones (the plan's scratch: concurrent calls of a layout must not share them)."""
    if sizes["T"] == 0:
        return framework.Plan()
    form = sizes["form"]
    launches = _LAUNCHES[form](sizes, call, _intermediates(sizes, call.x.device, form))
    scratch = _intermediate_layouts(sizes, form)
    return framework.Plan(launches, scratch=scratch, zeroed=frozenset({FLAG} & scratch.keys()))


def _check(call) -> dict:
    return validate(**call.values)


def _allocate(call, names: frozenset) -> dict:
    x = call.tensor("x", what="[T, H] e4m3")
    return {"out": torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)}


_ALIGNED = dict(align=16)          # both forms load x, w1 and w2 16 bytes at a time
MXFP8_MOE = framework.define(framework.Spec(
    OP,
    params=(framework.Param("x", "Tensor", **_ALIGNED), framework.Param("x_scale", "Tensor"),
            framework.Param("w1", "Tensor", **_ALIGNED), framework.Param("w1_scale", "Tensor"),
            framework.Param("w2", "Tensor", **_ALIGNED), framework.Param("w2_scale", "Tensor"),
            framework.Param("topk_weights", "Tensor"), framework.Param("topk_ids", "Tensor"),
            framework.Param("expert_map", "Tensor?"), framework.Param("alpha", "float"),
            framework.Param("beta", "float"), framework.Param("limit", "float"),
            framework.Param("block_m", "SymInt?")),
    outputs=(framework.Output("out"),),
    check=_check, allocate=_allocate, plan=_plan))


def mxfp8_moe(x: torch.Tensor, x_scale: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w2: torch.Tensor,
              w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              expert_map: torch.Tensor | None = None, alpha: float = 1.702, beta: float = 1.0, limit: float = 7.0,
              block_m: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The MX-FP8 MoE layer (module docstring): out [T, H] bf16 = sum over top_k of the routed
    experts' SwiGLU-OAI MLPs, weighted by topk_weights. Runs torch.ops.gfxasm.mxfp8_moe (or
    mxfp8_moe_out when `out` is given)."""
    return MXFP8_MOE(x, x_scale, w1, w1_scale, w2, w2_scale, topk_weights, topk_ids, expert_map, alpha, beta, limit,
                     block_m, out=out)


def kernel_names() -> list[str]:
    """This layer's own kernels (the GEMMs' are mxfp8_moe_gemm.build_kernels()'s; the one-launch
    form's, from the same source, is the layer's)."""
    return [*moe_align.KERNELS, "moe_sum", FUSED_KERNEL]

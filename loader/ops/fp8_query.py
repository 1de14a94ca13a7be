"""bf16 queries over an FP8 e4m3 KV cache for `gfxasm.batch_prefill` (vLLM's FP8 KV-cache
deployment: a bf16 model, an FP8 cache): Q is quantised to e4m3 on the device with one
per-tensor scale found on the device (no host sync), then the FP8 kernel runs with that
q_descale. The pre-pass is the op gfxasm::quant_q_fp8 on asm/quant_q_fp8.s:

    q8, q_descale = QUANT_Q_FP8(q)          # q bf16 [total_q, Hq, 128], any 16-byte strides

    amax      = max |q| over its finite elements (0 when there is none)
    q_descale = 2^(floor(log2 amax) - 7), at least 2^-62 (float32 [1])
    q8        = e4m3(q / q_descale), round to nearest even; |q / q_descale| < 2^8 <= 448, so
                nothing saturates; an element that is +-Inf or NaN becomes the e4m3 NaN
    q8 is contiguous float8_e4m3fn of q's shape.

Two launches: quant_q_fp8_amax (each workgroup's max into a workspace of at most 256
partial maxima, grid-stride) and quant_q_fp8 (every wave reduces the partials itself, then
quantises 4 chunks of 8 elements per work-item). Integer maxima only: bit-identical on
every run.

Why a power of two: q / q_descale is then exact and the conversion rounds once
(v_cvt_scalef32_pk_fp8_f32 divides by its scale operand's power of two), so the result is
reproducible bit for bit by `reference`. The price is range, not precision: amax lands in
[128, 256) instead of at 448, so elements below amax 2^-14 (instead of amax 2^-14.8) are
e4m3 subnormals. Error: e4m3 keeps 3 mantissa bits, so a normal element moves by at most
half an ulp, 2^-4 of its magnitude, and a subnormal one by at most 2^-10 q_descale
(`query_error`); scores and O inherit that (tests/test_prefill_fp8_query.py derives the bound).

Non-finite queries: amax skips them, and they become NaN in q8, so a row whose query holds
NaN or +-Inf gets NaN in O and LSE while every other row is unaffected (the bf16 kernel
gives NaN for a NaN query as well; for an infinite one it gives NaN wherever an infinite
score meets another infinite or a NaN one, which is every row with keys of mixed signs).

Routing (`with_quantized_query`, called by `gfxasm.batch_prefill` for q not FP8 over an
FP8 cache): bf16 q only, and O comes out bf16 (Q's dtype). fp16 q over an FP8 cache is
refused: the FP8 kernel writes bf16 O, and fp16 out would need another pass over O. q_descale
must not be given (the pre-pass computes it); k_descale/v_descale (per tensor, default 1)
or kv_block_descale as for FP8 q; softcap is refused (the FP8 kernel has none). Every
metadata check of batch_prefill (dtypes, shapes, strides, tables, window, sinks, out) runs
before the pre-pass launches; checks of tensor contents (tables, descale ranges) run in the
attention call, after the pre-pass (which writes only its own fresh outputs). The magnitude
limit: q_descale <= 2^62, i.e. the largest finite |q| below 2^70; checked where q_descale
is readable (a CPU tensor), not on a GPU (that would synchronise).
"""
from __future__ import annotations

import math

import torch

from ..gridexpr import cdiv, magic_u32
from ..launcher import prepare
from ..manifest import default_manifest
from . import arguments, framework

OP = "quant_q_fp8"
KERNELS = ("quant_q_fp8_amax", "quant_q_fp8")   # in launch order
E4M3 = torch.float8_e4m3fn
HEAD_DIM = 128
CHUNK = 8                          # elements per work-item load (16 bytes)
ROW_CHUNKS = HEAD_DIM // CHUNK
UNROLL = 4                         # quant_q_fp8: chunks per work-item (asm/quant_q_fp8.s)
AMAX_UNROLL = 8                    # quant_q_fp8_amax: chunks per work-item per trip
WORKGROUP = 256                    # quant_q_fp8's work-items per workgroup
AMAX_WORKGROUP = 256               # quant_q_fp8_amax's
MAX_PARTS = 256                    # quant_q_fp8's waves reduce the partials with one dwordx4 per lane
MANTISSA_HEADROOM = 7              # q_descale = 2^(floor(log2 amax) - 7): amax / q_descale in [128, 256)
DESCALE_LOG2_RANGE = (-62, 62)     # batch_prefill's per-tensor descale range
_U32 = 2**32
_MAX_SPAN = 2**31


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def validate(q, out=None) -> None:
    """q bf16 [total_q, Hq, 128], head dim contiguous, 16-byte strides below 2^31 bytes of
    span; the kernel's row division exact (rows * Hq <= 2^32); `out` = (q8, q_descale)."""
    arguments.tensor(OP, "q", q, 3, f"bf16 [total_q, heads_q, {HEAD_DIM}]")
    if q.dtype != torch.bfloat16:
        _fail(TypeError, f"'q' dtype must be torch.bfloat16, got {q.dtype}")
    if q.shape[2] != HEAD_DIM:
        _fail(ValueError, f"'q' head dim must be {HEAD_DIM}, got {q.shape[2]} (shape {tuple(q.shape)})")
    if q.numel():
        if q.stride(2) != 1:
            _fail(ValueError, f"'q' must be contiguous in the head dim (stride 1), got strides {q.stride()}")
        for axis in (0, 1):
            stride = q.stride(axis) * 2 if q.shape[axis] > 1 else 0
            if stride % 16:
                _fail(ValueError, f"'q' stride of dim {axis} must be a multiple of 16 bytes, got {stride} bytes")
        if span_bytes(q) >= _MAX_SPAN:
            _fail(ValueError, f"'q' spans {span_bytes(q)} bytes; the kernels need below 2^31")
        if q.shape[0] * q.shape[1] ** 2 > _U32:
            _fail(ValueError, f"total_q * heads_q^2 = {q.shape[0] * q.shape[1] ** 2} must be at most 2^32 (the "
                              f"kernels' row division)")
    if out is not None:
        for name, t, shape, dtype in (("q8", out[0], tuple(q.shape), E4M3), ("q_descale", out[1], (1,), torch.float32)):
            if not isinstance(t, torch.Tensor):
                _fail(TypeError, f"'{name}' (out) must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
                _fail(ValueError, f"'{name}' (out) must be a contiguous {dtype} {list(shape)}, got {t.dtype} shape "
                                  f"{tuple(t.shape)} strides {t.stride()}")


def span_bytes(q: torch.Tensor) -> int:
    """Bytes from q's first element to the end of its last row."""
    return (q.shape[0] - 1) * q.stride(0) * 2 + (q.shape[1] - 1) * q.stride(1) * 2 + HEAD_DIM * 2


def partition(chunks: int) -> tuple[int, int]:
    """(parts, trips) of the amax launch: workgroups, one per AMAX_WORKGROUP chunks up to
    MAX_PARTS (a small q then spreads over many CUs: the model put 8 chunks per work-item at
    1k x 6 heads 1.5 us slower), and grid-stride trips of AMAX_UNROLL chunks per work-item."""
    parts = min(MAX_PARTS, cdiv(chunks, AMAX_WORKGROUP))
    return parts, cdiv(chunks, AMAX_UNROLL * AMAX_WORKGROUP * parts)


def launch_args(q: torch.Tensor, q8: torch.Tensor, q_descale: torch.Tensor, partial: torch.Tensor) -> dict:
    """Both kernels' arguments (they take the same) for a validated non-empty q."""
    heads = q.shape[1]
    chunks = q.shape[0] * heads * ROW_CHUNKS
    parts, trips = partition(chunks)
    return dict(q=q, partial=partial, q8=q8, q_descale=q_descale, chunks=chunks, parts=parts, trips=trips,
                heads_q=heads, q_seq_stride=q.stride(0) * 2, q_head_stride=q.stride(1) * 2,
                head_magic=magic_u32(heads), q_bytes=span_bytes(q))


def workspace(chunks: int, device) -> torch.Tensor:
    """The partial maxima the two launches share (one per call)."""
    return torch.empty(partition(chunks)[0], dtype=torch.int32, device=device).view(torch.uint32)


def _check(call) -> None:
    validate(call.q, None if call.q8 is None else (call.q8, call.q_descale))


def _allocate(call, names: frozenset) -> dict:
    validate(call.q)
    q = call.q
    return dict(q8=torch.empty(q.shape, dtype=E4M3, device=q.device),
                q_descale=torch.empty(1, dtype=torch.float32, device=q.device))


def _unit_descale(call) -> None:
    call.q_descale.fill_(1.0)       # no element: any descale is exact; 1 is in batch_prefill's range


def _plan(_checked, call) -> framework.Plan:
    q = call.q
    if not q.numel():
        return framework.Plan(empty=_unit_descale)
    chunks = q.shape[0] * q.shape[1] * ROW_CHUNKS
    manifest = default_manifest()
    args = launch_args(q, call.q8, call.q_descale, workspace(chunks, q.device))
    launches = tuple(prepare(manifest.kernel(name).variant(None), args) for name in KERNELS)
    # the partial maxima per call: concurrent calls of one layout must not share them
    return framework.Plan(launches, scratch=dict(partial=((partition(chunks)[0],), torch.uint32)))


QUANT_Q_FP8 = framework.define(framework.Spec(
    OP, params=(framework.Param("q", "Tensor", align=16),),                                # 16-byte loads
    outputs=(framework.Output("q8", align=16), framework.Output("q_descale", align=4)),
    check=_check, allocate=_allocate, plan=_plan))


# ------------------------------------------------------------------ batch_prefill's routing

def quantizes(q, k_cache) -> bool:
    """Whether a batch_prefill call has non-FP8 queries over an FP8 cache (this module's path)."""
    return (isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor) and q.dtype != E4M3
            and k_cache.dtype == E4M3)


def with_quantized_query(op: framework.Op, args: tuple, out) -> tuple:
    """batch_prefill's positional arguments (in the parameter order of `op`, its declared op)
    with q replaced by its e4m3 form and q_descale by the pre-pass's; refuses what this path
    cannot serve and runs the op's check on the call's metadata (once per layout:
    `Op.check_metadata`) before the pre-pass launches (module docstring). batch_prefill
    passes its op: this module does not import it (batch_prefill imports this one)."""
    names = tuple(p.name for p in op.spec.params)
    values = dict(zip(names, args))
    q = values["q"]
    fail = lambda kind, message: arguments.fail(op.name, kind, message)   # noqa: E731
    if q.dtype != torch.bfloat16:
        fail(TypeError, f"'q' dtype must be torch.bfloat16 (or torch.float8_e4m3fn) over a float8_e4m3fn cache, got "
                        f"{q.dtype}: the FP8 kernel writes bf16 O")
    if values["q_descale"] is not None:
        fail(ValueError, "'q_descale' applies to float8_e4m3fn q; bf16 q over an FP8 cache is quantised with a scale "
                         "found on the device")
    if values["softcap"]:
        fail(ValueError, "'softcap' is not available for bf16 q over a float8_e4m3fn cache (the FP8 kernel has no "
                         "soft-capping)")
    traced = torch.compiler.is_compiling()      # (then the ops' fake kernels check the metadata)
    if traced:
        q8, q_descale = QUANT_Q_FP8(q)
    else:                       # q8 is checked as the attention's q before the pre-pass writes it
        q8 = torch.empty(q.shape, dtype=E4M3, device=q.device)
        op.check_metadata(dict(values, q=q8, out=out, lse=None))
        q_descale = torch.empty(1, dtype=torch.float32, device=q.device)
        QUANT_Q_FP8(q, out=(q8, q_descale))
    if not traced and q_descale.device.type == "cpu" and float(q_descale) > 2.0**DESCALE_LOG2_RANGE[1]:
        fail(ValueError, f"'q' holds finite values of magnitude >= 2^{DESCALE_LOG2_RANGE[1] + MANTISSA_HEADROOM + 1}: "
                         f"its FP8 descale {float(q_descale):.3g} is past 2^{DESCALE_LOG2_RANGE[1]}")
    return tuple(q8 if n == "q" else q_descale if n == "q_descale" else values[n] for n in names)


# ------------------------------------------------------------------ reference

def reference(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q8, q_descale) by the rule above, in torch on the CPU: amax in float64 over the
    finite elements, its binade by frexp, the division by a power of two exact in float32,
    then torch's round-to-nearest-even conversion to e4m3 (NaN for +-Inf and NaN)."""
    x = q.detach().cpu().float()
    finite = torch.isfinite(x)
    amax = float(finite_amax(x, finite)) if x.numel() else 0.0
    low, high = DESCALE_LOG2_RANGE
    exponent = low if amax == 0 else max(math.frexp(amax)[1] - 1 - MANTISSA_HEADROOM, low)
    descale = 2.0**exponent
    scaled = (x / descale).where(finite, torch.full_like(x, float("nan")))
    return scaled.to(E4M3), torch.tensor([descale], dtype=torch.float32)


def finite_amax(x: torch.Tensor, finite: torch.Tensor | None = None) -> torch.Tensor:
    """max |x| over the finite elements of a non-empty float tensor (0 when none is finite);
    `finite`: torch.isfinite(x) where the caller has it."""
    return x.abs().where(torch.isfinite(x) if finite is None else finite, torch.zeros_like(x)).max()


def amax_code(q: torch.Tensor) -> int:
    """What the amax launch leaves for q: the 16-bit magnitude code of its finite amax + 0x80."""
    return int(finite_amax(q.float()).to(torch.bfloat16).view(torch.int16)) + 0x80


def query_error(q: torch.Tensor, q_descale: float) -> torch.Tensor:
    """Elementwise bound on |q - q_descale q8| (float64): half an e4m3 ulp, 2^-4 of the
    magnitude for a normal result, and at most 2^-10 q_descale for a subnormal one (their sum
    covers both)."""
    return 2.0**-4 * q.double().abs() + 2.0**-10 * q_descale


def _register_run_cases() -> None:
    from ..runcases import RunCase, run_case

    def case(gen, total_q=77, heads_q=6) -> tuple[dict, torch.Tensor, torch.Tensor]:
        # a strided q (rows of a wider [total_q, heads_q + 2, 128] buffer, as a fused QKV's
        # view), a few infinities and a NaN among random values over several binades
        base = torch.randn(total_q, heads_q + 2, HEAD_DIM, generator=gen) * torch.exp2(
            torch.randint(-6, 7, (total_q, heads_q + 2, 1), generator=gen).float())
        q = base.to(torch.bfloat16)[:, 1:heads_q + 1]
        q[3, 2, 5], q[40, 0, 100], q[9, 5, 0] = float("inf"), float("-inf"), float("nan")
        q8_want, descale_want = reference(q)
        chunks = total_q * heads_q * ROW_CHUNKS
        partial = torch.full((partition(chunks)[0],), 0xFFFFFFFF, dtype=torch.int64).to(torch.int32).view(torch.uint32)
        args = launch_args(q, torch.full(q.shape, float("nan")).to(E4M3),
                           torch.full((1,), float("nan")), partial)
        return args, q8_want, descale_want

    @run_case(KERNELS[0])
    def amax_case(variant, gen) -> RunCase:
        """partial's maximum is amax's 16-bit magnitude code + 0x80 (the finite elements only)."""
        args, _, _ = case(gen)
        want = torch.tensor([amax_code(args["q"])], dtype=torch.int32)
        # each workgroup holds its own part's maximum; the case checks the largest (the one
        # phase 2 reads) through a one-part launch
        args.update(parts=1, trips=cdiv(args["chunks"], AMAX_UNROLL * AMAX_WORKGROUP), partial=args["partial"][:1])
        return RunCase(args=args, expected={"partial": want.reshape(1).view(torch.uint32)}, atol=0, rtol=0,
                       note="one part over a strided q with +-Inf and NaN")

    @run_case(KERNELS[1])
    def quant_case(variant, gen) -> RunCase:
        """From the partials phase 1 would leave (amax's code in one of them), q8 and q_descale
        bit for bit."""
        args, q8_want, descale_want = case(gen)
        code = amax_code(args["q"])
        parts = args["parts"]
        partial = torch.randint(0, code + 1, (parts,), generator=gen, dtype=torch.int64)
        partial[int(torch.randint(0, parts, (1,), generator=gen))] = code
        args["partial"] = partial.to(torch.int32).view(torch.uint32)
        return RunCase(args=args, expected={"q8": q8_want, "q_descale": descale_want}, atol=0, rtol=0,
                       note="strided q with +-Inf and NaN")


_register_run_cases()

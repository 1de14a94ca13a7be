"""MX-FP8 GEMM for the decode regime: `gfxasm.mxfp8_gemm` on the mxfp8_gemv / mxfp8_gemm kernels.

    out = gfxasm.mxfp8_gemm(a, a_scale, b, b_scale)            # [M, N] bf16
    out[m, n] = sum_k a[m, k] 2^(a_scale[m, k/32] - 127) * b[n, k] 2^(b_scale[n, k/32] - 127)

a [M, K] and b [N, K] (the weights, row-major: out = A @ B^T) are `torch.float8_e4m3fn`;
a_scale [M, K/32] and b_scale [N, K/32] are OCP MX E8M0 scales, one per 32 elements along K,
as `torch.float8_e8m0fnu` or as raw `torch.uint8` exponent bytes (0xFF is NaN). K % 32 == 0,
any M and N (tails are handled inside the kernels). Output bf16 or fp16. Like torch.mm,
M = 0 or N = 0 gives an empty output and K = 0 zeros, without a launch.

Scale layout: plain row-major, scale[r, j] applies to elements 32j .. 32j+31 of row r. The
blocked ("swizzled") layout of cuBLAS / torch._scaled_mm (rows padded to 128, K/32 padded
to 4, in 128 x 4 tiles) is not accepted: a scale tensor of the blocked size but not of
shape [rows, K/32] is refused with a note saying so. One of exactly [rows, K/32] elements
(rows % 128 == 0, K/32 % 4 == 0) cannot be told apart by its shape: unswizzle it first.

Two kernel families (kernels.yaml, asm/):
  * "gemv": mxfp8_gemv_m{1,2,4,8,16}, M <= 16. VALU: v_cvt_scalef32_pk_f32_fp8 applies each
    E8M0 scale through the f32 exponent field, v_pk_fma_f32 accumulates; 16-byte weight loads.
  * "mfma": mxfp8_gemm_m{16,32,64}, any M (M > 64 takes several M blocks; below 16 the
    tile's spare rows read zeros — the matrix cores have the time, the weights dominate).
    v_mfma_scale_f32_16x16x128_f8f6f4 with the block scales in the instruction.
`kernel="auto"` takes the GEMV for M <= 2 and the MFMA kernel above. bench/mxfp8_gemm.py has
the numbers behind that choice: per kilobyte of weights the GEMV's main loop issues 18 VALU
ops at M = 1, 27 at M = 2 and 45 at M = 4, the MFMA kernel's none (3.7 instructions in all);
the timing model has the GEMV ahead at M = 1 (finer workgroups, more of them for small N),
about even at M = 2, and behind from M = 4 on. Both split K over the 4 waves of a workgroup and,
when the grid would be too small for the GPU, over `splits` workgroups along grid z; then
each split writes f32 partials into a workspace and mxfp8_splitk_reduce adds them (a second,
deterministic pass — see `choose_splits`).

Every buffer is addressed with 32-bit offsets, so each tensor must be smaller than 2^31 bytes;
a and b must be 16-byte aligned and every tensor contiguous; `out` may not share memory with
any input (no in-place form: out's dtype differs from every input's). All of it is checked
here before anything is launched: a violation is a ValueError/TypeError naming the
argument, what was expected and what was given.

The GEMV's scaling rule (issue 26): it scales each element in f32 before the dot product
(v_cvt_scalef32_pk_f32_fp8; docs/fp8-conversion-evidence.md: a result past f32 is +-inf), so
an element whose scaled value |x| 2^(s - 127) reaches 2^128 — possible only for scale bytes
247..254 — becomes +-inf, and the output inf or NaN, where the exact result (and the MFMA
kernel's, which scales the products) may be finite. Where the data is readable (CPU tensors:
the emulator) such a GEMV call is refused before launch, naming the operand and suggesting
kernel='mfma'; on a GPU it is not checked (it would need a pass over the operands).

torch ops (declared on loader/ops/framework.py): gfxasm::mxfp8_gemm(a, a_scale, b, b_scale,
out_dtype, kernel, splits) -> out and gfxasm::mxfp8_gemm_out(a, a_scale, b, b_scale, out!,
out_dtype, kernel, splits), with fake kernels (meta tensors, torch.compile). The checked plan
and its launches are cached per tensor layout and arguments, so a repeated call only checks
pointers (and, for the GEMV on CPU tensors, the scaling rule), allocates what it returns
(and the split-K workspace) and launches.

`reference` computes the exact product of the same quantized values (float64, returned as
float32); `error_bound` is the per-element tolerance the tests use.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..gridexpr import cdiv
from ..launcher import prepare
from ..manifest import default_manifest
from . import arguments, framework

E4M3 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
SCALE_DTYPES = (E8M0, torch.uint8)
OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
BLOCK = 32                         # elements per E8M0 scale along K
KERNELS = ("auto", "gemv", "mfma")
GEMV_MAX_M = 16                    # the GEMV holds at most 16 activation rows in registers
AUTO_GEMV_MAX_M = 2                # auto: GEMV up to here (its VALU work per weight byte grows with M)
GEMV_M_TILES = (1, 2, 4, 8, 16)    # mxfp8_gemv_m<M_T>
MFMA_M_TILES = (16, 32, 64)        # mxfp8_gemm_m<16*MT>
MAX_SPLITS = 16                    # the reduce kernel's batched offsets stay below 2^32 up to here
HBM_EFFECTIVE = 0.85 * 8.0e12      # bytes/s a well-fed MI355X streams (8 TB/s peak)
MEMORY_LATENCY_S = 1.0e-6          # loaded HBM latency, estimated (MI300X-class: 0.5-1.5 us under load)
SECOND_PASS_S = 2.0e-6             # a dependent second launch, estimated
_MAX_BYTES = 2**31                 # every buffer offset must fit in 31 bits (OOB_OFFSET = 2^31)
_MAX_K = 2**24                     # (rows + 64) * K stays below 2^32 in the kernels' offsets
GEMV_RISKY_SCALE = 247             # the smallest E8M0 byte that can scale an e4m3 value (<= 448 < 2^9) to 2^128


@dataclass(frozen=True)
class Plan:
    """What one call launches: the kernel, its variant, the split-K factor and the tile sizes."""
    kernel: str                    # manifest kernel name
    variant: str
    splits: int
    rows_m: int                    # activation rows per workgroup (GEMV: M_T; MFMA: 16*MT)
    rows_n: int                    # weight rows per workgroup (GEMV: R; MFMA: 16*NT)
    kind: str                      # "gemv" or "mfma"


# ------------------------------------------------------------------ validation

def _name(value) -> str:
    return type(value).__name__


def _tensor(name: str, value, what: str) -> torch.Tensor:
    return arguments.tensor("mxfp8_gemm", name, value, what=what)


def _check_scale_shape(name: str, t: torch.Tensor, rows: int, K: int) -> None:
    """[rows, K/32], plain row-major; a tensor the size of the blocked layout is named as such."""
    if tuple(t.shape) == (rows, K // BLOCK):
        return
    blocked = cdiv(rows, 128) * 128 * cdiv(K // BLOCK, 4) * 4
    note = (f"; {t.numel()} elements is the size of the blocked (swizzled 128x4-tile) scale layout of cuBLAS / "
            f"torch._scaled_mm, which gfxasm does not take: pass plain row-major [rows, K/32] scales"
            if blocked and t.numel() == blocked else "")
    raise ValueError(f"mxfp8_gemm: '{name}' must be [{rows}, {K // BLOCK}] (one scale per {BLOCK} elements of "
                     f"K = {K}), got shape {tuple(t.shape)}{note}")


def _contiguous(name: str, t: torch.Tensor, what: str) -> None:
    if t.numel() == 0:             # nothing is read or written: any strides will do
        return
    rows, cols = t.shape
    row_ok = rows <= 1 or t.stride(0) == cols
    col_ok = cols <= 1 or t.stride(1) == 1
    if not (row_ok and col_ok):
        raise ValueError(f"mxfp8_gemm: '{name}' must be contiguous (row-major {what}, strides ({cols}, 1)), "
                         f"got strides {t.stride()}")


def _small(name: str, t: torch.Tensor) -> None:
    nbytes = t.numel() * t.element_size()
    if nbytes >= _MAX_BYTES:
        raise ValueError(f"mxfp8_gemm: '{name}' is {nbytes} bytes; the kernels address buffers with 32-bit "
                         f"offsets and need every tensor below 2^31 bytes (shape {tuple(t.shape)})")


def validate(a, a_scale, b, b_scale, out, out_dtype, kernel) -> tuple[int, int, int]:
    """Check everything the arguments' metadata can tell (all the fake kernels run); return
    (M, N, K). Devices, alignment and overlap are the op framework's checks."""
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"mxfp8_gemm: 'kernel' must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"mxfp8_gemm: 'out_dtype' must be torch.bfloat16 or torch.float16, got {out_dtype}")
    a = _tensor("a", a, "[M, K] activations")
    b = _tensor("b", b, "[N, K] weights")
    a_scale = _tensor("a_scale", a_scale, "[M, K/32] E8M0 scales")
    b_scale = _tensor("b_scale", b_scale, "[N, K/32] E8M0 scales")
    for name, t, what in (("a", a, "[M, K] activations"), ("b", b, "[N, K] weights")):
        if t.dim() != 2:
            raise ValueError(f"mxfp8_gemm: '{name}' must be 2-D ({what}), got shape {tuple(t.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype != E4M3:
            raise TypeError(f"mxfp8_gemm: '{name}' dtype must be torch.float8_e4m3fn, got {t.dtype}")
    for name, t in (("a_scale", a_scale), ("b_scale", b_scale)):
        if t.dtype not in SCALE_DTYPES:
            raise TypeError(f"mxfp8_gemm: '{name}' dtype must be torch.float8_e8m0fnu or torch.uint8 (E8M0 "
                            f"exponent bytes), got {t.dtype}")
    (M, K), (N, Kb) = a.shape, b.shape
    if K % BLOCK:
        raise ValueError(f"mxfp8_gemm: K (a.shape[1]) must be a multiple of {BLOCK}, got {K}")
    if K >= _MAX_K:
        raise ValueError(f"mxfp8_gemm: K (a.shape[1]) must be below 2^24, got {K}")
    if Kb != K:
        raise ValueError(f"mxfp8_gemm: 'b' must be [N, K] with K = {K} (a's), got shape {tuple(b.shape)}")
    _check_scale_shape("a_scale", a_scale, M, K)
    _check_scale_shape("b_scale", b_scale, N, K)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"mxfp8_gemm: 'out' must be a torch.Tensor or None, got {_name(out)}")
        if out.dtype != out_dtype:
            raise TypeError(f"mxfp8_gemm: 'out' dtype must be out_dtype ({out_dtype}), got {out.dtype}")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"mxfp8_gemm: 'out' must be [M, N] = [{M}, {N}], got shape {tuple(out.shape)}")
    named = [("a", a, "[M, K]"), ("a_scale", a_scale, "[M, K/32]"), ("b", b, "[N, K]"),
             ("b_scale", b_scale, "[N, K/32]")] + ([("out", out, "[M, N]")] if out is not None else [])
    for name, t, what in named:
        _contiguous(name, t, what)
    for name, t, _ in named:
        _small(name, t)
    out_bytes = M * N * 2
    if out is None and out_bytes >= _MAX_BYTES:
        raise ValueError(f"mxfp8_gemm: the output [M, N] = [{M}, {N}] would be {out_bytes} bytes; the kernels need "
                         f"every tensor below 2^31 bytes")
    if kernel == "gemv" and M > GEMV_MAX_M:
        raise ValueError(f"mxfp8_gemm: kernel='gemv' takes M <= {GEMV_MAX_M}, got M = {M} (use 'mfma' or 'auto')")
    return M, N, K


# ------------------------------------------------------------------ planning

@functools.lru_cache(maxsize=None)
def _tiles(kernel: str) -> tuple[int, int]:
    """(activation rows, weight rows) per workgroup, from the kernel's manifest defines."""
    from ..manifest import default_manifest
    defines = next(iter(default_manifest().kernel(kernel).variants.values())).defines
    if kernel.startswith("mxfp8_gemv"):
        return defines["M_T"], defines["R"]
    return 16 * defines["MT"], 16 * defines["NT"]


def choose_kind(M: int, kernel: str = "auto") -> str:
    if kernel != "auto":
        return kernel
    return "gemv" if M <= AUTO_GEMV_MAX_M else "mfma"


def choose_splits(kind: str, M: int, N: int, K: int, rows_m: int, rows_n: int) -> int:
    """Split-K factor along grid z (a power of two) that minimises a small time model:

        time(S) = bytes(S) / min(HBM_EFFECTIVE, workgroups * S * per-workgroup bandwidth)
                  + SECOND_PASS_S if S > 1
        bytes(S) = N*K*33/32 (weights and scales, streamed once) + 2*M*N (output)
                   + 8*S*M*N if S > 1 (the f32 workspace, written here and read back)

    A workgroup's bandwidth is the weight bytes it keeps in flight over the memory latency
    (GEMV: 4 waves x R rows x 1 KiB; MFMA: 4 waves x 2 steps x 16*NT rows x 128 B), so a grid
    too small to cover the latency splits K, and pays for it with the workspace round trip
    and the launch of the second pass. Every one of the 4*S K workers keeps work: a 1 KiB
    chunk (GEMV) or two 128-byte steps (MFMA: its double buffer). The constants are
    estimates (MI355X: 8 TB/s, ~1 us loaded latency, ~2 us for a dependent launch) to be
    refitted on hardware with bench/mxfp8_gemm.py.

    The reduction is a second pass rather than atomics: deterministic, no zeroed buffer to
    prepare, and nothing to make coherent across the 8 XCDs' L2 caches (a last-arriving-
    workgroup reduction would need exactly that, which no emulator can check)."""
    workgroups = cdiv(M, rows_m) * cdiv(N, rows_n) if kind == "mfma" else cdiv(N, rows_n)
    work_units = cdiv(K, 1024) if kind == "gemv" else cdiv(K, 128) // 2
    in_flight = 4 * rows_n * (1024 if kind == "gemv" else 2 * 128)
    per_workgroup = in_flight / MEMORY_LATENCY_S

    def time(splits: int) -> float:
        moved = N * K * 33 / 32 + 2 * M * N + (8 * splits * M * N if splits > 1 else 0)
        bandwidth = min(HBM_EFFECTIVE, workgroups * splits * per_workgroup)
        return moved / bandwidth + (SECOND_PASS_S if splits > 1 else 0.0)

    best, splits = 1, 2
    while splits <= MAX_SPLITS and 4 * splits <= work_units:
        if time(splits) < time(best):
            best = splits
        splits *= 2
    return best


def plan(M: int, N: int, K: int, kernel: str = "auto", out_dtype: torch.dtype = torch.bfloat16,
         splits: int | None = None) -> Plan:
    kind = choose_kind(M, kernel)
    if kind == "gemv":
        m_tile = next(t for t in GEMV_M_TILES if t >= M)
        name = f"mxfp8_gemv_m{m_tile}"
    else:
        m_tile = next((t for t in MFMA_M_TILES if t >= M), MFMA_M_TILES[-1])
        name = f"mxfp8_gemm_m{m_tile}"
    rows_m, rows_n = _tiles(name)
    if splits is None:
        splits = choose_splits(kind, M, N, K, rows_m, rows_n)
    return Plan(name, _out_variant(name, out_dtype).name, splits, rows_m, rows_n, kind)


def _out_variant(kernel: str, out_dtype: torch.dtype):
    """The variant of `kernel` writing `out_dtype`, chosen by its OUT_F16 define."""
    from ..manifest import default_manifest
    return default_manifest().kernel(kernel).variant_with(OUT_F16=out_dtype == torch.float16)


# ------------------------------------------------------------------ the op

def _scales(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == E8M0 else t.view(E8M0)


def _as_bytes(t):
    return t.view(torch.uint8) if isinstance(t, torch.Tensor) and t.dtype == E8M0 else t


def _check_splits(splits) -> None:
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int)
                               or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f"mxfp8_gemm: 'splits' must be an int in [1, {MAX_SPLITS}] or None, got {splits!r}")


def _gemv_reads_data(call, M: int) -> bool:
    """Whether this call's data gets the GEMV overflow check: real CPU tensors for the GEMV."""
    return call.data and call.a.device.type == "cpu" and choose_kind(M, call.kernel) == "gemv"


def _refuse_gemv_overflow(call) -> None:
    """The GEMV's f32 scaling rule (module docstring): refuse an element whose scaled value
    |x| 2^(s - 127) reaches 2^128. |x| <= 448 < 2^9, so only scale bytes 247..254 can
    (255 is NaN, which both kernels and `reference` give): a max over the scales first,
    the per-block test only where one is that large. The max runs in numpy, on one thread:
    torch's parallel reduction can wait milliseconds for a busy core (seen on a loaded host)."""
    for name, x, scale in (("a", call.a, call.a_scale), ("b", call.b, call.b_scale)):
        s = scale.view(torch.uint8)
        if int(s.numpy().max()) < GEMV_RISKY_SCALE:
            continue
        rows, blocks = s.shape
        amax = x.float().abs().view(rows, blocks, BLOCK).amax(-1).double()     # a NaN code stays NaN: not refused
        e = s.to(torch.int64)
        bad = ((e < 0xFF) & (amax >= torch.exp2((255 - e).double()))).nonzero()
        if len(bad):
            r, j = bad[0].tolist()
            raise ValueError(f"mxfp8_gemm: '{name}' row {r}, block {j}: {float(amax[r, j])} x 2^({int(e[r, j])} - 127) "
                             f"reaches 2^128; the GEMV kernel (kernel='gemv', or 'auto' at M <= {AUTO_GEMV_MAX_M}) "
                             f"scales every element in f32 before the dot product and would give inf or NaN where "
                             f"the exact result may be finite: pass kernel='mfma'")


def _check(call) -> tuple[int, int, int]:
    M, N, K = validate(call.a, call.a_scale, call.b, call.b_scale, call.out, call.out_dtype, call.kernel)
    _check_splits(call.splits)
    if M * N * K and _gemv_reads_data(call, M):
        _refuse_gemv_overflow(call)
    return M, N, K


def _allocate(call, names: frozenset) -> dict:
    try:
        return {"out": torch.empty((call.a.shape[0], call.b.shape[0]), dtype=call.out_dtype, device=call.a.device)}
    except (AttributeError, IndexError, TypeError, RuntimeError):
        validate(call.a, call.a_scale, call.b, call.b_scale, None, call.out_dtype, call.kernel)  # names what is wrong
        raise


def _zero_out(call) -> None:
    call.out.zero_()


def _plan(shape: tuple[int, int, int], call) -> framework.Plan:
    M, N, K = shape
    if M * N * K == 0:
        return framework.Plan(empty=_zero_out if K == 0 else None)      # like torch.mm: K = 0 gives zeros
    a, out = call.a, call.out
    chosen = plan(M, N, K, call.kernel, call.out_dtype, call.splits)
    if chosen.splits > 1 and chosen.splits * M * N * 4 >= _MAX_BYTES:
        raise ValueError(f"mxfp8_gemm: the split-K workspace ({chosen.splits} x {M} x {N} f32) would exceed "
                         f"2^31 bytes; pass splits=1")
    ws_numel = chosen.splits * M * N if chosen.splits > 1 else 0
    ws = torch.empty(ws_numel, dtype=torch.float32, device=a.device)
    manifest = default_manifest()
    launches = (prepare(manifest.kernel(chosen.kernel).variant(chosen.variant),
                        dict(a=a, a_scale=_scales(call.a_scale), b=call.b, b_scale=_scales(call.b_scale), out=out,
                             ws=ws, M=M, N=N, K=K, splits=chosen.splits)),)
    recheck = _refuse_gemv_overflow if _gemv_reads_data(call, M) else None
    if not ws_numel:
        return framework.Plan(launches, fixed=dict(ws=ws), recheck=recheck)     # the kernel never touches ws
    reduce = _out_variant("mxfp8_splitk_reduce", call.out_dtype)
    launches += (prepare(reduce, dict(ws=ws, out=out, M=M, N=N, splits=chosen.splits)),)
    # a workspace per call: concurrent calls of one layout must not share one
    return framework.Plan(launches, scratch=dict(ws=((ws_numel,), torch.float32)), recheck=recheck)


MXFP8_GEMM = framework.define(framework.Spec(
    "mxfp8_gemm",
    params=(framework.Param("a", "Tensor", align=16), framework.Param("a_scale", "Tensor"),   # a, b: 16-byte loads
            framework.Param("b", "Tensor", align=16), framework.Param("b_scale", "Tensor"),
            framework.Param("out_dtype", "ScalarType"), framework.Param("kernel", "str"),
            framework.Param("splits", "SymInt?")),
    outputs=(framework.Output("out"),),
    check=_check, allocate=_allocate, plan=_plan, out_after="b_scale"))


def mxfp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
               out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
               kernel: str = "auto", splits: int | None = None) -> torch.Tensor:
    """out[M, N] = (a * 2^(a_scale - 127)) @ (b * 2^(b_scale - 127))^T in bf16 (or fp16).

    a [M, K], b [N, K]: float8_e4m3fn; a_scale [M, K/32], b_scale [N, K/32]: plain row-major
    E8M0 scales (float8_e8m0fnu or uint8), not the blocked/swizzled layout (module docstring).
    kernel: "auto", "gemv" (M <= 16) or "mfma" (any M). splits: split-K factor along the
    grid (1..16; None chooses, see choose_splits). Runs torch.ops.gfxasm.mxfp8_gemm (or
    mxfp8_gemm_out when `out` is given)."""
    if torch.compiler.is_compiling():
        # Inductor (torch 2.13) fails on a mutating custom op with a float8_e8m0fnu input
        # ("auto_functionalized_v2 was not removed"); as uint8 they are the same scale bytes.
        a_scale, b_scale = _as_bytes(a_scale), _as_bytes(b_scale)
    return MXFP8_GEMM(a, a_scale, b, b_scale, out_dtype, kernel, splits, out=out)


def kernel_names() -> list[str]:
    return ([f"mxfp8_gemv_m{t}" for t in GEMV_M_TILES] + [f"mxfp8_gemm_m{t}" for t in MFMA_M_TILES]
            + ["mxfp8_splitk_reduce"])


def build_kernels(force: bool = False) -> None:
    """Assemble (incrementally) and check this op's kernels only."""
    from .. import build    # the toolchain is needed only here, not to import the op
    build.build_kernels(kernel_names(), force)


# ------------------------------------------------------------------ reference

def dequantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * 2^(scale - 127) as exact float64 ([rows, K]); a scale byte 0xFF gives NaN."""
    e = (scale if scale.dtype == torch.uint8 else scale.view(torch.uint8)).to(torch.int64)
    factor = torch.ldexp(torch.ones_like(e, dtype=torch.float64), e - 127)
    factor = torch.where(e == 0xFF, torch.full_like(factor, float("nan")), factor)
    return x.to(torch.float32).to(torch.float64) * factor.repeat_interleave(BLOCK, dim=1)


def reference(a, a_scale, b, b_scale) -> torch.Tensor:
    """The exact product of the quantized operands (float64 — every fp8 x E8M0 value and
    product is exact there; only the sum over K rounds, ~2^-53), returned as float32."""
    return (dequantize(a, a_scale) @ dequantize(b, b_scale).T).to(torch.float32)


def error_bound(a, a_scale, b, b_scale, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Per-element tolerance (float64 [M, N]) for a kernel result against `reference`:
        |out - ref| <= u_out |ref| + tiny_out / 2 + (K/16 + 128) u_f32 sum_k |a_k b_k|
    The first term is the final rounding to bf16 (u = 2^-8, half an ulp at worst) or fp16
    (2^-11), plus half the smallest subnormal step (fp16: 2^-25) for results that round
    into the subnormal range. The last bounds the f32 accumulation: no product travels through more than
    K/16 + 128 f32 additions on its way to the output in either kernel (per lane at most
    K/16 packed FMAs in the GEMV, K/128 MFMA steps in the GEMM, then the reductions)."""
    K = a.shape[1]
    magnitude = dequantize(a, a_scale).abs() @ dequantize(b, b_scale).abs().T
    exact = dequantize(a, a_scale) @ dequantize(b, b_scale).T
    u_out, half_tiny = (2.0 ** -8, 2.0 ** -134) if out_dtype == torch.bfloat16 else (2.0 ** -11, 2.0 ** -25)
    return u_out * exact.abs() + half_tiny + (K / 16 + 128) * 2.0 ** -24 * magnitude


# ------------------------------------------------------------------ `gfxasm run` cases

# Scale centres that keep the results well inside the output format's range (fp16 tops out
# at 65504; bf16 has f32's range).
OPERAND_RANGES = {torch.bfloat16: dict(a_center=127, b_center=120), torch.float16: dict(a_center=120, b_center=110)}


def random_operands(M: int, N: int, K: int, gen: torch.Generator, *, a_center: int = 127, b_center: int = 120,
                    spread: int = 6):
    """Random e4m3 codes (every finite code: zeros, subnormals, +-448; no NaN) and NON-uniform
    E8M0 scales per 32-block in [center - spread, center + spread] — a wrong K order or a
    scale applied to the wrong block changes the answer."""
    def codes(rows: int) -> torch.Tensor:
        c = torch.randint(0, 254, (rows, K), generator=gen, dtype=torch.int32)
        c = c + (c >= 0x7F).int()                      # skip 0x7F; 0xFF is never drawn
        return c.to(torch.uint8).view(E4M3)

    def scales(rows: int, center: int) -> torch.Tensor:
        e = torch.randint(center - spread, center + spread + 1, (rows, K // BLOCK), generator=gen, dtype=torch.int32)
        return e.to(torch.uint8).view(E8M0)
    return codes(M), scales(M, a_center), codes(N), scales(N, b_center)


def _register_run_cases() -> None:
    from ..runcases import RunCase, run_case

    def make(variant, gen: torch.Generator, M: int, N: int, K: int) -> RunCase:
        out_dtype = torch.float16 if variant.defines["OUT_F16"] else torch.bfloat16
        a, a_scale, b, b_scale = random_operands(M, N, K, gen, **OPERAND_RANGES[out_dtype])
        expected = reference(a, a_scale, b, b_scale)
        bound = error_bound(a, a_scale, b, b_scale, out_dtype)
        out = torch.full((M, N), float("nan"), dtype=out_dtype)
        # isclose(atol, rtol) with the bound's two parts at their largest: a looser, uniform form
        atol = float((bound - (2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11) * expected.double().abs()).max())
        rtol = 2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11
        return RunCase(args=dict(a=a, a_scale=a_scale, b=b, b_scale=b_scale, out=out,
                                 ws=torch.empty(1), M=M, N=N, K=K, splits=1),
                       expected={"out": expected}, atol=atol, rtol=rtol, note=f"M={M} N={N} K={K}")

    for m_tile in GEMV_M_TILES:
        def gemv_case(variant, gen, M=None, N=37, K=1056, _m=m_tile):
            return make(variant, gen, M if M is not None else (_m - 1 if _m > 2 else _m), N, K)
        run_case(f"mxfp8_gemv_m{m_tile}")(gemv_case)
    for m_tile in MFMA_M_TILES:
        def gemm_case(variant, gen, M=None, N=75, K=608, _m=m_tile):
            return make(variant, gen, M or _m - 3, N, K)
        run_case(f"mxfp8_gemm_m{m_tile}")(gemm_case)

    @run_case("mxfp8_splitk_reduce")
    def reduce_case(variant, gen, M=5, N=37, splits=11) -> RunCase:
        ws = torch.randn(splits * M * N, generator=gen)
        out_dtype = torch.float16 if variant.defines["OUT_F16"] else torch.bfloat16
        expected = ws.double().view(splits, M, N).sum(0).float()
        out = torch.full((M, N), float("nan"), dtype=out_dtype)
        return RunCase(args=dict(ws=ws, out=out, M=M, N=N, splits=splits), expected={"out": expected},
                       atol=splits * splits * 2.0 ** -24 * float(ws.abs().max()),
                       rtol=2.0 ** -8 if out_dtype == torch.bfloat16 else 2.0 ** -11,
                       note=f"M={M} N={N} splits={splits}")


_register_run_cases()

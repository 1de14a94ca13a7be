"""SwiGLU-OAI fused with MX-FP8 quantisation: `gfxasm.swiglu_mxfp8_quant` on asm/swiglu_mxfp8_quant.s.

    q, scale = gfxasm.swiglu_mxfp8_quant(x, alpha=1.702, beta=1.0, limit=7.0)

x [M, 2I] bf16 or fp16 holds gate = x[:, :I] and up = x[:, I:] (the split layout). The
activation is gpt-oss's SwiGLU (huggingface transformers, models/gpt_oss/modeling_gpt_oss.py,
v4.55 lines 106-110; vLLM's swigluoai_and_mul), in f32:

    g = min(gate, limit);  u = clamp(up, -limit, limit);  y = g * sigmoid(alpha * g) * (u + beta)

(gpt-oss takes beta = 1, "an extra bias of 1 to the linear layer"), then OCP MX-FP8 (OCP
Microscaling Formats v1.0, section 6.3) per block of 32 along I:

    shared exponent = floor(log2(max |y|)) - emax(e4m3) = floor(log2 amax) - 8
    scale[r, b] = that exponent + 127 as an E8M0 byte, clamped at 0 (2^-127) below; an
                  all-zero block (amax = 0) gets 0, as in the OCP reference code
                  (microsoft/microxcaling: log2 of 0 taken as the minimum exponent)
    q[r, i] = e4m3(y / 2^(scale - 127)), round to nearest even; the rule puts amax / X in
              [256, 512), above e4m3's largest finite 448, so values that would round past
              448 saturate to +-448 (the spec leaves overflow to the implementation; the
              kernel clamps before converting, so it is independent of the MODE register).
q [M, I] float8_e4m3fn, scale [M, I/32] float8_e8m0fnu: exactly what gfxasm.mxfp8_gemm and
gfxasm.mxfp8_moe_gemm take as activations.

The sigmoid is 1 / (1 + 2^(-alpha log2(e) g)) with v_exp_f32 and v_rcp_f32 (about 1 ulp
each on the hardware): y carries a few f32 ulps of error, so an element within that of a
rounding boundary of e4m3, or a block whose amax is that close to a power of two, may land
one step (or one scale) away from a float64 computation. With alpha = 0 the sigmoid is
exactly 1/2, which the tests use to check the quantisation bit for bit.

Limits (ValueError/TypeError naming the argument, before launch): x bf16/fp16, 2-D,
contiguous, 16-byte aligned, x.shape[1] = 2I with I % 32 == 0, below 2^31 bytes, M * (I/32)^2
< 2^32 (the kernel divides by I/32 with a multiply-high); alpha, beta finite; limit > 0 (inf
allowed: no clamp). Outputs (`out=(q, scale)`) of the exact shapes and dtypes, contiguous, q
16-byte aligned, not overlapping x. M = 0 or I = 0 launches nothing. An input row holding
Inf or NaN gives an unspecified block (no check: it would need a pass over the data).

torch ops (declared on loader/ops/framework.py): gfxasm::swiglu_mxfp8_quant(x, alpha, beta,
limit) -> (q, scale) and gfxasm::swiglu_mxfp8_quant_out(x, q!, scale!, alpha, beta, limit),
with fake kernels; the checked launch is cached per layout and scalars.
"""
from __future__ import annotations

import math

import torch

from ..gridexpr import magic_u32
from ..launcher import prepare
from ..manifest import default_manifest
from . import arguments, framework
from .mxfp8_gemm import BLOCK, E4M3, E8M0

OP = "swiglu_mxfp8_quant"
IN_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
E4M3_EMAX = 8                      # floor(log2(448))
E4M3_MAX = 448.0
_MAX_BYTES = 2**31


def _fail(exc, message: str):
    arguments.fail(OP, exc, message)


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(TypeError, f"'{name}' must be a float, got {type(value).__name__}")
    return float(value)


def validate(x, alpha, beta, limit, out=None) -> tuple[int, int]:
    """Check what metadata tells (the fake kernels run this); return (M, I)."""
    arguments.tensor(OP, "x", x, what="[M, 2I] gate | up")
    if x.dtype not in IN_DTYPES:
        _fail(TypeError, f"'x' dtype must be torch.bfloat16 or torch.float16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] % (2 * BLOCK):
        _fail(ValueError, f"'x' must be [M, 2I] with I % {BLOCK} == 0, got shape {tuple(x.shape)}")
    if x.numel() and not x.is_contiguous():
        _fail(ValueError, f"'x' must be contiguous, got strides {x.stride()}")
    M, I = x.shape[0], x.shape[1] // 2
    if x.numel() * 2 >= _MAX_BYTES:
        _fail(ValueError, f"'x' is {x.numel() * 2} bytes; the kernel needs below 2^31 (32-bit buffer offsets)")
    if M * (I // BLOCK) ** 2 >= 2**32:
        _fail(ValueError, f"M * (I/32)^2 = {M * (I // BLOCK) ** 2} must be below 2^32 (the kernel's row division)")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not math.isfinite(_number(name, value)):
            _fail(ValueError, f"'{name}' must be finite, got {value}")
    if not _number("limit", limit) > 0:
        _fail(ValueError, f"'limit' must be > 0 (inf: no clamp), got {limit}")
    if out is not None:
        for name, t, shape, dtype in (("q", out[0], (M, I), E4M3), ("scale", out[1], (M, I // BLOCK), E8M0)):
            if not isinstance(t, torch.Tensor):
                _fail(TypeError, f"'{name}' (out) must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != dtype:
                _fail(TypeError, f"'{name}' (out) dtype must be {dtype}, got {t.dtype}")
            if tuple(t.shape) != shape:
                _fail(ValueError, f"'{name}' (out) must be {list(shape)}, got shape {tuple(t.shape)}")
            if t.numel() and not t.is_contiguous():
                _fail(ValueError, f"'{name}' (out) must be contiguous, got strides {t.stride()}")
    return M, I


def launch_args(x, q, scale, alpha, beta, limit) -> tuple[str, dict]:
    """(variant, kernel arguments) of a validated call (shared with bench/moe.py)."""
    M, I = x.shape[0], x.shape[1] // 2
    NB = I // BLOCK
    variant = default_manifest().kernel(OP).variant_with(F16=x.dtype == torch.float16).name    # by its define
    return variant, dict(
        x=x, q=q, scale=scale, M=M, I=I, NB=NB, magic=magic_u32(NB),   # 0: NB = 1 (see the kernel)
        **activation_args(alpha, beta, limit))


def activation_args(alpha, beta, limit) -> dict:
    """The activation's kernel scalars (asm/include/swiglu_mxfp8.inc), shared with the fused
    gate_up GEMM (mxfp8_moe_gemm.gate_up_swiglu)."""
    return dict(neg_alpha_log2e=-float(alpha) * math.log2(math.e), beta=float(beta), limit=float(limit))


def _check(call) -> tuple[int, int]:
    # the functional fake checks before its outputs exist (q and scale None)
    return validate(call.x, call.alpha, call.beta, call.limit, None if call.q is None else (call.q, call.scale))


def _allocate(call, names: frozenset) -> dict:
    M, I = validate(call.x, call.alpha, call.beta, call.limit)
    x = call.x
    return dict(q=torch.empty((M, I), dtype=E4M3, device=x.device),
                scale=torch.empty((M, I // BLOCK), dtype=E8M0, device=x.device))


def _plan(shape: tuple[int, int], call) -> framework.Plan:
    M, I = shape
    if not M * I:
        return framework.Plan()
    variant, args = launch_args(call.x, call.q, call.scale, call.alpha, call.beta, call.limit)
    return framework.Plan((prepare(default_manifest().kernel(OP).variant(variant), args),))


SWIGLU_MXFP8_QUANT = framework.define(framework.Spec(
    OP,
    params=(framework.Param("x", "Tensor", align=16), framework.Param("alpha", "float"),   # 16-byte loads
            framework.Param("beta", "float"), framework.Param("limit", "float")),
    outputs=(framework.Output("q", align=16), framework.Output("scale")),                 # 16-byte stores
    check=_check, allocate=_allocate, plan=_plan, out_after="x"))


def swiglu_mxfp8_quant(x: torch.Tensor, *, alpha: float = 1.702, beta: float = 1.0, limit: float = 7.0,
                       out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, I] e4m3, scale [M, I/32] E8M0) of SwiGLU-OAI(x) (module docstring for the exact
    activation and the OCP scale rule). x [M, 2I] bf16/fp16 = gate | up. out=(q, scale)
    writes the caller's tensors (torch.ops.gfxasm.swiglu_mxfp8_quant_out)."""
    return SWIGLU_MXFP8_QUANT(x, alpha, beta, limit, out=out)


# ------------------------------------------------------------------ reference

def activation_reference(x: torch.Tensor, alpha: float = 1.702, beta: float = 1.0, limit: float = 7.0
                         ) -> torch.Tensor:
    """SwiGLU-OAI of the split layout in float64."""
    x = x.double()
    I = x.shape[1] // 2
    g, u = x[:, :I].clamp(max=limit), x[:, I:].clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + beta)


def quantize_reference(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX-FP8 of float64 y [M, I] by the rule above: (q e4m3, scale E8M0)."""
    M, I = y.shape
    blocks = y.double().view(M, I // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1)
    exponent = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - E4M3_EMAX + 127
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent)).clamp(0, 254)
    X = torch.ldexp(torch.ones_like(exponent), (exponent - 127).long())
    v = (blocks / X[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
    # y / X is exact; the float32 step is exact for every y a float32 holds (the kernel's), and
    # may round a float64 y once before the e4m3 rounding (at most one e4m3 step, at ties)
    q = v.to(torch.float32).to(E4M3)
    return q.view(M, I), exponent.to(torch.uint8).view(E8M0)


def _register_run_case() -> None:
    from ..runcases import RunCase, run_case

    @run_case(OP)
    def swiglu_case(variant, gen, M=37, I=96) -> RunCase:
        """alpha = 0, beta = 0, no clamp: y = gate * up / 2 exactly, so q and scale are exact."""
        dtype = torch.float16 if variant.defines["F16"] else torch.bfloat16
        x = (torch.randn(M, 2 * I, generator=gen) * 4).to(dtype)
        q_want, s_want = quantize_reference(activation_reference(x, 0.0, 0.0, float("inf")))
        _, args = launch_args(x, torch.full((M, I), float("nan")).to(E4M3),
                              torch.full((M, I // BLOCK), 0xFF, dtype=torch.uint8).view(E8M0), 0.0, 0.0, float("inf"))
        return RunCase(args=args,
                       expected=dict(q=q_want, scale=s_want), atol=0, rtol=0,
                       note=f"M={M} I={I}, alpha = 0 (exact)")


_register_run_case()

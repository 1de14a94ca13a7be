"""User-facing ops: validation, kernel launch, references."""
from .fmha import fmha_fwd
from .mxfp8_gemm import mxfp8_gemm

__all__ = ["fmha_fwd", "mxfp8_gemm"]

"""User-facing ops: validation, kernel launch, references."""
from .decode_attention import decode_attention
from .fmha import fmha_fwd
from .mxfp8_gemm import mxfp8_gemm

__all__ = ["decode_attention", "fmha_fwd", "mxfp8_gemm"]

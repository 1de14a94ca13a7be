"""gfxasm: hand-written gfx950 kernels, their loader, and a strict gfx950 emulator."""
from .launch import launch
from .ops import decode_attention, fmha_fwd, mxfp8_gemm

__all__ = ["launch", "decode_attention", "fmha_fwd", "mxfp8_gemm"]

"""gfxasm: hand-written gfx950 kernels, their loader, and a strict gfx950 emulator."""
from .launcher import launch
from .ops.batch_prefill import batch_prefill
from .ops.decode_attention import decode_attention
from .ops.fmha import fmha_fwd
from .ops.mxfp8_gemm import mxfp8_gemm
from .ops.moe_align import moe_align_block_size
from .ops.moe_layer import mxfp8_moe
from .ops.mxfp8_moe_gemm import mxfp8_moe_gemm
from .ops.swiglu_quant import swiglu_mxfp8_quant

__all__ = ["launch", "batch_prefill", "decode_attention", "fmha_fwd", "mxfp8_gemm", "mxfp8_moe_gemm", "moe_align_block_size",
           "mxfp8_moe", "swiglu_mxfp8_quant"]

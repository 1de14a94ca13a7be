"""Our fmha_fwd_d128_bf16 on the shapes where aiter's FMHA has published MI355X results
(bench_conformance.py runs those), so `gfxasm bench` prints both side by side."""
from __future__ import annotations

import math

import torch

from bench.bench_conformance import FMHA_PUBLISHED
from bench.common import manifest_case
from gfxasm.launcher import fill_strides
from gfxasm.manifest import default_manifest
from gfxasm.ops import fmha

KERNEL, VARIANT = "fmha_fwd_d128", "fmha_fwd_d128_bf16"


def fmha_case(B, Hq, Hk, S):
    D = 128
    q = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    k = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    v = torch.empty(B, S, Hk, D, dtype=torch.bfloat16)
    o = torch.empty(B, S, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, S, dtype=torch.float32)
    args = fmha.kernel_args(q, k, v, o, lse, 1 / math.sqrt(D))     # the op's own arguments, defaults for the rest
    args = fill_strides(default_manifest().kernel(KERNEL).variant(VARIANT), args)   # the byte strides, as a launch fills them
    nbytes = 2.0 * (q.numel() + k.numel() + v.numel() + o.numel()) + 4.0 * lse.numel()
    return manifest_case(KERNEL, VARIANT, f"{VARIANT} (ours) B{B} H{Hq}/{Hk} S{S}",
                         "fmha fwd bf16 d128", 4.0 * B * Hq * S * S * D, nbytes, "bf16", **args)


def cases(full: bool = True):
    if not full:
        return [fmha_case(1, 2, 1, 512)]
    return [fmha_case(B, Hq, Hk, S) for B, Hq, Hk, S, *_ in FMHA_PUBLISHED]

"""Memory checks the ops make before a launch: an output that overlaps an input, or itself.

A kernel reads inputs while other workgroups write the output; an output sharing bytes
with an input is a race on a GPU (and a wrong answer in the emulator), an output whose
elements share bytes (a stride 0) is written by several workgroups at once. Both are
refused before anything runs. Byte ranges are compared, so two views that interleave
without sharing an element are refused too: the check is conservative.
"""
from __future__ import annotations

import torch


def extent(t: torch.Tensor) -> int:
    """Bytes from t.data_ptr() to one past the last byte of its last element (0 if empty)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True unless the elements provably occupy distinct memory: with the dims of size > 1
    ordered by stride, each stride reaches past everything the smaller ones span. (A few
    exotic layouts without overlap fail this test too; they are refused as well.)"""
    reach = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride < reach:
            return True
        reach += (size - 1) * stride
    return False


def refuse_internal_overlap(op_name: str, name: str, t: torch.Tensor) -> None:
    if has_internal_overlap(t):
        raise ValueError(f"{op_name}: '{name}' has elements sharing memory (shape {tuple(t.shape)}, strides "
                         f"{t.stride()}); an output needs one location per element")


def refuse_overlap(op_name: str, out_name: str, input_name: str) -> None:
    """The error for an output whose bytes meet an input's (or an earlier output's)."""
    raise ValueError(f"{op_name}: '{out_name}' overlaps the memory of '{input_name}'; the kernel would read "
                     f"what it has already overwritten. Pass a separate output tensor")

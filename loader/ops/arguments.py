"""Argument checks shared by the ops: each error names the op and the argument."""
from __future__ import annotations

import torch


def fail(op: str, kind: type[Exception], message: str):
    raise kind(f"{op}: {message}")


def tensor(op: str, name: str, value, rank: int | None = None, what: str = "") -> torch.Tensor:
    """`value` itself, once it is a torch.Tensor (of rank `rank` when given; `what` says what
    it holds)."""
    said = f" ({what})" if what else ""
    if not isinstance(value, torch.Tensor):
        fail(op, TypeError, f"'{name}' must be a torch.Tensor{said}, got {type(value).__name__}")
    if rank is not None and value.dim() != rank:
        fail(op, ValueError, f"'{name}' must have rank {rank}{said}, got shape {tuple(value.shape)}")
    return value

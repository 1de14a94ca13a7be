"""The `gfxasm run` registry: how each kernel is exercised against its reference.

A kernel's module registers a factory with @run_case that makes fresh inputs (outputs
poisoned beforehand) and the expected outputs (RunCase). It lives below both the ops and
the CLI, so an op registers its cases without importing the command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from .manifest import Variant


@dataclass
class RunCase:
    """One run of a kernel: its arguments (outputs poisoned beforehand) and the reference."""
    args: dict[str, Any]
    expected: dict[str, torch.Tensor]      # the value every output argument must have afterwards
    atol: float
    rtol: float
    note: str = ""                         # shape or other detail worth printing


CaseFactory = Callable[["Variant", torch.Generator], RunCase]
RUN_CASES: dict[str, CaseFactory] = {}


def run_case(kernel_name: str) -> Callable[[CaseFactory], CaseFactory]:
    """Register the `gfxasm run` case factory of a kernel (by its manifest name)."""
    def register(factory: CaseFactory) -> CaseFactory:
        if kernel_name in RUN_CASES:
            raise ValueError(f"a run case for kernel '{kernel_name}' is already registered "
                             f"({RUN_CASES[kernel_name].__module__})")
        RUN_CASES[kernel_name] = factory
        return factory
    return register

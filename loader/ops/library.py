"""How an op joins torch.library: `gfxasm::<name>` custom ops with fake kernels, and the
friendly Python function on top.

Each op is two custom ops on one implementation:

    gfxasm::<name>       functional: allocates and returns its outputs
    gfxasm::<name>_out   writes the caller's `out` (declared mutated), returns nothing

(a custom op may not return one of its inputs, so `out=` cannot be the functional op).
Their fake kernels check what metadata can tell (shapes, dtypes, strides) and allocate
outputs, so meta tensors, FakeTensorMode and torch.compile(fullgraph=True) see the
shapes without running anything. The op framework (framework.py) writes each op's schema
from its declaration and registers both ops here with `define`; the Op it gets back is
called positionally, in the schema's order. There is no backward: such a call refuses inputs that require grad
(while grad mode is on) before anything runs, and so does the functional op reached
through torch.ops (a mutating op cannot carry an autograd formula; its `out` simply gets
no grad_fn). The call goes through the dispatcher only when something needs it (tracing,
fake or meta tensors, a dispatch or function mode, functorch, the profiler): a plain
eager call on plain tensors runs the same implementation directly and skips the
dispatcher's host time (bench/host_cost.py measures both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

NAMESPACE = "gfxasm"


@dataclass(frozen=True)
class Op:
    """A registered `gfxasm::` op and the implementation it wraps."""
    name: str
    op: Any                          # torch.library.CustomOpDef; torch.ops.gfxasm.<name> is the same op
    impl: Callable
    arg_names: tuple[str, ...]

    def __call__(self, *args):
        if torch.is_grad_enabled():
            refuse_grad(self.name, self.arg_names, args)
        return (self.op if needs_dispatcher(args) else self.impl)(*args)


def define(name: str, impl: Callable, fake: Callable, schema: str, arg_names: Sequence[str],
           mutates_args: Sequence[str] = ()) -> Op:
    """`gfxasm::<name>` with an explicit schema (the op framework writes it from a Spec);
    `impl` and `fake` take the schema's arguments positionally."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=tuple(mutates_args), schema=schema)
    op.register_fake(fake)
    arg_names = tuple(arg_names)
    if not mutates_args:
        def refuse(ctx, inputs, output) -> None:   # runs only when some input requires grad
            refuse_grad(name, arg_names, inputs)
        op.register_autograd(_no_backward, setup_context=refuse)
    return Op(name, op, impl, arg_names)


def _no_backward(ctx, *grads):
    raise AssertionError("unreachable: setup_context refuses every input that requires grad")


def refuse_grad(op_name: str, names: Sequence[str], values: Sequence) -> None:
    """A clear error instead of a result without grad_fn: these ops have no backward."""
    for name, t in zip(names, values):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(f"{op_name}: '{name}' requires grad, but gfxasm ops have no backward; call it under "
                               f"torch.no_grad() or pass a detached tensor")


def needs_dispatcher(args: tuple) -> bool:
    """Whether a call must go through torch's dispatcher rather than straight to the
    implementation: under torch.compile, a mode, functorch or the profiler, or with tensor
    subclasses (FakeTensor) or meta tensors. Non-tensors go straight to the implementation,
    which names the argument in its error."""
    if torch.compiler.is_compiling():
        return True
    if (torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
            or torch._C._are_functorch_transforms_active() or torch.autograd._profiler_enabled()):
        return True
    return any(isinstance(a, torch.Tensor) and (type(a) is not torch.Tensor or a.is_meta) for a in args)

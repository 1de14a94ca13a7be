"""How an op joins torch.library: `gfxasm::<name>` custom ops with fake kernels, and the
friendly Python function on top.

Each op is two or three custom ops on one implementation:

    gfxasm::<name>       functional: allocates and returns its outputs (and for an op with
                         an optional output, gfxasm::<name>_with_<output> returning it too)
    gfxasm::<name>_out   writes the caller's `out` (declared mutated), returns nothing

(a custom op may not return one of its inputs, so `out=` cannot be the functional op).
Their fake kernels check what metadata can tell (shapes, dtypes, strides) and allocate
outputs, so meta tensors, FakeTensorMode and torch.compile(fullgraph=True) see the
shapes without running anything. The op framework (framework.py) writes each op's schema
from its declaration and registers both ops here with `define`; the Op it gets back is
called positionally, in the schema's order.

Registration is torch.library's low-level form: the schema, one Python kernel under
CompositeExplicitAutograd (every backend) and the fake. `torch.library.custom_op` would
add Python kernels at the autograd and ADInplaceOrView keys that every call passes
through, each re-boxing all the arguments: 20-170 us per call of host time here
(bench/host_cost.py), more than the op's own checks. What those kernels did is done
in the one kernel instead: there is no backward, so a call with an input that requires
grad (while grad mode is on) is refused before anything runs — through torch.ops too —
and an `_out` op bumps its outputs' version counters, as an in-place torch op does.
The call goes through the dispatcher only when something needs it (tracing, fake or
meta tensors, a dispatch or function mode, functorch, the profiler): a plain eager call
on plain tensors runs the same kernel directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

NAMESPACE = "gfxasm"


_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


@dataclass(frozen=True)
class Op:
    """A registered `gfxasm::` op and its implementation."""
    name: str
    op: Any                          # torch.ops.gfxasm.<name>.default
    impl: Callable                   # the op's implementation (the kernel adds grad refusal and version bumps)
    tensors: tuple[tuple[int, str], ...]    # (position, argument name) where the schema takes Tensor or Tensor?
    mutated: tuple[int, ...] = ()            # the positions of the arguments it writes (an `_out` op's outputs)

    def __post_init__(self):
        # Tests over the schema's tensor positions, each written out as one expression (a
        # loop over the positions cost ~1 us a call more). direct()'s: every argument there
        # None, a plain non-meta tensor or no tensor at all (the implementation names it),
        # and the same with no tensor requiring grad (one pass for a call in grad mode).
        # The dispatched kernel's: whether one requires grad, where the dispatcher has
        # already held each argument there to a Tensor or None.
        plain, plain_no_grad = (" and ".join(f"((t := a[{i}]) is None or (type(t) is T and not t.is_meta{extra}) or "
                                             f"not isinstance(t, T))" for i, _ in self.tensors) or "True"
                                for extra in ("", " and not t.requires_grad"))
        grad = " or ".join(f"((t := a[{i}]) is not None and t.requires_grad)" for i, _ in self.tensors) or "False"
        for name, text in (("_plain", plain), ("_plain_no_grad", plain_no_grad), ("_any_grad", grad)):
            object.__setattr__(self, name, eval(f"lambda a: {text}", {"T": torch.Tensor}))   # noqa: S307 (our text)

    def __call__(self, *args):
        return self.run_direct(args) if self.direct(args) else self.op(*args)

    def direct(self, args: tuple) -> bool:
        """Whether a call with the schema's arguments `args` (those up to its last tensor
        suffice) may skip the dispatcher and run the implementation directly: not under
        torch.compile, a mode, functorch or the profiler, and no tensor subclass (FakeTensor)
        or meta tensor at the schema's tensor positions. Anything else there goes straight to
        the implementation, which names the argument in its error. When so, an input that
        requires grad has been refused as the kernel refuses it."""
        if _in_mode():
            return False
        if not torch.is_grad_enabled():
            return self._plain(args)
        if self._plain_no_grad(args):
            return True
        if not self._plain(args):
            return False
        refuse_grad_inputs(self.name, self.tensors, args)      # (one requires grad: refused)
        return True

    def run_direct(self, args: tuple):
        """The implementation on `args` after `direct(args)` said so: the kernel's work less
        the grad refusal `direct` made."""
        result = self.impl(*args)
        if self.mutated:
            bump_versions(self.mutated, args)
        return result


def define(name: str, impl: Callable, fake: Callable, schema: str, mutates_args: Sequence[str] = ()) -> Op:
    """`gfxasm::<name>` with an explicit schema (the op framework writes it from a Spec);
    `impl` and `fake` take the schema's arguments positionally."""
    _LIBRARY.define(name + schema)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    arguments = op._schema.arguments
    tensors = tuple((i, a.name) for i, a in enumerate(arguments) if _is_tensor(a.type))
    mutated = tuple(i for i, a in enumerate(arguments) if a.name in mutates_args)
    registered = Op(name, op, impl, tensors, mutated)

    def kernel(*args):
        if torch.is_grad_enabled() and registered._any_grad(args):
            refuse_grad_inputs(name, tensors, args)
        result = impl(*args)
        if mutated:
            bump_versions(mutated, args)
        return result

    _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return registered


def bump_versions(mutated: tuple[int, ...], args: tuple) -> None:
    """An in-place torch op's version-counter bump of the written arguments (positions
    `mutated` of `args`; not empty: an `_out` op always writes, and the other callers test)."""
    torch._C._increment_version([args[i] for i in mutated if args[i] is not None])


def _is_tensor(schema_type) -> bool:
    """Tensor or Tensor? (the only tensor-holding types the ops declare)."""
    if isinstance(schema_type, torch.OptionalType):
        schema_type = schema_type.getElementType()
    return isinstance(schema_type, torch.TensorType)


def refuse_grad_inputs(op_name: str, tensors: Sequence[tuple[int, str]], args: tuple) -> None:
    """In grad mode, refuse the first tensor at the schema's tensor positions `tensors`
    ((position, name)) that requires grad. A non-tensor there passes: the op names it."""
    if torch.is_grad_enabled():
        for i, arg_name in tensors:
            if isinstance(args[i], torch.Tensor) and args[i].requires_grad:
                refuse_grad(op_name, arg_name)


def refuse_grad(op_name: str, arg_name: str) -> None:
    """A clear error instead of a result without grad_fn: these ops have no backward."""
    raise RuntimeError(f"{op_name}: '{arg_name}' requires grad, but gfxasm ops have no backward; call it under "
                       f"torch.no_grad() or pass a detached tensor")


def _in_mode() -> bool:
    """Under torch.compile, a dispatch or function mode, functorch or the profiler."""
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active()
            or torch.autograd._profiler_enabled())

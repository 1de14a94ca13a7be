"""The op framework: an op is a declaration, the framework does the rest.

An op module declares one `Spec`: its parameters (names and torch schema types), its
outputs, and three functions of its own —

    check(call)            everything the arguments can tell: metadata always, tensor data
                           where `call.data` (real tensors; never in a fake). Returns the
                           checked call (any object the op likes) or raises an error that
                           names the op and the argument.
    allocate(call, names)  fresh outputs, a dict holding those of `names` (the functional
                           form's outputs; in the out form, the optional ones asked for).
                           It may run before `check` on the raw arguments, so it reads only
                           what it checks itself.
    plan(checked, call)    the launches (`Plan`): prepared kernels, the tensors the plan
                           owns, and how a call's tensors map onto kernel arguments
                           (`plan(checked, call, data)` for an op with a `data_key`:
                           the value it keeps that plan for, read once).

From that the framework builds, once, for every op:

    gfxasm::<name>         functional: allocates and returns its required outputs
    gfxasm::<name>_with_<output>
                           the same returning the optional output too (an op declares
                           at most one): two ops instead of a `return_<output>` flag, so
                           no call allocates a placeholder for an output not asked for
                           and the dispatcher boxes one argument and one result fewer
    gfxasm::<name>_out     writes the caller's outputs (declared mutated), returns nothing
    their fake kernels     `check` on metadata, then `allocate`: a traced call is
                           validated exactly like an eager one
    grad refusal           (library.py) — these ops have no backward
    the Python call        `Op.__call__(*params, out=None, return_<output>=False)`, which
                           the op module wraps in a function with its own signature and
                           docstring
    one launch cache       keyed by the tensors' layouts (shape, strides, dtype, device)
                           and the other arguments' types and values, bounded (the oldest
                           entry goes first): a repeated call skips `check`, `plan` and
                           `allocate` (its fresh outputs are made as its layout's first
                           call made them) and only rechecks what the data can change
                           (pointers, the op's `recheck`); an op whose launches depend on
                           tensor data declares that data (`Spec.data_key`, read on every
                           call) and keeps a plan per value of it; a repeated call
                           (eager or through torch.ops, `out=` or not) whose plan has no
                           `bind` goes from its positional arguments straight to the
                           checks and the launch, without a dict or a Call
                           (Op._run_cached; the functional form's call written out per
                           layout, Op._fresh_function)
    the eager shortcut     a plain eager call (no mode, plain tensors) runs the op without
                           torch's dispatcher (library.Op.direct), `out=` calls too, and
                           without a Call or dict where its layout was seen before
    device, alignment and  every tensor of a call (index tensors and outputs included) on
    overlap refusals       one device; declared pointer alignments; an output may not
                           overlap an input or another output, nor itself, except the one
                           input it may alias exactly (`Output.may_alias`)

Errors are raised before anything is launched and read "<op>: '<argument>' ...".
"""
from __future__ import annotations

import functools
import math
import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..gridexpr import cdiv
from ..launcher import BACKEND_ENV, PreparedLaunch
from . import arguments, library
from .aliasing import extent, refuse_internal_overlap, refuse_overlap

_NONE = frozenset()
MAX_CACHED_CALLS = 4096                 # a bound on memory for callers that never repeat a layout


@dataclass(frozen=True)
class Param:
    """One argument of the op, in schema order. `type` is its torch schema type ("Tensor",
    "Tensor?", "bool", "int?", "float?", "ScalarType", "str", ...). `align`: the byte
    alignment its data pointer needs (checked on every call)."""
    name: str
    type: str
    align: int = 1

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class Output:
    """One output. `optional`: produced only on request (`return_<name>`; at most one per op:
    the functional torch op `<op>_with_<name>` returns it); `may_alias`: the
    input it may be exactly (same address, shape, strides, dtype) because the kernel reads
    that input's element before writing the output's; `align` as for Param."""
    name: str
    optional: bool = False
    may_alias: str | None = None
    align: int = 1


@dataclass
class Plan:
    """A checked call's launches. `launches` run in order; each takes its pointer arguments
    by kernel-argument name. Without `bind`: the call's argument or output of that name
    (`rename`: kernel argument -> the call's name where they differ), where the call has
    none or passed None the plan's own tensor in `fixed` (placeholders, tables), and for a
    name in `scratch` (kernel argument -> (shape, dtype)) fresh memory every call
    (concurrent calls of a layout must not share it): the plan's scratch buffers are carved
    from one allocation a call (`_Planned.launch`), uninitialised, or all zero when a name
    is in `zeroed` (so keep a plan with `zeroed` to small scratch). This form is read
    positionally from a cached call's arguments, without a dict per call. `bind(call)`:
    the op's own mapping instead (by name, over `fixed`), for tensors a call derives from
    its arguments.
    `recheck(call)` repeats the data checks a cached call still needs; `empty` is what a
    call with nothing to launch does to its outputs (e.g. O = 0, LSE = -inf)."""
    launches: tuple[PreparedLaunch, ...] = ()
    fixed: dict[str, torch.Tensor] = field(default_factory=dict)
    rename: dict[str, str] = field(default_factory=dict)
    scratch: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)
    zeroed: frozenset[str] = frozenset()
    bind: Callable[["Call"], dict] | None = None
    recheck: Callable[["Call"], None] | None = None
    empty: Callable[["Call"], None] | None = None


class Call:
    """One call: its arguments and outputs by name (`call.q`, `call.out`; an output the
    call did not ask for is None), `call.data` (whether tensor contents may be read) and
    the op's name for errors (`call.fail`, `call.tensor`). The values dict is the
    instance's own __dict__, so reading an argument is a plain attribute lookup (this is
    on every call's path)."""
    __slots__ = ("op", "data", "__dict__")

    def __init__(self, op: str, values: dict, data: bool):
        self.op, self.data = op, data
        self.__dict__ = values

    @property
    def values(self) -> dict:
        return self.__dict__

    def fail(self, kind: type[Exception], message: str):
        arguments.fail(self.op, kind, message)

    def tensor(self, name: str, rank: int | None = None, what: str = "") -> torch.Tensor:
        return arguments.tensor(self.op, name, self.values[name], rank, what)


@dataclass(frozen=True)
class Spec:
    """An op's declaration (module docstring). `out_after`: the parameter the outputs follow
    in the `_out` schema (None: after the last); `out_form`: whether there is an `_out` op;
    `data_key` (parameter, read): where the launches depend on tensor data beyond what
    `check` reads (a grid read from an index tensor), the parameter holding it and the
    function giving the value, `read(tensor, checked)` (`checked`: what `check` returned for
    the call's layout, so a value the layout's metadata settles needs no read), called on
    every call after the plan's `recheck`: a layout's plans are kept per value of it."""
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    check: Callable[[Call], Any]
    allocate: Callable[[Call, frozenset], dict]
    plan: Callable[[Any, Call], Plan]
    out_after: str | None = None
    out_form: bool = True
    data_key: tuple[str, Callable[[torch.Tensor, Any], Any]] | None = None


# Where each scratch buffer starts in a call's one scratch allocation: as aligned as an
# allocation of its own on the GPU (torch's caching allocator rounds blocks to 512 bytes).
SCRATCH_ALIGN = 512


def _scratch_spans(scratch: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> tuple[dict[str, tuple[int, int]], int]:
    """Each scratch buffer's (byte offset, byte count) in one allocation, in declaration
    order, and the allocation's size in bytes."""
    spans, at = {}, 0
    for name, (shape, dtype) in scratch.items():
        nbytes = math.prod(shape) * dtype.itemsize
        spans[name] = (at, nbytes)
        at += cdiv(nbytes, SCRATCH_ALIGN) * SCRATCH_ALIGN
    return spans, at


class _Planned:
    """A plan and each of its launches' pointer arguments: by name for a plan with `bind`,
    else a function of the call's arguments (the `_out` form's order, `Op._out_order`) and
    its scratch allocation giving them (`_pointer_function`; the launches carve the scratch
    buffers from it, `PreparedLaunch.spans`), and one giving their addresses from the
    call's addresses and the scratch's (`_address_function`): a tensor several launches or
    kernel arguments share has its data_ptr read once a call."""
    __slots__ = ("plan", "launches", "scratch", "device")

    def __init__(self, plan: Plan, at: dict[str, int]):
        self.plan = plan
        self.device = plan.launches[0].device if plan.launches else None
        if plan.bind is not None:
            self.launches = tuple((launch, tuple(name for name, _, _ in launch.pointers)) for launch in plan.launches)
            return
        spans, nbytes = _scratch_spans(plan.scratch)
        # one allocation a call (an allocation costs ~2-4 us of host time; the scratch
        # tensors took one each before), or None without scratch
        self.scratch = None
        if spans:
            # (the cheapest forms, timeit: torch.zeros parses an int size faster than a tuple)
            bytes_on = dict(dtype=torch.uint8, device=self.device)
            self.scratch = (functools.partial(torch.zeros, nbytes, **bytes_on) if plan.zeroed & spans.keys()
                            else functools.partial(torch.empty_strided, (nbytes,), (1,), **bytes_on))
        self.launches = []
        for launch in plan.launches:
            sources = tuple((at.get(plan.rename.get(name, name)), plan.fixed.get(name), name in spans)
                            for name, _, _ in launch.pointers)
            if spans.keys() & {name for name, _, _ in launch.pointers}:
                launch = replace(launch, spans=tuple(spans.get(name) for name, _, _ in launch.pointers))
            self.launches.append((launch, _pointer_function(sources), _address_function(sources)))

    def launch(self, args, addresses: tuple) -> None:
        """Run the launches of a plan without `bind` on a call's arguments `args` (the
        `_out` form's order; `addresses` theirs, `Op._addresses`), with this call's own
        scratch allocation (shared by its launches)."""
        scratch = None if self.scratch is None else self.scratch()
        at = None if scratch is None else scratch.data_ptr()
        for launch, pointers, pointer_addresses in self.launches:
            launch.launch_at(pointers(args, scratch), pointer_addresses(addresses, at))


def _pointer_function(sources: tuple) -> Callable[[tuple, torch.Tensor | None], tuple]:
    """A launch's pointer arguments from a call's arguments `a` and its scratch allocation
    `s`, per source (the position of the call's argument or None, the plan's tensor where
    that argument is None or absent, whether it is a scratch buffer): the scratch allocation
    (the launch carves the buffer from it), else the call's argument, else the plan's
    tensor. Written out as one expression (as `_key_function`): the general loop over the
    sources cost ~1-2 us a launch more."""
    fixed, parts = [], []
    for at, tensor, carved in sources:
        if carved:
            parts.append("s")
        elif at is None or tensor is not None:
            fixed.append(tensor)
            f = f"f[{len(fixed) - 1}]"
            parts.append(f if at is None else f"{f} if a[{at}] is None else a[{at}]")
        else:
            parts.append(f"a[{at}]")                  # (None where the call passes None: a null pointer)
    return eval(f"lambda a, s: ({''.join(f'({p}), ' for p in parts)})", {"f": tuple(fixed)})   # noqa: S307 (our text)


def _address_function(sources: tuple) -> Callable[[tuple, int | None], tuple]:
    """What `_pointer_function(sources)` gives, as addresses: from the call's arguments'
    addresses `a` (`Op._addresses`: None for a None) and the scratch allocation's `s`. A
    plan's own tensor is the plan's for its life, so its address is read once, here."""
    parts = []
    for at, tensor, carved in sources:
        fixed = None if tensor is None else tensor.data_ptr()
        parts.append("s" if carved else repr(fixed) if at is None else
                     f"a[{at}]" if fixed is None else f"{fixed} if a[{at}] is None else a[{at}]")
    return eval(f"lambda a, s: ({''.join(f'({p}), ' for p in parts)})")   # noqa: S307 (our text)


def _address_reader(tensors: tuple[bool, ...]) -> Callable[[tuple], tuple]:
    """A call's addresses from its arguments `a` (the `_out` form's order; `tensors`: which
    positions the schema holds a tensor at): each tensor's data_ptr(), None for a None or a
    non-tensor argument. One expression, as `_key_function`."""
    parts = [f"None if (t := a[{i}]) is None else t.data_ptr()" if is_tensor else "None"
             for i, is_tensor in enumerate(tensors)]
    return eval(f"lambda a: ({''.join(f'({p}), ' for p in parts)})")   # noqa: S307 (our text)


class _Cached:
    """A call layout seen before: what `check` returned, the byte extents of its tensors,
    how to allocate the outputs of a call whose outputs the framework allocated (`fresh`:
    name, shape, strides, dtype, device; `allocate` reads only the parameters, which the
    key holds), the data checks a repeated call still needs (`recheck`) and its plan, or
    for an op with a `data_key` its plans by that key (`by_data`), its pointer checks
    (`pointers`, made by the first launch) and, for a layout whose plans bind positionally,
    what `Op._launch_direct` launches from the arguments (`direct`: the layout's one plan,
    or for an op with a data_key `by_data`, whose plans it picks by the call's data), and
    for a functional layout among those its call written out (`run_fresh`,
    `Op._fresh_function`)."""
    __slots__ = ("checked", "extents", "fresh", "recheck", "planned", "by_data", "pointers", "direct", "run_fresh")

    def __init__(self, checked, extents: dict[str, int], fresh: tuple):
        self.checked, self.extents, self.fresh = checked, extents, fresh
        self.recheck, self.planned, self.by_data, self.pointers, self.direct = None, None, {}, None, None
        self.run_fresh = None


class _PointerChecks:
    """A call layout's alignment and overlap checks, worked out once from what the layout
    fixes (which tensors are None or empty, their byte extents, whether an output is the
    same view as the input it may alias), so a call only reads its data pointers and
    compares integers. `read`: the positions (in the `_out` form's argument order) of the
    tensors whose address a check needs, in the order the other two index them; `aligned`:
    (index, name, alignment); `pairs`: (output's index, its extent, the index of an input or
    earlier output, that one's extent, whether the two may be one tensor when their
    addresses are equal, the output's name, the other's). `passes(addresses)`: whether a
    call of those addresses (`Op._addresses`, each tensor's read once a call for these
    checks and the launches) passes them all, written out as one expression (as
    `_key_function`; a loop over them
    cost ~1-2 us a call more): a call that fails goes through them in order for the error
    (`Op._check_pointers`)."""
    __slots__ = ("read", "aligned", "pairs", "passes")

    def __init__(self, aligned: tuple, pairs: tuple, position: dict[str, int]):
        names = tuple(dict.fromkeys([name for name, _ in aligned] + [n for p in pairs for n in (p[0], p[2])]))
        self.read = tuple(position[name] for name in names)
        at = {name: i for i, name in enumerate(names)}
        self.aligned = tuple((at[name], name, align) for name, align in aligned)
        self.pairs = tuple((at[out], out_size, at[name], size, may_alias, out, name)
                           for out, out_size, name, size, may_alias in pairs)
        tests = [f"p{i} % {align} == 0" for i, _, align in self.aligned]
        tests += [f"not (p{i} < p{j} + {size} and p{j} < p{i} + {out_size}{f' and p{j} != p{i}' if may_alias else ''})"
                  for i, out_size, j, size, may_alias, _, _ in self.pairs]
        reads = "".join(f"(p{k} := a[{at}]), " for k, at in enumerate(self.read))
        self.passes = eval(f"lambda a: ({reads}) and {' and '.join(tests)}" if tests else "lambda a: True")  # noqa: S307


class Op:
    """A declared op: both torch ops, their fakes, and the call path with its cache."""

    def __init__(self, spec: Spec):
        taken = {n for n in dir(Call) if not n.startswith("__")} & {p.name for p in (*spec.params, *spec.outputs)}
        if taken:
            raise ValueError(f"{spec.name}: argument names {sorted(taken)} are Call attributes")
        optional = [o.optional for o in spec.outputs]
        if optional != sorted(optional):            # False < True
            raise ValueError(f"{spec.name}: the required outputs come before the optional ones")
        if sum(optional) > 1:
            raise ValueError(f"{spec.name}: at most one optional output (one `_with_` functional op serves it)")
        self.spec = spec
        self.name = spec.name
        self.required = tuple(o for o in spec.outputs if not o.optional)
        self.optional = tuple(o for o in spec.outputs if o.optional)
        self._param_names = tuple(p.name for p in spec.params)
        self._output_names = tuple(o.name for o in spec.outputs)
        self._required_names = frozenset(o.name for o in self.required)
        self._flag_name = f"return_{self.optional[0].name}" if self.optional else None
        tensors = [p.name for p in spec.params if p.is_tensor]
        self._aligned = tuple((p.name, p.align) for p in (*spec.params, *spec.outputs) if p.align > 1)
        self._aligned_params = tuple((p.name, p.align) for p in spec.params if p.align > 1)
        # each output against the tensor arguments and the outputs before it
        self._overlaps = tuple((o.name, o.may_alias, tuple(tensors) + tuple(x.name for x in spec.outputs[:i]))
                               for i, o in enumerate(spec.outputs))
        self._fresh_key = _key_function(spec.params)
        # (an output as Tensor?: check_metadata's calls may leave the required ones None)
        self._out_key = _key_function(tuple(Param(p.name, "Tensor?") if p.name in self._output_names else p
                                            for p in self._out_params()))
        self._cache: dict[tuple, _Cached] = {}         # insertion order: the oldest is dropped first
        self._metadata_checked: dict[tuple, bool] = {}  # check_metadata's layouts, likewise
        self._lock = threading.Lock()
        self.functional = library.define(spec.name, self._functional, self._functional_fake,
                                         self._functional_schema(self.required))
        # the functional op that also returns the optional output, and what it is asked for
        self.functional_with = None
        self._all_optional = frozenset(o.name for o in self.optional)
        if self.optional:
            self.functional_with = library.define(f"{spec.name}_with_{self.optional[0].name}", self._functional_with,
                                                  self._functional_with_fake, self._functional_schema(spec.outputs))
        self._out_order = tuple(p.name for p in self._out_params())
        self._out_position = {name: i for i, name in enumerate(self._out_order)}
        self._addresses = _address_reader(tuple(p.is_tensor for p in self._out_params()))
        self._out_at = self._out_order.index(self._output_names[0])     # where the outputs sit in it
        self._data_at = None if spec.data_key is None else self._out_position[spec.data_key[0]]
        self._no_optional = (None,) * len(self.optional)
        self.out_op = None
        if spec.out_form:
            self.out_op = library.define(f"{spec.name}_out", self._out, self._out_fake,
                                         self._out_schema(), mutates_args=self._output_names)

    # ---------------------------------------------------------------- schemas

    def _out_params(self) -> list[Param]:
        outs = [Param(o.name, "Tensor", o.align) for o in self.spec.outputs]
        params = list(self.spec.params)
        at = len(params) if self.spec.out_after is None else \
            [p.name for p in params].index(self.spec.out_after) + 1
        return params[:at] + outs + params[at:]

    def _functional_schema(self, outputs: tuple[Output, ...]) -> str:
        args = ", ".join(f"{p.type} {p.name}" for p in self.spec.params)
        return f"({args}) -> ({', '.join('Tensor' for _ in outputs)})" if len(outputs) > 1 else f"({args}) -> Tensor"

    def _out_schema(self) -> str:
        aliases = {o.name: f"Tensor({chr(ord('a') + i)}!){'?' if o.optional else ''}"
                   for i, o in enumerate(self.spec.outputs)}
        args = [f"{aliases.get(p.name, p.type)} {p.name}" for p in self._out_params()]
        return f"({', '.join(args)}) -> ()"

    # ---------------------------------------------------------------- the Python call

    def __call__(self, *params, out=None, **flags):
        """Run the op: `params` in declaration order; `out` the caller's required output (a
        tensor when the op has one, a tuple otherwise); `return_<name>` asks for an optional
        output. Returns the one required output alone, else the tuple of required outputs,
        followed by each optional output asked for."""
        wanted = self._wanted(flags) if flags else _NONE
        if out is None:
            if self.functional.direct(params):        # plain eager tensors: no dispatcher
                return self._fresh(params, wanted)
            return self.functional_with(*params) if wanted else self.functional(*params)
        if self.out_op is None:
            raise TypeError(f"{self.name}: takes no 'out' argument")
        given = (out,) if len(self.required) == 1 else self._given_outputs(out)
        at = self._out_at
        if not wanted:
            args = (*params[:at], *given, *self._no_optional, *params[at:])
            if len(params) == len(self._param_names) and self.out_op.direct(args):
                self._out_keyed(args, self._out_key(args, None))     # (the _out op's work, no dispatcher)
                library.bump_versions(self.out_op.mutated, args)
            else:
                self.out_op(*args)
            return given[0] if len(given) == 1 else tuple(given)
        fresh = self.spec.allocate(Call(self.name, dict(zip(self._param_names, params)), True), wanted)
        self.out_op(*params[:at], *given, *[fresh.get(o.name) for o in self.optional], *params[at:])
        return (*given, *[fresh[o.name] for o in self.optional if o.name in wanted])

    def _returned(self, outputs: dict, wanted: frozenset):
        """What a functional call returns (the Python call's and the functional torch ops'),
        from its outputs by name: the required ones, then each optional one asked for
        (`wanted`); a single one alone."""
        picked = [outputs[o.name] for o in self.required] + [outputs[o.name] for o in self.optional
                                                             if o.name in wanted]
        return picked[0] if len(picked) == 1 else tuple(picked)

    def _wanted(self, flags: dict) -> frozenset:
        """The optional output asked for by the Python call's keywords `flags` (its own dict):
        `return_<name>`, a bool, the only keyword it takes besides `out`."""
        flag = flags.pop(self._flag_name, False)
        if flags:
            raise TypeError(f"{self.name}: unexpected keyword argument '{next(iter(flags))}'")
        if flag is False:
            return _NONE
        if flag is not True:
            arguments.fail(self.name, TypeError, f"'{self._flag_name}' must be a bool, got {type(flag).__name__}")
        return self._all_optional

    def _given_outputs(self, out) -> tuple:
        names = ", ".join(o.name for o in self.required)
        if not isinstance(out, (tuple, list)) or len(out) != len(self.required):
            arguments.fail(self.name, TypeError, f"'out' must be a ({names}) tuple or None, got {type(out).__name__}")
        return tuple(out)

    # ---------------------------------------------------------------- the torch ops

    def _functional(self, *args):
        return self._fresh(args, _NONE)

    def _functional_with(self, *args):
        return self._fresh(args, self._all_optional)

    def _functional_fake(self, *args):
        return self._fake(args, _NONE)

    def _functional_with_fake(self, *args):
        return self._fake(args, self._all_optional)

    def _fake(self, args: tuple, wanted: frozenset):
        """A functional op's fake on its arguments `args`, returning the required outputs
        and the optional ones in `wanted`: the metadata checks, then `allocate`."""
        values = dict(zip(self._param_names, args))
        self._check_new(Call(self.name, {**values, **dict.fromkeys(self._output_names)}, False))
        return self._returned(self.spec.allocate(Call(self.name, values, False), self._required_names | wanted), wanted)

    def _out(self, *args) -> None:
        self._out_keyed(args, self._out_key(args, None))

    def _out_keyed(self, args: tuple, key: tuple | None) -> None:
        """The out form's call on `args` of cache `key`: positionally where its layout allows
        (`_run_cached`; a cached layout had every required output given), else checked and
        run the general way (`_run`)."""
        if self._run_cached(args, key):
            return
        values = dict(zip(self._out_order, args))
        for o in self.required:
            if values[o.name] is None:
                arguments.fail(self.name, TypeError, f"'{o.name}' must be a torch.Tensor, got NoneType")
        self._run(Call(self.name, values, True), key)

    def _out_fake(self, *args) -> None:
        self._check_new(Call(self.name, dict(zip(self._out_order, args)), False))

    # ---------------------------------------------------------------- checks and launch

    def _check_new(self, call: Call):
        """The checks of a call not seen before: one device, the op's own, outputs with one
        location per element."""
        self._check_devices(call)
        checked = self.spec.check(call)
        for o in self.spec.outputs:
            t = call.values[o.name]
            if isinstance(t, torch.Tensor):
                refuse_internal_overlap(self.name, o.name, t)
        return checked

    def _check_devices(self, call: Call) -> None:
        """Every tensor of the call on one device (the first tensor argument's)."""
        named = [(name, t) for name, t in call.values.items() if isinstance(t, torch.Tensor)]
        if not named:
            return
        first, device = named[0][0], named[0][1].device
        for name, t in named[1:]:
            if t.device != device:
                arguments.fail(self.name, ValueError, f"'{name}' must be on {first}'s device ({device}), got {t.device}")
        if call.data and device.type not in ("cpu", "cuda"):
            arguments.fail(self.name, ValueError,
                           f"tensors must be on the CPU (emulator) or a ROCm gfx950 GPU, got {device}")

    def _lookup(self, key: tuple | None) -> _Cached | None:
        return _get(self._cache, key)

    def _store(self, cache: dict, key, value) -> None:
        """`cache[key] = value`, the oldest entries dropped past MAX_CACHED_CALLS (a None key,
        a call without one, is not kept)."""
        if key is None:
            return
        with self._lock:
            try:
                cache[key] = value
            except TypeError:              # (unhashable: never looked up either)
                return
            while len(cache) > MAX_CACHED_CALLS:
                del cache[next(iter(cache))]

    def check_metadata(self, values: dict) -> None:
        """`check` on a call's metadata alone (`data` False: no tensor contents read), once
        per layout: for a caller that must refuse a call before it launches something else
        first (batch_prefill's FP8 query pre-pass). `values`: the `_out` form's arguments by
        name."""
        key = self._out_key(tuple(values[name] for name in self._out_order), None)
        if _get(self._metadata_checked, key):
            return
        self.spec.check(Call(self.name, values, False))
        self._store(self._metadata_checked, key, True)

    def _plan_new(self, call: Call, fresh: tuple = ()) -> tuple[_Cached, _Planned]:
        """Check a call layout not seen before and plan it (its data read once, for an op
        with a data_key)."""
        checked = self._check_new(call)
        cached = _Cached(checked, {name: extent(t) for name, t in call.values.items() if isinstance(t, torch.Tensor)},
                         fresh)
        planned = self._planned(cached, call)
        cached.recheck = planned.plan.recheck
        return cached, planned

    def _planned(self, cached: _Cached, call: Call) -> _Planned:
        """The plan of a checked call: the layout's one, or (data_key) the one for its data."""
        if self.spec.data_key is None:
            if cached.planned is None:
                cached.planned = _Planned(self.spec.plan(cached.checked, call), self._out_position)
            return cached.planned
        name, read = self.spec.data_key
        return self._planned_for(cached, call, read(call.values[name], cached.checked))

    def _planned_for(self, cached: _Cached, call: Call, data) -> _Planned:
        """The plan of a checked call of an op with a data_key whose data is `data`."""
        planned = cached.by_data.get(data)
        if planned is None:
            planned = _Planned(self.spec.plan(cached.checked, call, data), self._out_position)
            self._store(cached.by_data, data, planned)
        return planned

    def _fresh(self, params: tuple, wanted: frozenset):
        """The functional form's call on `params` (`wanted`: the optional outputs asked for),
        its cache key read once; returns what `_returned` gives. A layout launched before
        with a positional plan runs its own written-out call (`_Cached.run_fresh`), any
        other call the general way (`_run_fresh`)."""
        key = self._fresh_key(params, wanted)
        cached = self._direct(key)
        if cached is not None:
            return cached.run_fresh(params)
        made = dict(zip(self._param_names, params))
        self._run_fresh(params, made, wanted, key)
        return self._returned(made, wanted)

    def _run_fresh(self, params: tuple, values: dict, wanted: frozenset, key: tuple | None) -> None:
        """The functional form: allocate the required outputs and the optional ones in
        `wanted` into `values` (the parameters `params` by name; None for the other outputs),
        check (or find the plan of) the call of cache `key` and launch it. A layout seen
        before allocates its outputs as its first call did."""
        call = Call(self.name, values, True)
        cached = self._lookup(key)
        if cached is None:
            outs = self.spec.allocate(call, self._required_names | wanted)
            for name in self._output_names:
                values[name] = outs.get(name)
            cached, planned = self._plan_new(call, tuple((name, tuple(t.shape), t.stride(), t.dtype, t.device)
                                                         for name, t in outs.items()))
            self._store(self._cache, key, cached)
        else:
            for name in self._output_names:
                values[name] = None
            for name, shape, strides, dtype, device in cached.fresh:
                values[name] = torch.empty_strided(shape, strides, dtype=dtype, device=device)
            if cached.recheck is not None:
                cached.recheck(call)
            planned = self._planned(cached, call)
        self._launch(call, cached, planned, fresh=True)
        self._remember_direct(cached, planned)

    def _run(self, call: Call, key: tuple | None) -> None:
        """The out form: check (or find the plan of) a call writing the caller's outputs (its
        cache `key`) and launch it."""
        cached = self._lookup(key)
        if cached is None:
            cached, planned = self._plan_new(call)
            self._store(self._cache, key, cached)
        else:
            if cached.recheck is not None:
                cached.recheck(call)
            planned = self._planned(cached, call)
        self._launch(call, cached, planned, fresh=False)
        self._remember_direct(cached, planned)

    def _remember_direct(self, cached: _Cached, planned: _Planned) -> None:
        """Let a layout's later calls launch straight from their arguments where its plan
        binds positionally (no bind): `_Cached.direct` is that plan, or for an op with a
        data_key the layout's plans by data (a layout fixes how they bind)."""
        if planned.plan.launches and planned.plan.bind is None:
            cached.direct = planned if self._data_at is None else cached.by_data
            if cached.fresh and cached.run_fresh is None:
                cached.run_fresh = self._fresh_function(cached)

    def _fresh_function(self, cached: _Cached) -> Callable[[tuple], Any]:
        """A functional layout's call on its parameters `p` once its plans launch
        positionally: its outputs allocated as its first call made them (`_Cached.fresh`),
        `_launch_direct` on the `_out` form's arguments, and the outputs `_returned` gives
        (the key fixes which were asked for). Written out once per layout (as `_key_function`):
        the general form's dict of outputs and its picking cost ~3 us a call more (timeit)."""
        env = {"E": torch.empty_strided, "launch": self._launch_direct, "cached": cached}
        lines, made = ["def run(p):"], {}
        for i, (name, shape, strides, dtype, device) in enumerate(cached.fresh):
            made[name] = f"o{i}"
            env[f"d{i}"], env[f"v{i}"] = dtype, device
            lines.append(f"    o{i} = E({tuple(shape)!r}, {tuple(strides)!r}, dtype=d{i}, device=v{i})")
        at, count = self._out_at, len(self._param_names)
        args = [*(f"p[{i}]" for i in range(at)), *(made.get(name, "None") for name in self._output_names),
                *(f"p[{i}]" for i in range(at, count))]
        lines.append(f"    launch(cached, ({', '.join(args)},), True)")
        returned = self._returned(made, frozenset(made))         # (the outputs' variable names)
        lines.append(f"    return {returned if isinstance(returned, str) else '(' + ', '.join(returned) + ')'}")
        exec("\n".join(lines), env)   # noqa: S102 (our own text)
        return env["run"]

    def _direct(self, key: tuple | None) -> _Cached | None:
        """The cached layout of `key` where its calls launch positionally, else None."""
        cached = _get(self._cache, key)
        return cached if cached is not None and cached.direct is not None else None

    def _run_cached(self, args: tuple, key: tuple | None) -> bool:
        """The out form's call on `args` (the `_out` op's arguments in order, the required
        outputs given) of cache `key` where its layout was launched before with a positional
        plan (`_Cached.direct`): `_launch_direct`, straight from the arguments. False, having
        done nothing, for any other call (it goes the general way)."""
        cached = self._direct(key)
        if cached is None:
            return False
        self._launch_direct(cached, args, fresh=False)
        return True

    def _launch_direct(self, cached: _Cached, args: tuple, fresh: bool) -> None:
        """A cached layout's call on `args` (the `_out` form's order): what `_run`/`_run_fresh`
        and `_launch` do for it — the data recheck, the data key's read (its plan: a value
        not launched positionally before goes on the general way from there), the pointer
        checks, the launch. `fresh` as for `_launch`."""
        call = None
        if cached.recheck is not None:              # (a Call only for an op that rechecks data)
            call = Call(self.name, dict(zip(self._out_order, args)), True)
            cached.recheck(call)
        planned = cached.direct
        if self._data_at is not None:
            data = self.spec.data_key[1](args[self._data_at], cached.checked)
            planned = planned.get(data)
            if planned is None or planned.plan.bind is not None or not planned.plan.launches:
                call = call or Call(self.name, dict(zip(self._out_order, args)), True)
                planned = self._planned_for(cached, call, data)
                self._launch(call, cached, planned, fresh)
                self._remember_direct(cached, planned)
                return
        addresses = self._addresses(args)
        self._check_pointers(addresses, cached.pointers)
        planned.launch(args, addresses)

    def _launch(self, call: Call, cached: _Cached, planned: _Planned, fresh: bool) -> None:
        """Launch a call's plan (`planned`). `fresh`: the outputs are the framework's own new
        tensors, which meet no input and are aligned."""
        plan = planned.plan
        if not plan.launches:
            if plan.empty is not None:
                plan.empty(call)
            return
        values = call.values
        if cached.pointers is None:
            cached.pointers = self._pointer_checks(values, cached.extents, fresh)
        args = [values[name] for name in self._out_order]
        addresses = self._addresses(args)
        self._check_pointers(addresses, cached.pointers)
        if plan.bind is None:
            planned.launch(args, addresses)
            return
        given = plan.bind(call)
        if plan.fixed:
            given = {**plan.fixed, **given}
        for launch, names in planned.launches:
            launch(*[given[name] for name in names])

    def _check_pointers(self, addresses: tuple, checks: _PointerChecks) -> None:
        """Alignment of declared pointers, and outputs that meet an input or each other
        (`addresses`: the call's, `Op._addresses`)."""
        if checks.passes(addresses):
            return
        address = [addresses[i] for i in checks.read]
        for i, name, align in checks.aligned:
            if address[i] % align:
                self._refuse_misaligned(name, align, address[i])
        for i, out_size, j, size, may_alias, out, name in checks.pairs:
            start, ptr = address[i], address[j]
            if start < ptr + size and ptr < start + out_size and not (may_alias and ptr == start):
                refuse_overlap(self.name, out, name)

    def _pointer_checks(self, values: dict, extents: dict[str, int], fresh: bool) -> _PointerChecks:
        """The pointer checks of a call layout (`values`: its first call's). `fresh`: the
        outputs are the framework's own new tensors, aligned and meeting nothing, so only
        the parameters' alignment is checked. A None or empty tensor is never touched."""
        used = {name for name, size in extents.items() if size}
        aligned = tuple((name, align) for name, align in (self._aligned_params if fresh else self._aligned)
                        if name in used)
        pairs = () if fresh else tuple(
            (out, extents[out], name, extents[name],
             name == may_alias and self._same_view(values[name], values[out]))
            for out, may_alias, before in self._overlaps if out in used
            for name in before if name in used)
        return _PointerChecks(aligned, pairs, self._out_position)

    def _refuse_misaligned(self, name: str, align: int, address: int):
        arguments.fail(self.name, ValueError, f"'{name}' data must be {align}-byte aligned, got address {address:#x}")

    @staticmethod
    def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._metadata_checked.clear()


def _get(cache: dict, key):
    """cache.get(key), None for a None key (a call without one) or an unhashable one (an
    argument of the wrong type: check() says what is wrong)."""
    try:
        return cache.get(key) if key is not None else None
    except TypeError:
        return None


def _key_function(params: tuple[Param, ...]) -> Callable[[tuple, Any], tuple | None]:
    """The cache key of a call from its values of `params`, positionally: `key(values,
    extra)` is (extra, the backend setting, then per parameter its tensor's layout (shape,
    strides, dtype, device; None for a Tensor? that is None) or its other value with its
    type), or None where a value is not what the schema says (a Tensor that is not a tensor:
    such a call is checked, and refused, without the cache). Written out once per op and
    form as one expression: a loop over the parameters cost about twice as much per call
    (~4.5-7 us for fmha's 11, timeit), and this is on every call's path; each value is
    indexed once (`t := v[i]`), not once per attribute."""
    parts = []
    for i, p in enumerate(params):
        rest = "t.stride(), t.dtype, t.device"
        parts.append(f"(t := v[{i}]).shape, {rest}" if p.type == "Tensor"
                     else f"None if (t := v[{i}]) is None else (t.shape, {rest})" if p.is_tensor
                     else f"type(t := v[{i}]), t")
    key = eval(f"lambda v, extra, backend: (extra, backend(), {', '.join(parts)})")   # noqa: S307 (our own text)

    def key_or_none(values: tuple, extra) -> tuple | None:
        try:
            return key(values, extra, _backend_setting)
        except (AttributeError, TypeError):
            return None
    return key_or_none


_ENVIRON_BYTES = getattr(os.environ, "_data", None)      # CPython's os.environ store (bytes keys on POSIX)

# GFXASM_BACKEND as it is now (it enters every cache key: setting it re-plans).
# os.environ.get encodes the key and decodes the value, ~1.5 us a call; reading os.environ's
# own store is what it does underneath, without that (the choice made once, here).
if isinstance(_ENVIRON_BYTES, dict) and os.name == "posix":
    _backend_setting = functools.partial(_ENVIRON_BYTES.get, BACKEND_ENV.encode())
else:
    _backend_setting = functools.partial(os.environ.get, BACKEND_ENV)


def define(spec: Spec) -> Op:
    """Register `spec` as gfxasm::<name> (and <name>_out) and return its Op."""
    return Op(spec)

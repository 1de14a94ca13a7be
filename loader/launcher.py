"""`gfxasm.launch`: run one manifest kernel on torch tensors.

    gfxasm.launch("name", variant="...", q=q, out=out, n=n)   # a kernel of kernels.yaml
    gfxasm.launch(manifest.kernel("name"), ...)                # or of any loaded Manifest

manifest → byte-stride scalars the caller left out, from the tensors (`fill_strides`) →
argument checks (names, dtype, rank, shape, contiguity, device, the size of rank-only
buffers, byte-stride scalars against the tensors' strides) → kernarg bytes → grid from the
manifest's expressions → backend.
Tensors on a ROCm GPU go to HIP (they must be on a gfx950), CPU tensors to the emulator;
GFXASM_BACKEND=hip|emu insists on one and is an error when the tensors do not fit it.
Nothing falls back silently.

`prepare` does all of it but the data pointers and returns a PreparedLaunch, which the ops
cache per argument layout: a call then only writes the pointers into the kernarg template.
This module is `gfxasm.launcher`; the package exports its `launch` as `gfxasm.launch`.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import kernarg
from .backends import emu as emu_backend
from .backends.hip import HipBackend, HipUnavailable
from .manifest import Kernel, Variant, default_manifest

BACKEND_ENV = "GFXASM_BACKEND"
ELEMENT_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
    "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2, "e8m0": torch.float8_e8m0fnu,
    "u8": torch.uint8, "i32": torch.int32, "u32": torch.uint32,
}
MAX_GRID_DIM = 2**32 - 1

hip_backend = HipBackend()


@dataclass(frozen=True, eq=False)
class PreparedLaunch:
    """One launch, checked, but for the data pointers: valid for every call whose tensors
    have the dtypes, shapes, strides and device it was prepared with, and the same scalars."""
    variant: str
    backend: str | None                  # "emu", "hip"; None when the grid is empty
    co_path: Path
    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    template: bytes                      # the kernarg segment with every pointer 0
    pointers: tuple[tuple[str, int, bool], ...]   # (name, kernarg offset, untouched: numel 0)
    device: torch.device
    schedule: str = "serial"             # the manifest kernel's: "concurrent" when workgroups wait on each other
    # Per pointer, in manifest order: (byte offset, byte count) where the tensor passed for
    # it is an allocation several buffers are carved from (an op's per-call scratch: one
    # allocation instead of one per buffer), else None; () for none. The kernarg gets the
    # tensor's address plus the offset; the emulator can address only those bytes.
    spans: tuple[tuple[int, int] | None, ...] = ()

    def __post_init__(self):
        offsets = [span and span[0] for span in self.spans] or [None] * len(self.pointers)
        object.__setattr__(self, "_segment", _segment_function(self.template, self.pointers, offsets, "t[{}].data_ptr()"))
        object.__setattr__(self, "_segment_at", _segment_function(self.template, self.pointers, offsets, "t[{}]"))
        object.__setattr__(self, "_buffers", _buffers_function(self.spans))

    def __call__(self, *tensors: torch.Tensor | None):
        """Launch on the pointer arguments, in manifest order. None stands for a buffer the
        kernel does not touch with these arguments (its `numel` is 0): a null pointer."""
        if self.backend is None:
            return None
        try:
            segment = self._segment(tensors)
        except AttributeError:                  # (None.data_ptr: a None where the kernel touches the buffer)
            self._refuse_none_touched(tensors)
            raise
        return self._run(segment, tensors)

    def launch_at(self, tensors: tuple, addresses: tuple):
        """`self(*tensors)` where the caller has read the tensors' addresses already
        (`addresses`, in the same order: each one's data_ptr(), None for a None), as a caller
        whose launches share tensors does once for all of them."""
        if self.backend is None:
            return None
        try:
            segment = self._segment_at(addresses)
        except struct.error:                    # (a None address where the kernel touches the buffer)
            self._refuse_none_touched(tensors)
            raise
        return self._run(segment, tensors)

    def _run(self, segment: bytes, tensors: tuple):
        """The launch on its kernarg `segment` (`tensors`: the pointer arguments, whose
        memory the emulator maps)."""
        if self.backend == "emu":
            return emu_backend.launch(self.co_path, self.symbol, self.grid, self.block, segment,
                                      self._buffers(tensors), self.schedule)
        hip_backend.launch(self.co_path, self.symbol, self.grid, self.block, segment, self.device.index or 0,
                           current_stream(self.device))
        return None

    def _refuse_none_touched(self, tensors: tuple) -> None:
        """An error for a None among `tensors` where the kernel touches the buffer (a None
        stands for a null pointer only where it does not)."""
        for (name, _, untouched), tensor in zip(self.pointers, tensors):
            if tensor is None and not untouched:
                raise ValueError(f"{self.variant}: argument '{name}' is None, but the kernel touches it")


def _segment_function(template: bytes, pointers: tuple, carved: list, address: str) -> Callable[[tuple], bytes]:
    """The kernarg segment of a launch from its pointer arguments `t` (manifest order): the
    template's bytes with each one's address at its offset (`address` formatted with the
    argument's index: `t[{}].data_ptr()` for tensors, `t[{}]` for addresses read already),
    plus `carved[i]` where that is not None: a buffer carved from the tensor at that byte
    offset; 0 for a None where the kernel does not touch the buffer, an AttributeError
    (tensors) or struct.error (addresses) for a None elsewhere. Written out as one struct
    pack of the template's pieces and the addresses: a bytearray with a pack per run of
    pointers and a copy to bytes cost ~1 us a launch more."""
    fmt, parts, pieces, at = ["<"], [], [], 0
    for offset, i, untouched in sorted((offset, i, untouched) for i, (_, offset, untouched) in enumerate(pointers)):
        if offset > at:
            fmt.append(f"{offset - at}s")
            parts.append(f"c[{len(pieces)}]")
            pieces.append(template[at:offset])
        fmt.append("Q")
        at_i = address.format(i) if carved[i] is None else f"({address.format(i)} + {carved[i]})"
        parts.append(f"(0 if t[{i}] is None else {at_i})" if untouched else at_i)
        at = offset + 8
    if at < len(template):
        fmt.append(f"{len(template) - at}s")
        parts.append(f"c[{len(pieces)}]")
        pieces.append(template[at:])
    namespace = {"pack": struct.Struct("".join(fmt)).pack, "c": tuple(pieces)}
    return eval(f"lambda t: pack({', '.join(parts)})", namespace)   # noqa: S307 (our own text)


def _buffers_function(spans: tuple) -> Callable[[tuple], list]:
    """The emulator's buffers from a launch's pointer arguments `t`: each tensor but the
    None ones, and for a carved buffer (`spans`) its bytes alone, (tensor, offset, count),
    so an access past them is out of bounds as it would be past a buffer of its own. A
    carved buffer of no bytes is not touched and not registered."""
    if not any(spans):
        return lambda t: [x for x in t if x is not None]
    parts = [f"(t[{i}], {span[0]}, {span[1]})" if span else f"t[{i}]" for i, span in enumerate(spans)
             if span is None or span[1]]
    return eval(f"lambda t: [x for x in ({''.join(p + ', ' for p in parts)}) if x is not None]")   # noqa: S307


def launch(kernel: str | Kernel, /, variant: str | None = None, **args: Any):
    """Run `kernel` (a name in kernels.yaml, or a manifest Kernel) on the given arguments.

    Returns the emulator's LaunchResult on CPU tensors; on a GPU the launch is queued on
    torch's current stream and None is returned. A grid with a zero dimension (an empty
    problem) launches nothing.
    """
    chosen = (kernel if isinstance(kernel, Kernel) else default_manifest().kernel(kernel)).variant(variant)
    return prepare(chosen, args)(*(args[a.name] for a in chosen.args if a.type.is_pointer))


def prepare(chosen: Variant, args: dict[str, Any]) -> PreparedLaunch:
    """Check every argument of `chosen` and build its launch, but for the data pointers."""
    args = fill_strides(chosen, args)
    check_argument_names(chosen, args)
    device, sizes = check_tensors(chosen, args)
    values = {a.name: 0 if a.type.is_pointer else args[a.name] for a in chosen.args}
    template = kernarg.pack(chosen.args, chosen.kernarg_size, values)
    bind_scalars(chosen, args, sizes)
    check_strides(chosen, args)
    needed = check_buffer_sizes(chosen, args, sizes)
    grid = launch_grid(chosen, sizes)
    backend = None
    if 0 not in grid:
        backend = choose_backend(device)   # before the .co check: a wrong device is the more useful error
        if not chosen.co_path.is_file():
            raise FileNotFoundError(f"{chosen.co_path} is not built: {chosen.kernel.manifest.build_hint}")
    pointers = tuple((a.name, a.offset, needed.get(a.name) == 0) for a in chosen.args if a.type.is_pointer)
    return PreparedLaunch(chosen.name, backend, chosen.co_path, chosen.kernel.symbol, grid, chosen.kernel.workgroup,
                          template, pointers, device, chosen.kernel.schedule)


def fill_strides(variant: Variant, args: dict[str, Any]) -> dict[str, Any]:
    """`args` plus every byte-stride scalar a pointer argument's `strides:` names that the
    caller did not pass: tensor.stride(dim) * element size. A dim of size 1 is never stepped
    along and its torch stride can be anything (a view's, an expand's, 0): it gets the bytes
    of one slice of the dims after it ((size - 1) * stride summed over them, plus one
    element), so a kernel that bounds a range by count x stride covers the slice it reads.
    An empty tensor is never touched: 0. A scalar the caller passes is kept (check_strides
    checks it)."""
    filled = None
    for arg in (a for a in variant.args if a.strides is not None):
        tensor = args.get(arg.name)
        if not isinstance(tensor, torch.Tensor):
            continue                        # check_tensors names what is wrong
        for axis, name in enumerate(arg.strides):
            if not isinstance(name, str) or name in (filled or args):
                continue
            if filled is None:
                filled = dict(args)
            filled[name] = _byte_stride(tensor, axis)
    return args if filled is None else filled


def _byte_stride(tensor: torch.Tensor, axis: int) -> int:
    """The byte stride the kernel steps dim `axis` of `tensor` by (fill_strides)."""
    element = tensor.element_size()
    if tensor.numel() == 0:
        return 0
    if tensor.shape[axis] > 1:
        return tensor.stride(axis) * element
    later = range(axis + 1, tensor.dim())
    return (sum((tensor.shape[d] - 1) * tensor.stride(d) for d in later) + 1) * element


def check_argument_names(variant: Variant, args: dict[str, Any]) -> None:
    expected = [a.name for a in variant.args]
    missing = [a for a in variant.args if a.name not in args]
    if missing:
        raise TypeError(f"{variant.name}: missing argument{'s' * (len(missing) > 1)} "
                        f"{'; '.join(a.describe() for a in missing)}")
    unexpected = sorted(set(args) - set(expected))
    if unexpected:
        raise TypeError(f"{variant.name}: unexpected argument{'s' * (len(unexpected) > 1)} "
                        f"{', '.join(unexpected)}; it takes {', '.join(expected)}")


def check_tensors(variant: Variant, args: dict[str, Any]) -> tuple[torch.device, dict[str, int]]:
    """Check every pointer argument; return the tensors' device and the shape names' sizes."""
    device, device_arg = torch.device("cpu"), None
    sizes: dict[str, int] = {}
    bound_by: dict[str, str] = {}
    for arg in (a for a in variant.args if a.type.is_pointer):
        value, where = args[arg.name], f"{variant.name}: argument '{arg.name}' ({arg.type.name})"
        dtype = ELEMENT_DTYPES[arg.type.pointee]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{where}: expected a torch.Tensor of dtype {dtype}, got {type(value).__name__}")
        if value.dtype != dtype:
            raise TypeError(f"{where}: expected dtype {dtype}, got {value.dtype}")
        if arg.rank is not None and value.dim() != arg.rank:
            wanted = f"[{', '.join(map(str, arg.shape))}]" if arg.shape is not None else f"rank {arg.rank}"
            raise ValueError(f"{where}: expected rank {arg.rank} ({wanted}), got shape {tuple(value.shape)}")
        if arg.contiguous and not value.is_contiguous():
            raise ValueError(f"{where}: expected a contiguous tensor, got strides {value.stride()}")
        if device_arg is None:
            device, device_arg = value.device, arg.name
        elif value.device != device:
            raise ValueError(f"{where}: on {value.device}, but '{device_arg}' is on {device}")
        for axis, (dim, size) in enumerate(zip(arg.shape or (), value.shape)):
            here = f"{arg.name}.shape[{axis}]"
            if isinstance(dim, int) and size != dim:
                raise ValueError(f"{where}: {here} must be {dim}, got {size}")
            if isinstance(dim, str):
                if dim in sizes and sizes[dim] != size:
                    raise ValueError(f"{where}: {here} = {size}, but {bound_by[dim]} = {sizes[dim]} "
                                     f"(both are '{dim}')")
                sizes.setdefault(dim, size)
                bound_by.setdefault(dim, here)
    return device, sizes


def bind_scalars(variant: Variant, args: dict[str, Any], sizes: dict[str, int]) -> None:
    """Add integer scalars to `sizes`; one that shares a shape name must equal that size."""
    for arg in (a for a in variant.args if a.type.is_integer):
        value = int(args[arg.name])
        if arg.name in sizes and sizes[arg.name] != value:
            raise ValueError(f"{variant.name}: argument '{arg.name}' = {value}, but the tensors' shape "
                             f"name '{arg.name}' is {sizes[arg.name]}")
        sizes[arg.name] = value


def check_strides(variant: Variant, args: dict[str, Any]) -> None:
    """A tensor's strides equal what the manifest says the kernel steps by: the scalar
    argument named for a dim (bytes), or an exact element stride. Dims of size 0 or 1 are
    never stepped along, and an empty tensor is never touched: those are not checked."""
    for arg in (a for a in variant.args if a.strides is not None):
        tensor = args[arg.name]
        if tensor.numel() == 0:
            continue
        element = tensor.element_size()
        for axis, (given, size, stride) in enumerate(zip(arg.strides, tensor.shape, tensor.stride())):
            if size <= 1:
                continue
            if isinstance(given, int) and stride != given:
                raise ValueError(f"{variant.name}: argument '{arg.name}' must have stride {given} in dim {axis}, "
                                 f"got strides {tensor.stride()}")
            if isinstance(given, str) and int(args[given]) != stride * element:
                raise ValueError(f"{variant.name}: argument '{given}' = {int(args[given])}, but {arg.name}.stride("
                                 f"{axis}) is {stride} elements = {stride * element} bytes")


def check_buffer_sizes(variant: Variant, args: dict[str, Any], sizes: dict[str, int]) -> dict[str, int]:
    """Every buffer with a `numel` expression holds at least that many elements; returns
    the elements each needs with these arguments."""
    needed = {}
    for arg in (a for a in variant.args if a.numel is not None):
        needed[arg.name] = arg.numel.evaluate(sizes)
        if args[arg.name].numel() < needed[arg.name]:
            raise ValueError(f"{variant.name}: argument '{arg.name}' ({arg.type.name}) has {args[arg.name].numel()} "
                             f"elements; with these arguments the kernel touches {needed[arg.name]} "
                             f"(numel '{arg.numel.text}')")
    return needed


def launch_grid(variant: Variant, sizes: dict[str, int]) -> tuple[int, int, int]:
    grid = tuple(expr.evaluate(sizes) for expr in variant.kernel.grid)
    for axis, (expr, value) in enumerate(zip(variant.kernel.grid, grid)):
        if not 0 <= value <= MAX_GRID_DIM:
            raise ValueError(f"{variant.name}: grid[{axis}] = '{expr.text}' = {value} with these arguments; "
                             f"expected 0 to {MAX_GRID_DIM} workgroups")
    return grid


def choose_backend(device: torch.device) -> str:
    forced = os.environ.get(BACKEND_ENV, "")
    if forced not in ("", "hip", "emu"):
        raise ValueError(f"{BACKEND_ENV}={forced!r}: expected 'hip' or 'emu'")
    if device.type == "cpu":
        if forced == "hip":
            raise ValueError(f"{BACKEND_ENV}=hip, but the tensors are on the CPU: move them to the gfx950 "
                             f"or unset {BACKEND_ENV} to run on the emulator")
        return "emu"
    if device.type == "cuda":
        if forced == "emu":
            raise ValueError(f"{BACKEND_ENV}=emu, but the tensors are on {device}: the emulator runs on "
                             f"CPU tensors")
        if torch.version.hip is None:
            raise HipUnavailable(f"no HIP runtime: the tensors are on {device}, but this PyTorch is not a ROCm "
                                 f"build (torch.version.hip is None); gfxasm launches only on AMD gfx950")
        return "hip"
    raise ValueError(f"tensors on {device}: gfxasm runs on CPU tensors (emulator) or on a ROCm gfx950 GPU")


def current_stream(device: torch.device) -> int:
    """torch's current stream on `device`, as the raw handle HIP takes."""
    return torch.cuda.current_stream(device).cuda_stream

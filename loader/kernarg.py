"""Kernel argument types, their layout in the kernarg segment, and packing.

One table (`ARG_TYPES`) names every type a manifest may use, with its size and how it is
packed. Offsets follow natural alignment (each argument aligned to its own size), and the
segment size is rounded up to 8 bytes, the `.kernarg_segment_align` we declare — the same
rule the AMDGPU ABI applies, so nothing is ever padded by hand.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

KERNARG_SEGMENT_ALIGN = 8


@dataclass(frozen=True)
class ArgType:
    name: str                 # as written in the manifest: "*bf16", "u32", ...
    size: int                 # bytes in the kernarg segment (also the alignment)
    struct_format: str        # little-endian struct code used to pack a value
    pointee: str | None = None  # element type of a pointer ("bf16"); None for scalars

    @property
    def is_pointer(self) -> bool:
        return self.pointee is not None

    @property
    def is_integer(self) -> bool:
        return not self.is_pointer and self.struct_format in "IiQ"


def _pointer(pointee: str) -> ArgType:
    return ArgType(f"*{pointee}", 8, "Q", pointee)


ARG_TYPES: dict[str, ArgType] = {t.name: t for t in (
    *(_pointer(p) for p in ("bf16", "f16", "f32", "fp8e4m3", "fp8e5m2", "e8m0", "u8", "i32", "u32")),
    ArgType("u32", 4, "I"),
    ArgType("i32", 4, "i"),
    ArgType("f32", 4, "f"),
    ArgType("u64", 8, "Q"),
)}

_INTEGER_RANGES = {"I": (0, 2**32 - 1), "i": (-2**31, 2**31 - 1), "Q": (0, 2**64 - 1)}


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def layout(types: Iterable[ArgType]) -> tuple[list[int], int]:
    """Offsets of consecutive arguments under natural alignment, and the segment size."""
    offsets, end = [], 0
    for arg_type in types:
        offset = align_up(end, arg_type.size)
        offsets.append(offset)
        end = offset + arg_type.size
    return offsets, align_up(end, KERNARG_SEGMENT_ALIGN)


class PackableArg(Protocol):
    name: str
    type: ArgType
    offset: int


def _checked_value(arg: PackableArg, value: object) -> int | float:
    what = f"argument '{arg.name}' ({arg.type.name})"
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a number, got bool {value}")
    if arg.type.struct_format == "f":
        if not isinstance(value, (int, float)):
            raise TypeError(f"{what}: expected a float, got {type(value).__name__}")
        try:
            struct.pack("<f", value)
        except OverflowError:
            raise ValueError(f"{what}: {value} does not fit in f32") from None
        return float(value)
    try:
        integer = value.__index__()  # type: ignore[union-attr]  # ints and numpy integers
    except AttributeError:
        raise TypeError(f"{what}: expected an integer, got {type(value).__name__}") from None
    low, high = _INTEGER_RANGES[arg.type.struct_format]
    if not low <= integer <= high:
        raise ValueError(f"{what}: {integer} is outside [{low}, {high}]")
    return integer


def pack(args: Iterable[PackableArg], size: int, values: Mapping[str, object]) -> bytes:
    """Kernarg segment bytes: each argument's value at its offset, zeros elsewhere.

    Pointer values are device addresses (ints). Every value is range-checked for its type.
    """
    segment = bytearray(size)
    for arg in args:
        struct.pack_into("<" + arg.type.struct_format, segment, arg.offset,
                         _checked_value(arg, values[arg.name]))
    return bytes(segment)

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from gfxasm.kernarg import ARG_TYPES, layout, pack


def args_of(*types: str):
    offsets, size = layout(ARG_TYPES[t] for t in types)
    names = [f"a{i}" for i in range(len(types))]
    return [SimpleNamespace(name=n, type=ARG_TYPES[t], offset=o) for n, t, o in zip(names, types, offsets)], size


def test_every_type_packs_into_its_declared_size():
    for arg_type in ARG_TYPES.values():
        assert struct.calcsize("<" + arg_type.struct_format) == arg_type.size
    pointers = {t for t in ARG_TYPES if t.startswith("*")}
    assert pointers == {"*bf16", "*f16", "*f32", "*fp8e4m3", "*fp8e5m2", "*e8m0", "*u8", "*i32", "*u32"}
    assert set(ARG_TYPES) - pointers == {"u32", "i32", "f32", "u64"}


@pytest.mark.parametrize("types, offsets, size", [
    ((), [], 0),
    (("u32",), [0], 8),                                  # segment rounded up to 8
    (("u32", "*f32"), [0, 8], 16),                       # the pointer aligns to 8
    (("*f32", "*f32", "*f32", "f32", "u32"), [0, 8, 16, 24, 28], 32),
    (("u32", "u32", "u64", "f32"), [0, 4, 8, 16], 24),
    (("i32", "u64", "i32", "i32", "*bf16"), [0, 8, 16, 20, 24], 32),
])
def test_layout_follows_natural_alignment(types, offsets, size):
    args, got_size = args_of(*types)
    assert [a.offset for a in args] == offsets
    assert got_size == size


def test_pack_places_each_value_at_its_offset():
    args, size = args_of("u32", "*f32", "f32", "i32", "u64")
    values = {"a0": 7, "a1": 0x7F12_3456_7890, "a2": -1.25, "a3": -3, "a4": 2**40 + 5}
    # Built independently with one struct format holding the same padding.
    expected = struct.pack("<I4xQfiQ", 7, 0x7F12_3456_7890, -1.25, -3, 2**40 + 5)
    assert pack(args, size, values) == expected


def test_pack_accepts_numpy_integers_and_python_ints_for_f32():
    args, size = args_of("u32", "f32")
    assert pack(args, size, {"a0": np.uint32(9), "a1": 2}) == struct.pack("<If", 9, 2.0)


@pytest.mark.parametrize("arg_type, value, error, complaint", [
    ("u32", -1, ValueError, r"outside \[0, 4294967295\]"),
    ("u32", 2**32, ValueError, "outside"),
    ("i32", 2**31, ValueError, "outside"),
    ("u64", -1, ValueError, "outside"),
    ("*f32", -8, ValueError, "outside"),
    ("f32", 1e39, ValueError, "does not fit in f32"),
    ("u32", 1.5, TypeError, "expected an integer, got float"),
    ("u32", "3", TypeError, "expected an integer, got str"),
    ("u32", True, TypeError, "got bool"),
    ("f32", "x", TypeError, "expected a float, got str"),
])
def test_pack_refuses_values_outside_the_type(arg_type, value, error, complaint):
    args, size = args_of(arg_type)
    with pytest.raises(error, match=complaint) as raised:
        pack(args, size, {"a0": value})
    assert f"'a0' ({arg_type})" in str(raised.value)

import copy

import pytest

from gfxasm.kernarg import ARG_TYPES
from gfxasm.manifest import DEFAULT_MANIFEST, Manifest, ManifestError

from conftest import write_manifest

VALID = {
    "source": "k.s",
    "workgroup": [256],
    "lds_bytes": 1024,
    "grid": ["cdiv(cols, 256)", "rows"],
    "args": [
        {"name": "x", "type": "*f32", "dir": "in", "shape": ["rows", "cols"]},
        {"name": "out", "type": "*f32", "dir": "out", "rank": 1},
        {"name": "scale", "type": "f32"},
        {"name": "cols", "type": "u32"},
        {"name": "stride", "type": "u64"},
    ],
    "variants": {"k_f32": {"defines": {"MODE": 0}}, "k_bf16": {"defines": {"MODE": 1},
                                                               "types": {"x": "*bf16", "out": "*bf16"}}},
}


def load(tmp_path, kernels, **top):
    (tmp_path / "k.s").write_text("    s_endpgm\n")
    return Manifest.load(write_manifest(tmp_path, kernels, **top))


def test_a_valid_kernel_gets_its_layout_computed(tmp_path):
    manifest = load(tmp_path, {"k": VALID})
    kernel = manifest.kernel("k")
    assert kernel.workgroup == (256, 1, 1)
    assert kernel.symbol == "k" and kernel.float_denorm_mode_32 == 3
    assert [e.text for e in kernel.grid] == ["cdiv(cols, 256)", "rows", "1"]
    f32, bf16 = kernel.variant("k_f32"), kernel.variant("k_bf16")
    # *f32 *f32 f32 u32 u64: 0 8 16 20 24, 32 bytes
    assert [(a.name, a.offset) for a in f32.args] == [("x", 0), ("out", 8), ("scale", 16), ("cols", 20),
                                                     ("stride", 24)]
    assert f32.kernarg_size == 32
    assert [a.type.name for a in bf16.args] == ["*bf16", "*bf16", "f32", "u32", "u64"]
    assert f32.arg("x").rank == 2 and f32.arg("out").rank == 1 and f32.arg("out").shape is None
    assert bf16.defines == {"MODE": 1}
    assert f32.co_path == tmp_path / "build" / "k_f32.co"


def test_variants_default_to_one_named_after_the_kernel(tmp_path):
    spec = {k: v for k, v in VALID.items() if k != "variants"}
    kernel = load(tmp_path, {"k": spec}).kernel("k")
    assert list(kernel.variants) == ["k"] and kernel.variant().defines == {}


def test_choosing_a_variant(tmp_path):
    kernel = load(tmp_path, {"k": VALID}).kernel("k")
    with pytest.raises(ValueError, match="has variants k_f32, k_bf16: pass variant="):
        kernel.variant()
    with pytest.raises(ValueError, match="no variant 'k_f16'"):
        kernel.variant("k_f16")


def test_an_empty_manifest_is_valid(tmp_path):
    assert list(load(tmp_path, {}).variants()) == []


def test_the_product_manifest_loads():
    manifest = Manifest.load(DEFAULT_MANIFEST)
    for variant in manifest.variants():
        assert variant.kernel.source.is_file()


def edit(path, value):
    """VALID with the field at `path` (a tuple of keys/indices) set to value, or deleted."""
    spec = copy.deepcopy(VALID)
    *parents, last = path
    target = spec
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return spec


DELETE = object()


def test_strides_name_the_scalars_a_kernel_steps_by(tmp_path):
    spec = copy.deepcopy(VALID)
    spec["args"][0].update(contiguous=False, strides=["stride", 1])
    x = load(tmp_path, {"k": spec}).kernel("k").variant("k_f32").arg("x")
    assert x.strides == ("stride", 1) and x.describe() == "x: *f32 in [rows, cols] strides [stride, 1]"


def test_numel_bounds_a_rank_only_buffer(tmp_path):
    spec = copy.deepcopy(VALID)
    spec["args"][1]["numel"] = "rows * cdiv(cols, 2)"
    out = load(tmp_path, {"k": spec}).kernel("k").variant("k_f32").arg("out")
    assert out.numel.text == "rows * cdiv(cols, 2)" and out.numel.evaluate({"rows": 3, "cols": 5}) == 9
    assert out.describe() == "out: *f32 out (rank 1) numel >= rows * cdiv(cols, 2)"
    spec["args"][1]["contiguous"] = False
    with pytest.raises(ManifestError, match=r"field 'args\[1\] \(out\).numel': numel bounds a contiguous buffer"):
        load(tmp_path, {"k": spec})


@pytest.mark.parametrize("path, value, field, complaint", [
    (("sourse",), "k.s", "sourse", "unknown field"),
    (("source",), DELETE, "source", "required field is missing"),
    (("source",), "missing.s", "source", "does not exist"),
    (("workgroup",), [2048], "workgroup[0]", "outside"),
    (("workgroup",), [64, 64], "workgroup", "exceeds 1024"),
    (("workgroup",), [], "workgroup", "1 to 3 dimensions"),
    (("lds_bytes",), 163844, "lds_bytes", r"outside \[0, 163840\]"),
    (("lds_bytes",), "1k", "lds_bytes", "expected an integer"),
    (("float_denorm_mode_32",), 4, "float_denorm_mode_32", "outside"),
    (("symbol",), "bad symbol", "symbol", "not a valid name"),
    (("grid",), ["cdiv(n, 256)"], "grid[0]", "uses n, which is neither"),
    (("grid",), ["scale"], "grid[0]", "uses scale"),            # f32 scalar
    (("grid",), ["x"], "grid[0]", "uses x"),                    # pointer
    (("grid",), ["2 ** cols"], "grid[0]", "not allowed"),
    (("grid",), ["open('f')"], "grid[0]", "unknown function"),
    (("grid",), [1, 1, 1, 1], "grid", "1 to 3 expressions"),
    (("grid",), [True], "grid[0]", "expected an expression"),
    (("args", 0, "type"), "*f64", "args[0] (x).type", "unknown type '\\*f64'"),
    (("args", 0, "dir"), "sideways", "args[0] (x).dir", "expected one of in, out, inout"),
    (("args", 0, "dir"), DELETE, "args[0] (x).dir", "expected one of"),
    (("args", 2, "dir"), "out", "args[2] (scale).dir", "scalar argument can only be 'in'"),
    (("args", 2, "rank"), 1, "args[2] (scale).rank", "only pointer arguments"),
    (("args", 0, "rank"), 2, "args[0] (x).rank", "either shape or rank"),
    (("args", 0, "shape"), ["rows", 1.5], "args[0] (x).shape[1]", "non-empty string"),
    (("args", 0, "shape"), ["rows", "min"], "args[0] (x).shape[1]", "grid function"),
    (("args", 0, "contiguous"), "yes", "args[0] (x).contiguous", "true or false"),
    (("args", 2, "numel"), "cols", "args[2] (scale).numel", "only pointer arguments"),
    (("args", 0, "numel"), "rows", "args[0] (x).numel", "a shape already gives the size"),
    (("args", 1, "numel"), "rows * depth", "args[1] (out).numel", "uses depth, which is neither"),
    (("args", 1, "numel"), "2 ** cols", "args[1] (out).numel", "not allowed"),
    (("args", 0, "strides"), ["stride"], "args[0] (x).strides", "one entry per dim: expected 2"),
    (("args", 0, "strides"), ["stride", "scale"], "args[0] (x).strides[1]", "'scale' is not an integer scalar"),
    (("args", 0, "strides"), ["stride", "y"], "args[0] (x).strides[1]", "'y' is not an integer scalar"),
    (("args", 0, "strides"), ["stride", -1], "args[0] (x).strides[1]", "outside"),
    (("args", 2, "strides"), ["cols"], "args[2] (scale).strides", "only pointer arguments"),
    (("args", 1, "name"), "x", "args[1] (x).name", "duplicate argument name"),
    (("args", 1, "name"), "variant", "args[1] (variant).name", "reserved"),
    (("args", 1, "name"), "class", "args[1].name", "Python keyword"),
    (("args", 1, "name"), "2out", "args[1].name", "not a valid name"),
    (("args", 1, "nmae"), "out", "args[1].nmae", "unknown field"),
    (("args", 0, "shape"), ["rows", "scale"], "args", "shape name 'scale' is also argument 'scale' of type f32"),
    (("variants", "k_f32", "defines", "MODE"), 1.5, "variants.k_f32.defines.MODE", "expected an integer"),
    (("variants", "k_f32", "defines", "k_x"), 1, "variants.k_f32.defines.k_x", "generated code part"),
    (("variants", "k_f32", "defines", "LDS_BYTES"), 1, "variants.k_f32.defines.LDS_BYTES", "generated"),
    (("variants", "k_f32", "defines", "s_wg_x"), 1, "variants.k_f32.defines.s_wg_x", "generated"),
    (("variants", "k_f32", "types"), {"scale": "f32"}, "variants.k_f32.types.scale", "not a pointer argument"),
    (("variants", "k_f32", "types"), {"y": "*f32"}, "variants.k_f32.types.y", "not a pointer argument"),
    (("variants", "k_f32", "types"), {"x": "u64"}, "variants.k_f32.types.x", "a pointer stays a pointer"),
    (("variants", "k_f32", "types"), {"x": "*f8"}, "variants.k_f32.types.x", "unknown type"),
    (("variants", "k_f32", "flavour"), 1, "variants.k_f32.flavour", "unknown field"),
    (("variants", "bad-name"), {}, "variants.bad-name", "not a valid name"),
])
def test_malformed_kernel_fields_are_named(tmp_path, path, value, field, complaint):
    with pytest.raises(ManifestError, match=complaint) as error:
        load(tmp_path, {"k": edit(path, value)})
    message = str(error.value)
    assert str(tmp_path / "kernels.yaml") in message
    assert "kernel 'k'" in message
    assert f"field '{field}'" in message


def test_a_variant_name_is_unique_across_kernels(tmp_path):
    with pytest.raises(ManifestError, match=r"kernel 'k2': field 'variants.k_f32': .*already used by kernel 'k'"):
        load(tmp_path, {"k": VALID, "k2": VALID})


@pytest.mark.parametrize("top, field, complaint", [
    ({"build_dir": 3}, "build_dir", "non-empty string"),
    ({"include_dirs": "asm"}, "include_dirs", "expected a list"),
    ({"kernel": {}}, "kernel", "unknown field"),
])
def test_malformed_top_level_fields_are_named(tmp_path, top, field, complaint):
    with pytest.raises(ManifestError, match=complaint) as error:
        load(tmp_path, {"k": VALID}, **top)
    assert f"field '{field}'" in str(error.value) and "kernels.yaml" in str(error.value)


def test_a_kernel_name_must_be_an_identifier(tmp_path):
    with pytest.raises(ManifestError, match=r"kernel 'my-kernel': field 'name': 'my-kernel' is not a valid name"):
        load(tmp_path, {"my-kernel": VALID})


def test_missing_kernels_duplicate_keys_and_bad_yaml(tmp_path):
    path = tmp_path / "kernels.yaml"
    (tmp_path / "k.s").write_text("s_endpgm\n")
    path.write_text("build_dir: build\n")
    with pytest.raises(ManifestError, match="field 'kernels': required field is missing"):
        Manifest.load(path)
    path.write_text("kernels:\n  k:\n    source: k.s\n    source: other.s\n")
    with pytest.raises(ManifestError, match=r"kernels.yaml:4: duplicate key 'source'"):
        Manifest.load(path)
    path.write_text("kernels: [unclosed\n")
    with pytest.raises(ManifestError, match="not valid YAML"):
        Manifest.load(path)
    with pytest.raises(ManifestError, match="manifest file not found"):
        Manifest.load(tmp_path / "nothing.yaml")


def test_every_manifest_type_is_in_the_kernarg_vocabulary(fixture_manifest):
    for variant in fixture_manifest.variants():
        for arg in variant.args:
            assert ARG_TYPES[arg.type.name] is arg.type

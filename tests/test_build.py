import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gfxasm import build
from gfxasm.build import BuildError, build_manifest
from gfxasm.check import verify
from gfxasm.codeobj import load_code_object
from gfxasm.manifest import DEFAULT_MANIFEST, REPO_ROOT, Manifest
from gfxasm.toolchain import find_tool

from conftest import STORE_N_KERNEL, STORE_N_SOURCE, write_manifest


def built_kernel(manifest: Manifest, name: str):
    variant = manifest.kernel(name).variant()
    return variant, load_code_object(variant.co_path).kernel(variant.kernel.symbol)


def test_the_product_kernels_build_and_match_the_manifest():
    manifest = Manifest.load(DEFAULT_MANIFEST)
    results = build_manifest(manifest)               # raises on any assembler error or mismatch
    assert [r.variant.name for r in results] == [v.name for v in manifest.variants()]
    assert all(r.co_path.is_file() for r in results)


def test_build_generates_descriptor_and_metadata_from_the_manifest(store_n_manifest):
    manifest = Manifest.load(store_n_manifest)
    [result] = build_manifest(manifest)
    assert result.assembled and result.co_path == store_n_manifest.parent / "build" / "store_n.co"
    variant, info = built_kernel(manifest, "store_n")
    kd, meta = info.descriptor, info.metadata
    assert kd.kernarg_size == 16 == meta[".kernarg_segment_size"]      # *u32 at 0, u32 at 8, rounded to 8
    assert [(a[".name"], a[".offset"], a[".size"], a[".value_kind"]) for a in meta[".args"]] == [
        ("out", 0, 8, "global_buffer"), ("n", 8, 4, "by_value")]
    assert meta[".args"][0][".actual_access"] == "write_only"
    assert kd.float_denorm_mode_32 == 3                 # f32 denormals kept unless the manifest says otherwise
    assert kd.user_sgpr_enabled("kernarg_segment_ptr") and kd.user_sgpr_count == 2
    assert kd.workgroup_id_enabled == (True, True, True) and kd.workitem_id_dims == 1
    assert info.max_workgroup_size == 64 and meta[".reqd_workgroup_size"] == [64, 1, 1]
    assert meta[".wavefront_size"] == 64 and not kd.wavefront_size32
    assert info.lds_bytes == 0
    # The source names v0..v2 and s0..s8.
    assert meta[".vgpr_count"] == 3 and meta[".agpr_count"] == 0 and kd.accum_offset == 4
    assert verify(variant.co_path, variant) == []


def test_manifest_settings_reach_the_descriptor(tmp_path):
    (tmp_path / "store_n.s").write_text(STORE_N_SOURCE)
    spec = {**STORE_N_KERNEL, "float_denorm_mode_32": 0, "lds_bytes": 4096, "workgroup": [16, 4, 2]}
    manifest = Manifest.load(write_manifest(tmp_path, {"store_n": spec}))
    build_manifest(manifest)
    _, info = built_kernel(manifest, "store_n")
    assert info.descriptor.float_denorm_mode_32 == 0
    assert info.lds_bytes == 4096 == info.metadata[".group_segment_fixed_size"]
    assert info.descriptor.workitem_id_dims == 3 and info.max_workgroup_size == 128


def test_agprs_named_by_the_code_are_allocated_after_the_vgprs(tmp_path):
    (tmp_path / "acc.s").write_text("    v_mov_b32 v5, 0\n    v_mfma_f32_16x16x16_bf16 a[0:3], v[0:1], v[2:3], 0\n"
                                    "    v_accvgpr_write_b32 a1, v5\n    s_endpgm\n")
    manifest = Manifest.load(write_manifest(tmp_path, {"acc": {"source": "acc.s", "workgroup": 64,
                                                               "grid": [1], "args": []}}))
    build_manifest(manifest)
    _, info = built_kernel(manifest, "acc")
    # v0..v5 → 6 VGPRs → AGPRs start at 8; a0..a3 → 4 AGPRs; 12 registers in all
    assert info.descriptor.accum_offset == 8
    assert info.metadata[".agpr_count"] == 4 and info.metadata[".vgpr_count"] == 12


def test_only_what_changed_is_rebuilt(store_n_manifest):
    manifest = Manifest.load(store_n_manifest)
    build_manifest(manifest)
    co = manifest.kernel("store_n").variant().co_path
    first = co.stat().st_mtime_ns
    assert [r.assembled for r in build_manifest(manifest)] == [False]
    assert co.stat().st_mtime_ns == first

    source = store_n_manifest.parent / "store_n.s"
    source.write_text(source.read_text() + "; a comment changes the hash\n")
    assert [r.assembled for r in build_manifest(manifest)] == [True]

    data = yaml.safe_load(store_n_manifest.read_text())
    data["kernels"]["store_n"]["lds_bytes"] = 256
    store_n_manifest.write_text(yaml.safe_dump(data))
    assert [r.assembled for r in build_manifest(Manifest.load(store_n_manifest))] == [True]
    assert [r.assembled for r in build_manifest(Manifest.load(store_n_manifest), force=True)] == [True]


def test_a_change_in_an_included_file_rebuilds(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "values.inc").write_text(".set VALUE, 1\n")
    (tmp_path / "k.s").write_text('.include "values.inc"\n    s_mov_b32 s6, VALUE\n    s_endpgm\n')
    path = write_manifest(tmp_path, {"k": {"source": "k.s", "workgroup": 64, "grid": [1], "args": []}},
                          include_dirs=["inc"])
    assert [r.assembled for r in build_manifest(Manifest.load(path))] == [True]
    assert [r.assembled for r in build_manifest(Manifest.load(path))] == [False]
    (tmp_path / "inc" / "values.inc").write_text(".set VALUE, 2\n")
    assert [r.assembled for r in build_manifest(Manifest.load(path))] == [True]


def test_defines_select_code(tmp_path):
    (tmp_path / "k.s").write_text(".if WIDE\n    v_mov_b32 v9, 0\n.endif\n    s_endpgm\n")
    spec = {"source": "k.s", "workgroup": 64, "grid": [1], "args": [],
            "variants": {"narrow": {"defines": {"WIDE": 0}}, "wide": {"defines": {"WIDE": 1}}}}
    manifest = Manifest.load(write_manifest(tmp_path, {"k": spec}))
    build_manifest(manifest)
    counts = {v: load_code_object(manifest.kernel("k").variant(v).co_path).kernel().metadata[".vgpr_count"]
              for v in ("narrow", "wide")}
    assert counts == {"narrow": 1, "wide": 10}


def test_an_assembler_error_names_file_and_line_and_leaves_no_stale_co(store_n_manifest):
    build_manifest(Manifest.load(store_n_manifest))
    source = store_n_manifest.parent / "store_n.s"
    lines = source.read_text().splitlines()
    lines.insert(6, "    v_frobnicate_b32 v1, v2")
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(BuildError) as error:
        build_manifest(Manifest.load(store_n_manifest))
    assert f"{source}:7:" in str(error.value) and "error:" in str(error.value)
    assert not (store_n_manifest.parent / "build" / "store_n.co").exists()


@pytest.mark.parametrize("code", [
    "buffer_load_dword v1, v2, s[8:11], 0 offen offset:4100",
    ".set BIG, 4096\n    buffer_store_dword v1, v2, s[8:11], 0 offen offset:BIG",
    ".macro load_at off\n    buffer_load_dword v1, v2, s[8:11], 0 offen offset:\\off\n.endm\n    load_at 8000",
])
def test_mubuf_offsets_beyond_12_bits_are_refused(tmp_path, code):
    (tmp_path / "k.s").write_text(f"    {code}\n    s_endpgm\n")
    manifest = Manifest.load(write_manifest(tmp_path, {"k": {"source": "k.s", "workgroup": 64,
                                                             "grid": [1], "args": []}}))
    with pytest.raises(BuildError, match="MUBUF immediate offset (4100|4096|8000) exceeds 4095") as error:
        build_manifest(manifest)
    assert str(tmp_path / "k.s") in str(error.value)


def test_the_largest_mubuf_offset_is_accepted(tmp_path):
    (tmp_path / "k.s").write_text("    buffer_load_dword v1, v2, s[8:11], 0 offen offset:4095\n"
                                  "    s_waitcnt vmcnt(0)\n    s_endpgm\n")
    manifest = Manifest.load(write_manifest(tmp_path, {"k": {"source": "k.s", "workgroup": 64,
                                                             "grid": [1], "args": []}}))
    assert [r.assembled for r in build_manifest(manifest)] == [True]


def test_verify_reports_every_difference_from_the_manifest(store_n_manifest):
    build_manifest(Manifest.load(store_n_manifest))
    co = store_n_manifest.parent / "build" / "store_n.co"
    # The same .co judged against a manifest that has since changed (without a rebuild):
    data = yaml.safe_load(store_n_manifest.read_text())
    spec = data["kernels"]["store_n"]
    spec.update(lds_bytes=512, workgroup=[128], float_denorm_mode_32=0)
    spec["args"] = [spec["args"][1], spec["args"][0]]        # n first, then out: offsets change
    store_n_manifest.write_text(yaml.safe_dump(data))
    problems = "\n".join(verify(co, Manifest.load(store_n_manifest).kernel("store_n").variant()))
    for expected in ("LDS bytes: the .co has 0, the manifest says 512",
                     ".max_flat_workgroup_size: the .co has 64, the manifest says 128",
                     "float_denorm_mode_32: the .co has 3, the manifest says 0",
                     "argument names: the .co has ['out', 'n'], the manifest says ['n', 'out']",
                     "argument 'n' offset: the .co has 8, the manifest says 0",
                     "argument 'out' offset: the .co has 0, the manifest says 8"):
        assert expected in problems


def test_verify_reports_a_missing_symbol_and_a_broken_file(store_n_manifest, tmp_path):
    build_manifest(Manifest.load(store_n_manifest))
    co = store_n_manifest.parent / "build" / "store_n.co"
    data = yaml.safe_load(store_n_manifest.read_text())
    data["kernels"]["store_n"]["symbol"] = "other"
    store_n_manifest.write_text(yaml.safe_dump(data))
    variant = Manifest.load(store_n_manifest).kernel("store_n").variant()
    assert verify(co, variant) == [f"{co}: no kernel symbol 'other' (it has store_n)"]
    junk = tmp_path / "junk.co"
    junk.write_bytes(b"not an elf")
    assert "is not an ELF file" in verify(junk, variant)[0]


def test_a_missing_toolchain_is_one_line_saying_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("LLVM_BIN", str(tmp_path))            # a folder without clang
    find_tool.cache_clear()
    try:
        with pytest.raises(BuildError) as error:
            build.ensure_toolchain()
    finally:
        monkeypatch.undo()
        find_tool.cache_clear()
    message = str(error.value)
    assert "\n" not in message and "clang" in message and "LLVM_BIN" in message


@pytest.fixture
def llvm_missing(monkeypatch):
    """A root Debian machine without LLVM, whose commands are recorded instead of run."""
    def not_found(cls):
        raise build.ToolchainError("clang (LLVM >= 20) not found")
    monkeypatch.setattr(build.Toolchain, "find", classmethod(not_found))
    monkeypatch.delenv("LLVM_BIN", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(build.os, "geteuid", lambda: 0)
    commands = []
    monkeypatch.setattr(build.subprocess, "run", lambda command, **kw: commands.append(command)
                        or subprocess.CompletedProcess(command, 0))
    return commands


def test_nothing_is_installed_unless_asked(llvm_missing):
    with pytest.raises(BuildError, match="--install-llvm") as error:
        build.ensure_toolchain()
    assert llvm_missing == [] and "clang" in str(error.value)


def test_install_llvm_runs_apt_get(llvm_missing):
    with pytest.raises(BuildError, match="clang"):      # the recorded apt-get installed nothing
        build.ensure_toolchain(install=True)
    assert llvm_missing == [["apt-get", "update"], ["apt-get", "install", "-y", *build.APT_PACKAGES]]


def test_install_llvm_refuses_when_it_cannot(llvm_missing, monkeypatch):
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    with pytest.raises(BuildError, match="apt-get needs root"):
        build.ensure_toolchain(install=True)
    monkeypatch.setenv("LLVM_BIN", "/nowhere")
    with pytest.raises(BuildError, match="LLVM_BIN is set"):
        build.ensure_toolchain(install=True)
    assert llvm_missing == []


def run_build_sh(*args):
    return subprocess.run(["bash", str(REPO_ROOT / "build.sh"), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, cwd="/", env={**os.environ})


def test_build_sh_builds_and_fails_with_the_assemblers_message(store_n_manifest):
    done = run_build_sh("-m", str(store_n_manifest))
    assert done.returncode == 0, done.stderr
    assert "1 variants (1 assembled, 0 up to date), all match the manifest" in done.stdout
    source = Path(store_n_manifest.parent / "store_n.s")
    source.write_text(source.read_text().replace("s_endpgm", "s_endpgm v1"))
    done = run_build_sh("-m", str(store_n_manifest))
    assert done.returncode != 0
    assert f"{source}:12:" in done.stderr and "error:" in done.stderr


LOAD_KERNARG_ARGS = [{"name": "x", "type": "*f32", "dir": "in", "shape": [4]},
                     {"name": "n", "type": "u32"}, {"name": "m", "type": "u32"}, {"name": "w", "type": "u64"}]


def test_load_kernarg_takes_offset_and_width_from_the_manifest(tmp_path):
    # the generated macro against the loads written out by hand with the manifest's offsets
    # (x 0, n 8, m 12, w 16): the same instruction bytes
    by_macro = "    load_kernarg 8, x\n    load_kernarg 10, n\n    load_kernarg 11, m\n    load_kernarg 12, w\n" \
               "    load_kernarg 16, n, 2\n    s_endpgm\n"
    by_hand = ("    s_load_dwordx2 s[8:9], s[0:1], 0\n    s_load_dword s10, s[0:1], 8\n"
               "    s_load_dword s11, s[0:1], 12\n    s_load_dwordx2 s[12:13], s[0:1], 16\n"
               "    s_load_dwordx2 s[16:17], s[0:1], 8\n    s_endpgm\n")
    texts = []
    for name, source in (("macro", by_macro), ("hand", by_hand)):
        (tmp_path / f"{name}.s").write_text(source)
        manifest = Manifest.load(write_manifest(tmp_path, {name: {"source": f"{name}.s", "workgroup": 64,
                                                                  "grid": [1], "args": LOAD_KERNARG_ARGS}}))
        build_manifest(manifest)
        texts.append(load_code_object(manifest.kernel(name).variant().co_path).text)
    assert texts[0] == texts[1]


@pytest.mark.parametrize("line, message", [
    ("load_kernarg 8, y", "the manifest has no argument y"),
    ("load_kernarg 8, w, 4", "the load reaches past the kernarg segment"),
    ("load_kernarg 8, x, 3", "dwords must be 1, 2, 4, 8 or 16"),
])
def test_load_kernarg_refuses_what_the_manifest_does_not_hold(tmp_path, line, message):
    (tmp_path / "k.s").write_text(f"    {line}\n    s_endpgm\n")
    manifest = Manifest.load(write_manifest(tmp_path, {"k": {"source": "k.s", "workgroup": 64, "grid": [1],
                                                             "args": LOAD_KERNARG_ARGS}}))
    with pytest.raises(BuildError, match=message):
        build_manifest(manifest)


def test_kernel_sources_load_kernargs_only_through_the_manifest():
    # An offset written by hand goes stale when the manifest's layout changes; load_kernarg
    # takes offset and width from the manifest, so no product source addresses the kernarg
    # segment itself.
    sources = sorted((REPO_ROOT / "asm").rglob("*.s")) + sorted((REPO_ROOT / "asm").rglob("*.inc"))
    assert len(sources) > 10
    by_hand = [f"{path.relative_to(REPO_ROOT)}:{number}"
               for path in sources
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if "s[s_kernarg:" in line.split(";")[0]]
    assert by_hand == []

"""The wheel: built from this checkout (`python -m build`), installed into a fresh venv
outside it, used without clang — every kernel through `gfxasm run --all`, each op from
Python against a float64 reference written here, the manifest and code objects found in
the installed package, overrides by GFXASM_MANIFEST / GFXASM_BUILD_DIR, a missing .co
named, `gfxasm bench` without a checkout. pip never touches the network (--no-index,
--no-deps; torch comes from the system site-packages). About a minute."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gfxasm.build import build_manifest
from gfxasm.manifest import REPO_ROOT, Manifest
from gfxasm.toolchain import find_tool

OPS_SCRIPT = r'''
import math, sys
import torch
import gfxasm

assert gfxasm.__file__.startswith(sys.prefix), f"not the venv's gfxasm: {gfxasm.__file__}"
g = torch.Generator().manual_seed(14)


def attention(q, k, v, visible):
    """float64 softmax(q k^T / sqrt(D)) v per head; q [Sq, Hq, D], k/v [Sk, Hk, D]."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def check(name, actual, expected, tol):
    err = (actual.double() - expected).abs().max().item()
    assert err <= tol, f"{name}: max|err| {err} > {tol}"
    print(f"{name} ok {err:.3g}")


# fmha_fwd: causal, GQA 2/1, Sq 5 < Sk 7 (bottom-right aligned mask)
q = torch.randn(1, 5, 2, 128, generator=g).bfloat16()
k = torch.randn(1, 7, 1, 128, generator=g).bfloat16()
v = torch.randn(1, 7, 1, 128, generator=g).bfloat16()
visible = torch.arange(7)[None, :] <= torch.arange(5)[:, None] + 2
check("fmha_fwd", gfxasm.fmha_fwd(q, k, v, causal=True)[0], attention(q[0], k[0], v[0], visible), 2e-2)

# mxfp8_gemm: M 3, N 5, K 64 with random E8M0 scales around 2^0
a = torch.randn(3, 64, generator=g).to(torch.float8_e4m3fn)
b = torch.randn(5, 64, generator=g).to(torch.float8_e4m3fn)
a_scale = torch.randint(122, 132, (3, 2), generator=g, dtype=torch.uint8)
b_scale = torch.randint(122, 132, (5, 2), generator=g, dtype=torch.uint8)
def dequant(x, s):
    return x.double() * torch.exp2(s.double() - 127).repeat_interleave(32, dim=1)
expected = dequant(a, a_scale) @ dequant(b, b_scale).T
check("mxfp8_gemm", gfxasm.mxfp8_gemm(a, a_scale, b, b_scale), expected, 1e-2 * expected.abs().max().item())

# decode_attention: one new token over a contiguous cache of 40 slots, 33 of them valid
q = torch.randn(1, 1, 2, 64, generator=g).bfloat16()
k_cache = torch.randn(1, 40, 1, 64, generator=g).bfloat16()
v_cache = torch.randn(1, 40, 1, 64, generator=g).bfloat16()
out = gfxasm.decode_attention(q, k_cache, v_cache, torch.tensor([33], dtype=torch.int32))
expected = attention(q[0], k_cache[0, :33], v_cache[0, :33], torch.ones(1, 33, dtype=torch.bool))
check("decode_attention", out[0], expected, 2e-2)
'''


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv holding the wheel of this checkout (torch from the system site-packages)."""
    build_manifest(Manifest.load(REPO_ROOT / "kernels.yaml"))     # the wheel takes build/*.co as they are
    work = tmp_path_factory.mktemp("packaging")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(work / "dist"), str(REPO_ROOT)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [wheel] = (work / "dist").glob("gfxasm-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(work / "venv")],
                   check=True)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(work / "venv" / "bin" / "python"), "install",
                           "-q", "--no-deps", "--no-index", "--no-build-isolation", str(wheel)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    (work / "llvm").mkdir()            # LLVM_BIN of the installed commands: no clang, only the emulator's decoder
    (work / "llvm" / "llvm-objdump").symlink_to(find_tool("llvm-objdump"))
    return work / "venv"


def run_installed(venv: Path, cwd: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    """A command of the venv, from `cwd`, with no clang: LLVM_BIN holds only llvm-objdump
    (the emulator's decoder), so any attempt to assemble would fail."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GFXASM_MANIFEST", "GFXASM_BUILD_DIR", "PYTHONPATH")}
    clean.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", LLVM_BIN=str(venv.parent / "llvm"), **env)
    return subprocess.run(command, cwd=cwd, env=clean, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def installed_data(venv: Path) -> Path:
    [data] = venv.glob("lib/python*/site-packages/gfxasm/data")
    return data


def test_the_wheel_carries_the_manifest_and_every_code_object(venv):
    data = installed_data(venv)
    variants = [v.name for v in Manifest.load(data / "kernels.yaml").variants()]
    assert variants and sorted(p.stem for p in (data / "build").glob("*.co")) == sorted(variants)


def test_gfxasm_run_all_from_the_installed_package(venv, tmp_path):
    done = run_installed(venv, tmp_path, "gfxasm", "run", "--all")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    results = [line.split()[1] for line in done.stdout.splitlines()]
    variants = list(Manifest.load(installed_data(venv) / "kernels.yaml").variants())
    assert set(results) == {"ok"} and len(results) >= len(variants)
    assert {line.split()[0] for line in done.stdout.splitlines()} == {v.name for v in variants}


def test_each_op_from_python(venv, tmp_path):
    done = run_installed(venv, tmp_path, "python", "-c", OPS_SCRIPT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[:2] for line in done.stdout.splitlines()] == [
        ["fmha_fwd", "ok"], ["mxfp8_gemm", "ok"], ["decode_attention", "ok"]]


def test_the_installed_package_never_assembles(venv, tmp_path):
    done = run_installed(venv, tmp_path, "gfxasm", "build")     # no clang: it can only verify
    assert done.returncode == 0, done.stderr
    assert "(0 assembled" in done.stdout and str(installed_data(venv) / "kernels.yaml") in done.stdout


def test_build_dir_override_and_a_missing_code_object(venv, tmp_path):
    elsewhere = tmp_path / "co"
    shutil.copytree(installed_data(venv) / "build", elsewhere)
    (elsewhere / "fmha_fwd_d128_bf16.co").unlink()
    done = run_installed(venv, tmp_path, "gfxasm", "run", "fmha_fwd_d128", "--variant", "fmha_fwd_d128_bf16",
                         GFXASM_BUILD_DIR=str(elsewhere))
    assert done.returncode == 1
    assert f"{elsewhere / 'fmha_fwd_d128_bf16.co'}: not found" in done.stderr and "reinstall" in done.stderr


def test_manifest_override(venv, tmp_path):
    fixtures = REPO_ROOT / "tests" / "fixtures" / "kernels.yaml"
    done = run_installed(venv, tmp_path, "gfxasm", "list", GFXASM_MANIFEST=str(fixtures))
    assert done.returncode == 0, done.stderr
    names = {k for k in Manifest.load(fixtures).kernels}
    assert done.stdout.startswith(f"{fixtures}:") and all(f"  {name}: " in done.stdout for name in names)


def test_bench_without_a_checkout_says_so(venv, tmp_path):
    done = run_installed(venv, tmp_path, "gfxasm", "bench", "--small")
    assert done.returncode == 0 and "not in the installed package" in done.stderr, done.stderr


def test_bench_from_a_clone_skips_what_is_missing_and_shows_progress(venv, tmp_path):
    # The installed package runs the clone's bench/ (cwd); without the corpus, bench_conformance is skipped.
    done = run_installed(venv, REPO_ROOT, "gfxasm", "bench", "--small", "--only", "(ours)", "--out",
                         str(tmp_path / "r.json"), "--png", str(tmp_path / "r.png"),
                         GFXASM_CORPUS_DIR=str(tmp_path / "no-corpus"))
    assert done.returncode == 0, done.stderr
    assert "gfxasm bench: skipped bench/bench_conformance.py: the gfx950 corpus" in done.stderr
    assert done.stdout.startswith("[1/1] fmha_fwd_d128_bf16 (ours)") and (tmp_path / "r.json").is_file()

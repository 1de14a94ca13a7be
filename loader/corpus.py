"""The corpus: hardware-proven gfx950 code objects from a pinned public aiter wheel.

`amd-aiter==0.1.7.post2.dev18` on the package index carries 1,220 gfx950 code objects
(`aiter_meta/hsa/gfx950/**`) that AMD ships and runs on MI350X/MI355X, the host code that
launches each (`aiter_meta/csrc/**`) and aiter's tuning tables with MI355X timings
(`aiter/configs/**`). gfxasm treats it as test data fetched by version and hash, like a
data set: nothing of it is committed to this repository.

`fetch()` downloads the wheel with pip (no dependencies), checks its sha256 and extracts
those three trees into the cache (`$GFXASM_CORPUS_DIR`, else `$XDG_CACHE_HOME/gfxasm` or
`~/.cache/gfxasm`). `root()` is where every reader finds it; when it is absent it raises
`CorpusMissing` naming the command that fetches it, never a silent skip.

Extra objects: hardware-built code objects that no wheel the package index serves
carries (`EXTRA_OBJECTS`), pinned by aiter commit and sha256. `gfxasm corpus fetch-extra
NAME` downloads one from GitHub at that commit, or takes a copy (`--file`); the hash is
checked either way. `extra_object()` raises `CorpusMissing` when it is absent, so a test
can skip with that reason (CI reaches the package index, not GitHub).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "amd-aiter"
VERSION = "0.1.7.post2.dev18"
WHEEL = "amd_aiter-0.1.7.post2.dev18-py3-none-any.whl"
SHA256 = "fe139d74438217c35e87e3b961166bac8db2d381eadccb371da2e63615f05a31"
# The parts of the wheel gfxasm reads: code objects (all archs' CSV manifests sit beside
# them), the host launch code, and the tuning tables.
MEMBERS = ("aiter_meta/hsa/", "aiter_meta/csrc/", "aiter/configs/")
GFX950_DIR = "aiter_meta/hsa/gfx950"
FETCH_COMMAND = "gfxasm corpus fetch"
CACHE_ENV = "GFXASM_CORPUS_DIR"
_COMPLETE = ".complete"            # written last: a half-extracted tree is never taken


class CorpusMissing(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ExtraObject:
    commit: str          # ROCm/aiter commit that holds it
    repo_path: str       # its path in that commit
    sha256: str

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/ROCm/aiter/{self.commit}/{self.repo_path}"


# amd-aiter 0.1.7.post2.dev18, the one version the package index serves, predates aiter's
# fmha_v4_fwd family (added by ROCm/aiter e8f438a, "new MHA v4 entrypoint", PR #4627).
EXTRA_OBJECTS = {
    "fmha_v4_fwd/fwd_hd128_mxfp8.co": ExtraObject(
        "e8f438a748d27d5350b9a2d63c8e1cffc2626f52", "hsa/gfx950/fmha_v4_fwd/fwd_hd128_mxfp8.co",
        "30b3da70213c0af12d05780fc2bfd998cda090f9fa1c8f82e378847b5c61d913"),
    # the FP8 forms of fmha_v3_fwd (the wheel carries only its bf16 ones)
    "fmha_v3_fwd/fwd_hd128_fp8.co": ExtraObject(
        "e8f438a748d27d5350b9a2d63c8e1cffc2626f52", "hsa/gfx950/fmha_v3_fwd/fwd_hd128_fp8.co",
        "346fa7479ec25e9a39f6b7f9d1ede30c9d780220e2de3b4b00344e1e966759fe"),
    "fmha_v3_fwd/fwd_hd128_fp8_causal.co": ExtraObject(
        "e8f438a748d27d5350b9a2d63c8e1cffc2626f52", "hsa/gfx950/fmha_v3_fwd/fwd_hd128_fp8_causal.co",
        "ca8f416739558e92a189e733efa77af0a3db00460ed7bed83361b839e39281b3"),
    "fmha_v3_fwd/fwd_hd128_fp8_group.co": ExtraObject(
        "e8f438a748d27d5350b9a2d63c8e1cffc2626f52", "hsa/gfx950/fmha_v3_fwd/fwd_hd128_fp8_group.co",
        "302243017a553d60ee0c5d6fe942e0c1f66363fb8f7eb7a655c64ad9e18f0903"),
    "fmha_v3_fwd/fwd_hd128_fp8_causal_group.co": ExtraObject(
        "e8f438a748d27d5350b9a2d63c8e1cffc2626f52", "hsa/gfx950/fmha_v3_fwd/fwd_hd128_fp8_causal_group.co",
        "a307e6c9096559f88d6cd4509a617559d63ee6e8a187610a8ffa5e0c11c813a1"),
}


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gfxasm"


def _tree() -> Path:
    return cache_dir() / f"{PACKAGE}-{VERSION}"


def root() -> Path:
    """The extracted wheel (holds aiter_meta/ and aiter/configs/)."""
    tree = _tree()
    if not (tree / _COMPLETE).is_file():
        raise CorpusMissing(f"the gfx950 corpus ({PACKAGE}=={VERSION}) is not in {tree}: run "
                            f"`{FETCH_COMMAND}` (downloads a 40 MB wheel with pip, checks its sha256)")
    return tree


def path(relative: str) -> Path:
    """A file of the corpus, e.g. 'aiter_meta/hsa/gfx950/pa/pa_bf16_noquant_gqa8_1tg_4w.co'."""
    p = root() / relative
    if not p.exists():
        raise FileNotFoundError(f"{relative} is not in the corpus {PACKAGE}=={VERSION}")
    return p


def gfx950_code_objects() -> list[Path]:
    return sorted((root() / GFX950_DIR).rglob("*.co"))


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), f"{PACKAGE}=={VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = into / WHEEL
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr.strip()[-2000:]}")
    return wheel


def fetch(wheel: Path | None = None, log=print) -> Path:
    """Make the corpus available (idempotent). `wheel`: a copy already on disk, else pip."""
    tree = _tree()
    if (tree / _COMPLETE).is_file():
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
        if wheel is None:
            log(f"downloading {PACKAGE}=={VERSION} with pip ...")
            wheel = _download(Path(tmp))
        got = sha256_of(Path(wheel))
        if got != SHA256:
            raise RuntimeError(f"{wheel}: sha256 {got} is not the pinned {SHA256}; refusing it")
        staging = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                if member.startswith(MEMBERS) and not member.endswith("/"):
                    z.extract(member, staging)
        (staging / _COMPLETE).write_text(f"{WHEEL} sha256 {SHA256}\n")
        if tree.exists():                       # an earlier, interrupted extraction
            shutil.rmtree(tree)
        staging.rename(tree)
    log(f"corpus ready: {tree} ({len(gfx950_code_objects())} gfx950 code objects)")
    return tree


def _extra_file(name: str) -> Path:
    if name not in EXTRA_OBJECTS:
        raise KeyError(f"{name!r} is not a pinned extra object; known: {sorted(EXTRA_OBJECTS)}")
    return cache_dir() / f"aiter-{EXTRA_OBJECTS[name].commit[:12]}" / name


def extra_object(name: str) -> Path:
    """A pinned extra object (EXTRA_OBJECTS), its sha256 checked."""
    file = _extra_file(name)
    if not file.is_file():
        raise CorpusMissing(f"{name} (ROCm/aiter {EXTRA_OBJECTS[name].commit[:12]}) is not in {file.parent}: "
                            f"run `{FETCH_COMMAND}-extra {name}` (downloads it from GitHub, checks its sha256)")
    got = sha256_of(file)
    if got != EXTRA_OBJECTS[name].sha256:
        raise RuntimeError(f"{file}: sha256 {got} is not the pinned {EXTRA_OBJECTS[name].sha256}")
    return file


def fetch_extra(name: str, copy: Path | None = None, log=print) -> Path:
    """Store a pinned extra object: from `copy`, else downloaded from GitHub at its commit."""
    file = _extra_file(name)
    pin = EXTRA_OBJECTS[name]
    if copy is None:
        import urllib.request
        log(f"downloading {pin.url} ...")
        with urllib.request.urlopen(pin.url, timeout=120) as response:
            data = response.read()
    else:
        data = Path(copy).read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != pin.sha256:
        raise RuntimeError(f"{name}: sha256 {got} is not the pinned {pin.sha256}; refusing it")
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_suffix(".partial")
    partial.write_bytes(data)
    partial.rename(file)
    log(f"stored {file}")
    return file

"""gfxasm.corpus: the pinned aiter wheel is taken only with its sha256, extracted whole or not
at all, and its absence is an error naming the command that fetches it."""
from __future__ import annotations

import hashlib
import zipfile

import pytest

from gfxasm import corpus


def fake_wheel(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_missing_corpus_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path))
    with pytest.raises(corpus.CorpusMissing, match="gfxasm corpus fetch"):
        corpus.root()


def test_wheel_with_another_hash_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path / "cache"))
    wheel = fake_wheel(tmp_path / corpus.WHEEL, {"aiter_meta/hsa/gfx950/x/k.co": b"\x7fELF"})
    with pytest.raises(RuntimeError, match="is not the pinned"):
        corpus.fetch(wheel, log=lambda _: None)
    with pytest.raises(corpus.CorpusMissing):
        corpus.root()


def test_fetch_extracts_only_the_trees_gfxasm_reads(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path / "cache"))
    wheel = fake_wheel(tmp_path / corpus.WHEEL, {
        "aiter_meta/hsa/gfx950/pa/k.co": b"code", "aiter_meta/csrc/launch.cu": b"host",
        "aiter/configs/t.csv": b"a,b", "aiter/ops/other.py": b"not read"})
    monkeypatch.setattr(corpus, "SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    tree = corpus.fetch(wheel, log=lambda _: None)
    assert corpus.root() == tree
    assert corpus.path("aiter_meta/hsa/gfx950/pa/k.co").read_bytes() == b"code"
    assert corpus.gfx950_code_objects() == [tree / "aiter_meta/hsa/gfx950/pa/k.co"]
    assert (tree / "aiter/configs/t.csv").is_file() and not (tree / "aiter/ops").exists()
    with pytest.raises(FileNotFoundError, match="not in the corpus"):
        corpus.path("aiter_meta/hsa/gfx950/pa/absent.co")
    assert corpus.fetch(wheel, log=lambda _: None) == tree           # idempotent


def test_coverage_command_on_a_corpus_family(capsys):
    """The real corpus (needs `gfxasm corpus fetch`): every FMHA-forward object is covered."""
    from gfxasm.corpus_cli import corpus_main
    assert corpus_main(["coverage", "--under", "fmha_v3_fwd", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.startswith("8 / 8 gfx950 code objects")


EXTRA = "fmha_v4_fwd/fwd_hd128_mxfp8.co"


def test_missing_extra_object_names_its_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path))
    with pytest.raises(corpus.CorpusMissing, match=f"gfxasm corpus fetch-extra {EXTRA}"):
        corpus.extra_object(EXTRA)


def test_extra_object_is_taken_only_with_its_pinned_hash(tmp_path, monkeypatch):
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path / "cache"))
    copy = tmp_path / "k.co"
    copy.write_bytes(b"\x7fELF not the pinned object")
    with pytest.raises(RuntimeError, match="is not the pinned"):
        corpus.fetch_extra(EXTRA, copy, log=lambda _: None)
    with pytest.raises(corpus.CorpusMissing):
        corpus.extra_object(EXTRA)
    pin = corpus.EXTRA_OBJECTS[EXTRA]
    monkeypatch.setitem(corpus.EXTRA_OBJECTS, EXTRA, corpus.ExtraObject(
        pin.commit, pin.repo_path, hashlib.sha256(copy.read_bytes()).hexdigest()))
    stored = corpus.fetch_extra(EXTRA, copy, log=lambda _: None)
    assert corpus.extra_object(EXTRA) == stored and stored.read_bytes() == copy.read_bytes()
    stored.write_bytes(b"changed after the fact")
    with pytest.raises(RuntimeError, match="is not the pinned"):
        corpus.extra_object(EXTRA)
    with pytest.raises(KeyError, match="not a pinned extra object"):
        corpus.extra_object("fmha_v4_fwd/absent.co")

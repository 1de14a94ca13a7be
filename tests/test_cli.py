import subprocess
import sys

import pytest
import torch

from gfxasm import cli
from gfxasm.manifest import REPO_ROOT

from conftest import FIXTURES, write_manifest

FIXTURE_MANIFEST = str(FIXTURES / "kernels.yaml")


def gfxasm(capsys, *argv):
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_shows_kernels_variants_and_layouts(capsys, fixture_manifest):
    status, out, _ = gfxasm(capsys, "list", "-m", FIXTURE_MANIFEST)
    assert status == 0
    assert "variant axmb (SUBTRACT_B=1), kernarg 32 B:" in out
    assert "@28   n: u32 in" in out
    assert "@0    x: *f32 in [rows, cols]" in out
    assert "@8    out: *f32 out (rank 1)" in out
    assert "LDS 1024 B, grid [rows, 1, 1]" in out


def test_check_passes_on_built_fixtures_and_fails_on_a_missing_build(capsys, fixture_manifest, store_n_manifest):
    status, out, _ = gfxasm(capsys, "check", "-m", FIXTURE_MANIFEST)
    assert status == 0 and "4 variants checked" in out
    status, _, err = gfxasm(capsys, "check", "-m", str(store_n_manifest))
    assert status == 1 and "store_n.co is not built (run ./build.sh)" in err


def test_build_then_nothing_to_do(capsys, store_n_manifest):
    status, out, _ = gfxasm(capsys, "build", "-m", str(store_n_manifest))
    assert status == 0 and "assembled store_n.s → " in out.replace(str(store_n_manifest.parent) + "/", "")
    status, out, _ = gfxasm(capsys, "build", "-m", str(store_n_manifest))
    assert status == 0 and "(0 assembled, 1 up to date)" in out


def test_run_all_fixture_kernels_on_the_emulator(capsys, fixture_manifest):
    status, out, _ = gfxasm(capsys, "run", "--all", "-m", FIXTURE_MANIFEST, "--seed", "7")
    assert status == 0
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["axpb", "axmb", "buffer_diff", "rowsum"]
    assert all(line.split()[1] == "ok" for line in lines)
    assert " 0/1037 off" in out and "wave-instructions" in out


def test_run_one_kernel_one_variant(capsys, fixture_manifest):
    status, out, _ = gfxasm(capsys, "run", "axpb", "--variant", "axmb", "-m", FIXTURE_MANIFEST)
    assert status == 0 and out.split()[:2] == ["axmb", "ok"] and len(out.strip().splitlines()) == 1


def test_run_one_kernel_runs_all_its_variants(capsys, fixture_manifest):
    # Regression: naming a kernel with several variants (and no --variant) used to fail.
    status, out, _ = gfxasm(capsys, "run", "axpb", "-m", FIXTURE_MANIFEST)
    assert status == 0 and [line.split()[:2] for line in out.strip().splitlines()] == [["axpb", "ok"], ["axmb", "ok"]]


def test_run_fails_without_a_reference_and_on_a_wrong_result(capsys, store_n_manifest, monkeypatch):
    status, out, _ = gfxasm(capsys, "run", "store_n", "-m", str(store_n_manifest))
    assert status == 1 and "FAIL  no reference registered" in out

    def wrong_reference(variant, gen):
        out = torch.zeros(1, dtype=torch.uint32)
        return cli.RunCase(args=dict(out=out, n=5), expected={"out": torch.tensor([6])}, atol=0, rtol=0)
    monkeypatch.setitem(cli.RUN_CASES, "store_n", wrong_reference)
    status, out, _ = gfxasm(capsys, "run", "store_n", "-m", str(store_n_manifest))
    assert status == 1 and "FAIL  out: max|err| 1, 1/1 off" in out


def test_run_needs_a_kernel_that_exists(capsys, fixture_manifest):
    status, _, err = gfxasm(capsys, "run", "nope", "-m", FIXTURE_MANIFEST)
    assert status == 1 and "no kernel 'nope'" in err and "axpb, buffer_diff, rowsum" in err
    status, _, err = gfxasm(capsys, "run", "-m", FIXTURE_MANIFEST)
    assert status == 1 and "name a KERNEL or pass --all" in err


def test_dis_disassembles_a_built_variant(capsys, fixture_manifest):
    completed = subprocess.run([sys.executable, "-m", "gfxasm.cli", "dis", "rowsum", "-m", FIXTURE_MANIFEST],
                               capture_output=True, text=True)
    assert completed.returncode == 0
    assert "<rowsum>:" in completed.stdout and "s_barrier" in completed.stdout
    assert "ds_read_b32" in completed.stdout and "s_endpgm" in completed.stdout


def test_a_manifest_error_is_one_message_and_status_1(capsys, tmp_path):
    path = write_manifest(tmp_path, {"k": {"source": "missing.s", "workgroup": 64, "grid": [1], "args": []}})
    status, _, err = gfxasm(capsys, "list", "-m", str(path))
    assert status == 1 and err.startswith("gfxasm list: ") and "field 'source'" in err


def test_a_subcommand_is_one_table_entry(capsys, monkeypatch):
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "hello", cli.Command(
        "say hello", lambda ns: seen.append((ns.name, [m.path for m in ns.manifests])) or 3,
        lambda parser: parser.add_argument("name")))
    status, _, _ = gfxasm(capsys, "hello", "world")
    assert status == 3 and seen == [("world", [REPO_ROOT / "kernels.yaml"])]


def test_a_delegated_command_parses_its_own_arguments(monkeypatch):
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "echo", cli.Command("echo argv", lambda argv: seen.append(argv) or 0, None))
    assert cli.main(["echo", "--json", "-m", "x.co", "--help"]) == 0
    assert seen == [["--json", "-m", "x.co", "--help"]]


def test_run_case_registration_refuses_duplicates(monkeypatch):
    monkeypatch.setattr(cli, "RUN_CASES", {})
    cli.run_case("k")(lambda variant, gen: None)
    with pytest.raises(ValueError, match="a run case for kernel 'k' is already registered"):
        cli.run_case("k")(lambda variant, gen: None)



def test_every_product_kernel_has_a_run_case():
    # `gfxasm run --all` (the quick start's main job) fails on a kernel with no reference
    import gfxasm.ops  # noqa: F401  (registers the op modules' cases)
    from gfxasm.manifest import default_manifest
    missing = sorted(set(default_manifest().kernels) - set(cli.RUN_CASES))
    assert not missing, f"no run case registered for {missing}"

def test_the_console_script_is_installed():
    completed = subprocess.run(["gfxasm", "--help"], capture_output=True, text=True)
    assert completed.returncode == 0
    for name in ("build", "list", "check", "run", "dis", "stats", "bench"):
        assert name in completed.stdout

"""gfxasm.launch: argument checks, kernarg bytes, grid, and the choice of backend.

The backends are replaced by recorders here (test_fixtures.py runs the real emulator).
This machine has no GPU, so a tensor on 'cuda' cannot be made: a CPU tensor subclass that
reports device cuda:0 stands in for one. It exercises launch's device logic only.
"""
import importlib
import struct

import pytest
import torch

import gfxasm
from gfxasm.backends.hip import HipBackend, HipUnavailable
from gfxasm.manifest import Manifest

from conftest import write_manifest

launch_module = importlib.import_module("gfxasm.launcher")   # the module; `gfxasm.launch` is its function


class CudaStandIn(torch.Tensor):
    """A CPU tensor that says it lives on cuda:0."""
    @property
    def device(self):
        return torch.device("cuda", 0)


def on_cuda(tensor: torch.Tensor) -> torch.Tensor:
    return torch.Tensor._make_subclass(CudaStandIn, tensor)


@pytest.fixture
def emu_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(launch_module.emu_backend, "launch", lambda *args: calls.append(args) or "emu result")
    return calls


def axpb_args(n=1000):
    return dict(a=torch.randn(n), b=torch.randn(n), out=torch.full((n,), float("nan")), alpha=-0.75, n=n)


def test_cpu_tensors_go_to_the_emulator_with_packed_arguments(fixture_manifest, emu_calls):
    args = axpb_args()
    assert gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axmb", **args) == "emu result"
    [(co_path, symbol, grid, block, kernarg, tensors, schedule)] = emu_calls
    assert co_path == fixture_manifest.kernel("axpb").variant("axmb").co_path and co_path.name == "axmb.co"
    assert symbol == "axpb" and grid == (4, 1, 1) and block == (256, 1, 1) and schedule == "serial"
    assert kernarg == struct.pack("<QQQfI", args["a"].data_ptr(), args["b"].data_ptr(), args["out"].data_ptr(),
                                  -0.75, 1000)
    assert [t is args[k] for t, k in zip(tensors, "a b out".split())] == [True] * 3


def test_grid_comes_from_shape_names(fixture_manifest, emu_calls):
    x = torch.randn(7, 300)
    gfxasm.launch(fixture_manifest.kernel("rowsum"), x=x, out=torch.empty(7), cols=300)
    assert emu_calls[0][2] == (7, 1, 1)
    assert emu_calls[0][4] == struct.pack("<QQI4x", x.data_ptr(), emu_calls[0][5][1].data_ptr(), 300)


def test_an_empty_problem_launches_nothing(fixture_manifest, emu_calls):
    args = axpb_args(0)
    assert gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axpb", **args) is None
    assert emu_calls == []


def with_args(**changes):
    args = axpb_args()
    for name, value in changes.items():
        if value is None:
            del args[name]
        else:
            args[name] = value(args) if callable(value) else value
    return args


@pytest.mark.parametrize("changes, error, message", [
    (dict(b=None), TypeError, r"axpb: missing argument b: \*f32 in \[n\]"),
    (dict(b=None, n=None), TypeError, r"missing arguments b: \*f32 in \[n\]; n: u32 in"),
    (dict(c=torch.zeros(3)), TypeError, r"unexpected argument c; it takes a, b, out, alpha, n"),
    (dict(a=lambda a: a["a"].half()), TypeError,
     r"argument 'a' \(\*f32\): expected dtype torch.float32, got torch.float16"),
    (dict(a=lambda a: a["a"].reshape(10, 100)), ValueError,
     r"argument 'a' \(\*f32\): expected rank 1 \(\[n\]\), got shape \(10, 100\)"),
    (dict(out=[0.0] * 1000), TypeError, r"argument 'out' \(\*f32\): expected a torch.Tensor of dtype "
                                        r"torch.float32, got list"),
    (dict(out=lambda a: torch.empty(2000)[::2]), ValueError,
     r"argument 'out' \(\*f32\): expected a contiguous tensor, got strides \(2,\)"),
    (dict(b=lambda a: a["b"][:999]), ValueError, r"b.shape\[0\] = 999, but a.shape\[0\] = 1000 \(both are 'n'\)"),
    (dict(n=999), ValueError, r"argument 'n' = 999, but the tensors' shape name 'n' is 1000"),
    (dict(n=-1), ValueError, r"argument 'n' \(u32\): -1 is outside \[0, 4294967295\]"),
    (dict(alpha="fast"), TypeError, r"argument 'alpha' \(f32\): expected a float, got str"),
    (dict(b=lambda a: a["b"].to("meta")), ValueError, r"argument 'b' \(\*f32\): on meta, but 'a' is on cpu"),
])
def test_bad_arguments_are_refused_before_launch(fixture_manifest, emu_calls, changes, error, message):
    with pytest.raises(error, match=message):
        gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axpb", **with_args(**changes))
    assert emu_calls == []


def test_fixed_dims_and_rank_only_arguments(tmp_path, fixture_manifest, emu_calls):
    with pytest.raises(ValueError, match=r"argument 'x' \(\*f32\): expected rank 2 \(\[rows, cols\]\), got shape \(6,\)"):
        gfxasm.launch(fixture_manifest.kernel("rowsum"), x=torch.zeros(6), out=torch.zeros(1), cols=6)
    with pytest.raises(ValueError, match=r"argument 'a' \(\*f32\): expected rank 1 \(rank 1\), got shape \(2, 2\)"):
        gfxasm.launch(fixture_manifest.kernel("buffer_diff"), a=torch.zeros(2, 2), out=torch.zeros(4), n=4)
    (tmp_path / "k.s").write_text("    s_endpgm\n")
    spec = {"source": "k.s", "workgroup": 64, "grid": [1],
            "args": [{"name": "q", "type": "*bf16", "dir": "in", "shape": ["s", 128]}]}
    kernel = Manifest.load(write_manifest(tmp_path, {"k": spec})).kernel("k")
    with pytest.raises(ValueError, match=r"q.shape\[1\] must be 128, got 64"):
        gfxasm.launch(kernel, q=torch.zeros(3, 64, dtype=torch.bfloat16))


def test_choosing_kernels_and_variants(fixture_manifest):
    with pytest.raises(ValueError, match="kernel 'axpb' has variants axpb, axmb: pass variant="):
        gfxasm.launch(fixture_manifest.kernel("axpb"), **axpb_args())
    with pytest.raises(ValueError, match="kernel 'axpb' has no variant 'axqb'"):
        gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axqb", **axpb_args())
    with pytest.raises(ValueError, match=r"kernels.yaml has no kernel 'no_such_kernel'"):
        gfxasm.launch("no_such_kernel", x=1)


def test_an_unbuilt_kernel_says_to_build(store_n_manifest):
    kernel = Manifest.load(store_n_manifest).kernel("store_n")
    with pytest.raises(FileNotFoundError, match=r"store_n.co is not built: run ./build.sh"):
        gfxasm.launch(kernel, out=torch.zeros(1, dtype=torch.uint32), n=5)


def test_a_grid_beyond_32_bits_is_refused(tmp_path):
    (tmp_path / "k.s").write_text("    s_endpgm\n")
    spec = {"source": "k.s", "workgroup": 64, "grid": ["m * 2"], "args": [{"name": "m", "type": "u64"}]}
    kernel = Manifest.load(write_manifest(tmp_path, {"k": spec})).kernel("k")
    with pytest.raises(ValueError, match=r"grid\[0\] = 'm \* 2' = 8589934592 with these arguments"):
        gfxasm.launch(kernel, m=2**32)


def test_backend_override_must_fit_the_tensors(fixture_manifest, monkeypatch, emu_calls):
    kernel = fixture_manifest.kernel("axpb")
    monkeypatch.setenv("GFXASM_BACKEND", "hip")
    with pytest.raises(ValueError, match="GFXASM_BACKEND=hip, but the tensors are on the CPU"):
        gfxasm.launch(kernel, variant="axpb", **axpb_args())
    monkeypatch.setenv("GFXASM_BACKEND", "gpu")
    with pytest.raises(ValueError, match="GFXASM_BACKEND='gpu': expected 'hip' or 'emu'"):
        gfxasm.launch(kernel, variant="axpb", **axpb_args())
    monkeypatch.setenv("GFXASM_BACKEND", "emu")
    gfxasm.launch(kernel, variant="axpb", **axpb_args())
    assert len(emu_calls) == 1
    args = {k: on_cuda(v) if isinstance(v, torch.Tensor) else v for k, v in axpb_args().items()}
    with pytest.raises(ValueError, match="GFXASM_BACKEND=emu, but the tensors are on cuda:0"):
        gfxasm.launch(kernel, variant="axpb", **args)


def test_unsupported_device_is_refused(fixture_manifest):
    args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in axpb_args().items()}
    with pytest.raises(ValueError, match="tensors on meta: gfxasm runs on CPU tensors"):
        gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axpb", **args)


def test_a_cuda_tensor_without_a_hip_runtime_is_a_clear_error(fixture_manifest, monkeypatch):
    # This torch is a CPU build: torch.version.hip is None, as on any machine without ROCm.
    monkeypatch.setattr(torch.version, "hip", None)
    args = {k: on_cuda(v) if isinstance(v, torch.Tensor) else v for k, v in axpb_args().items()}
    with pytest.raises(HipUnavailable, match=r"no HIP runtime: the tensors are on cuda:0, but this PyTorch is not "
                                             r"a ROCm build"):
        gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axpb", **args)


def test_rocm_tensors_go_to_hip_on_the_current_stream(fixture_manifest, monkeypatch, hip_stub):
    monkeypatch.setattr(launch_module, "hip_backend", HipBackend())
    monkeypatch.setattr(launch_module, "current_stream", lambda device: 0xBEEF)
    args = {k: on_cuda(v) if isinstance(v, torch.Tensor) else v for k, v in axpb_args(600).items()}
    assert gfxasm.launch(fixture_manifest.kernel("axpb"), variant="axmb", **args) is None
    [launch] = hip_stub.launches()
    assert launch["grid"] == "3,1,1" and launch["block"] == "256,1,1" and launch["stream"] == str(0xBEEF)
    assert launch["function"] == "axpb" and launch["device"] == launch["module"] == "0"
    assert bytes.fromhex(launch["kernarg"]) == struct.pack("<QQQfI", args["a"].data_ptr(), args["b"].data_ptr(),
                                                           args["out"].data_ptr(), -0.75, 600)


# --- rank-only buffers: the manifest's `numel`, and null pointers for untouched ones ---

def reduce_args(ws_numel, M=3, N=5, splits=2):
    return dict(ws=torch.randn(ws_numel), out=torch.full((M, N), float("nan"), dtype=torch.bfloat16), M=M, N=N,
                splits=splits)


def test_a_buffer_below_its_numel_is_refused(emu_calls):
    with pytest.raises(ValueError, match=r"argument 'ws' \(\*f32\) has 29 elements; with these arguments the "
                                         r"kernel touches 30 \(numel 'splits \* M \* N'\)"):
        gfxasm.launch("mxfp8_splitk_reduce", variant="mxfp8_splitk_reduce_bf16", **reduce_args(29))
    assert emu_calls == []
    gfxasm.launch("mxfp8_splitk_reduce", variant="mxfp8_splitk_reduce_bf16", **reduce_args(30))
    assert len(emu_calls) == 1


def test_an_untouched_buffer_may_be_a_null_pointer(emu_calls):
    """mxfp8 with splits = 1 never touches ws (numel 0): a prepared launch takes None for it."""
    from gfxasm.manifest import default_manifest
    a = torch.zeros(1, 64, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sa = torch.zeros(1, 2, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    b = torch.zeros(8, 64, dtype=torch.uint8).view(torch.float8_e4m3fn)
    sb = torch.zeros(8, 2, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    out = torch.empty(1, 8, dtype=torch.bfloat16)
    variant = default_manifest().kernel("mxfp8_gemv_m1").variant("mxfp8_gemv_m1_bf16")
    prepared = launch_module.prepare(variant, dict(a=a, a_scale=sa, b=b, b_scale=sb, out=out, ws=torch.empty(0),
                                                   M=1, N=8, K=64, splits=1))
    prepared(a, sa, b, sb, out, None)
    [(_, _, _, _, kernarg, tensors, _)] = emu_calls
    assert struct.unpack_from("<Q", kernarg, variant.arg("ws").offset)[0] == 0 and len(tensors) == 5
    with pytest.raises(ValueError, match="argument 'out' is None, but the kernel touches it"):
        prepared(a, sa, b, sb, None, None)
    # the same launch from addresses its caller read (the op framework's form): the same
    # segment, and the same refusal
    emu_calls.clear()
    tensors = (a, sa, b, sb, out, None)
    prepared.launch_at(tensors, tuple(None if t is None else t.data_ptr() for t in tensors))
    [(_, _, _, _, kernarg_at, tensors_at, _)] = emu_calls
    assert kernarg_at == kernarg and len(tensors_at) == 5
    with pytest.raises(ValueError, match="argument 'out' is None, but the kernel touches it"):
        prepared.launch_at((a, sa, b, sb, None, None), (a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), None,
                                                        None))


def test_a_prepared_launch_writes_each_address_at_its_offset(emu_calls):
    """The segment a prepared launch packs (the template's pieces and the addresses in one
    struct pack) is kernarg.pack's of the same arguments with the tensors' addresses."""
    from gfxasm import kernarg
    from gfxasm.manifest import default_manifest
    from gfxasm.ops import fmha
    q, k, v = (torch.randn(1, 4, 2, 128).bfloat16() for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(1, 2, 4)
    variant = default_manifest().kernel("fmha_fwd_d128").variant("fmha_fwd_d128_bf16")
    args = launch_module.fill_strides(variant, fmha.kernel_args(q, k, v, o, lse, 0.1))
    pointers = [a for a in variant.args if a.type.is_pointer]
    launch_module.prepare(variant, args)(*(args[a.name] for a in pointers))
    values = {a.name: args[a.name].data_ptr() if a.type.is_pointer else args[a.name] for a in variant.args}
    [(_, _, _, _, segment, tensors, _)] = emu_calls
    assert segment == kernarg.pack(variant.args, variant.kernarg_size, values) and len(pointers) > 4
    assert [t.data_ptr() for t in tensors] == [values[a.name] for a in pointers]


def test_byte_stride_scalars_must_match_the_tensors(emu_calls):
    """fmha_fwd_d128 takes byte strides as scalars: gfxasm.launch checks them against q/k/v/o/lse."""
    from gfxasm.ops import fmha
    q, k, v = (torch.randn(1, 4, 2, 128).bfloat16() for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(1, 2, 4)
    args = fmha.kernel_args(q, k, v, o, lse, 0.1)
    gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **args)
    assert len(emu_calls) == 1
    for name, value, complaint in (
            ("k_seq_stride", 128, r"argument 'k_seq_stride' = 128, but k.stride\(1\) is 256 elements = 512 bytes"),
            ("lse_head_stride", 8, r"argument 'lse_head_stride' = 8, but lse.stride\(1\) is 4 elements = 16 bytes")):
        with pytest.raises(ValueError, match=complaint):
            gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **{**args, name: value})
    every_other = torch.randn(1, 4, 2, 256).bfloat16()[..., ::2]      # byte strides agree, the head dim's does not
    with pytest.raises(ValueError, match=r"argument 'v' must have stride 1 in dim 3, got strides \(2048, 512, 256, 2\)"):
        gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **fmha.kernel_args(q, k, every_other, o, lse, 0.1))
    assert len(emu_calls) == 1


def test_byte_stride_scalars_left_out_are_filled_from_the_tensors(emu_calls):
    """A stride scalar the caller leaves out is the tensor's stride in bytes; a dim of size 1
    (whose torch stride can be anything) gets the bytes of one slice of the later dims."""
    from gfxasm.manifest import default_manifest
    from gfxasm.ops import fmha
    variant = default_manifest().kernel("fmha_fwd_d128").variant("fmha_fwd_d128_bf16")
    strided = [name for a in variant.args if a.strides for name in a.strides if isinstance(name, str)]
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(2, 5, 2, 3, 128, generator=gen).bfloat16()
    q = torch.randn(2, 4, 2, 256, generator=gen).bfloat16()[..., :128]           # padded rows
    k, v = pool[:, :, 0, :2], pool[:, :, 1, :2]                                     # views of one pool
    o = torch.empty(2, 2, 4, 128).bfloat16().transpose(1, 2)                        # heads outer
    lse = torch.empty(2, 2, 4)
    given = fmha.kernel_args(q, k, v, o, lse, 0.1)
    without = {name: value for name, value in given.items() if name not in strided}
    gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **given)
    gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **without)
    assert len(emu_calls) == 2 and emu_calls[0][4] == emu_calls[1][4]    # the same kernarg bytes
    assert launch_module.fill_strides(variant, without)["k_seq_stride"] == 2 * 3 * 128 * 2
    # size-1 dims: batch 1 of [1, S, H, D] -> one [S, H, D] slice; a broadcast seq axis of one
    # token (torch stride 0) -> its [H, D] slice
    x = torch.empty(1, 4, 2, 128).bfloat16()
    assert launch_module._byte_stride(x, 0) == x.numel() * 2
    one = torch.empty(3, 1, 2, 128).bfloat16().expand(3, 1, 2, 128).as_strided((3, 1, 2, 128), (256, 0, 128, 1))
    assert launch_module._byte_stride(one, 1) == 256 * 2 and launch_module._byte_stride(one, 0) == 256 * 2
    assert launch_module._byte_stride(torch.empty(0, 2, 128), 1) == 0
    # a scalar the caller passes is kept, and checked
    with pytest.raises(ValueError, match=r"argument 'k_seq_stride' = 16, but k.stride\(1\) is 768 elements"):
        gfxasm.launch("fmha_fwd_d128", variant="fmha_fwd_d128_bf16", **without, k_seq_stride=16)

"""bench/host_cost.py measures every op registered under torch.ops.gfxasm (issue 21 item 5:
every op and form through torch.ops, <= 20 us of host time per call with the launch
stubbed). No timing here: the figures come from the bench itself (docs/ops.md)."""
import torch

import gfxasm  # noqa: F401  (registers the ops)
from bench import host_cost
from gfxasm import launcher


def registered_ops() -> set[str]:
    return {f"gfxasm::{name}" for name in dir(torch.ops.gfxasm)
            if isinstance(getattr(torch.ops.gfxasm, name), torch._ops.OpOverloadPacket)}


def test_every_registered_op_is_measured_through_torch_ops_and_reaches_the_launch(monkeypatch):
    launched = []
    for backend in (launcher.emu_backend, launcher.hip_backend):
        monkeypatch.setattr(backend, "launch", lambda *args: launched.append(args))
    cases = host_cost.cases()
    replayed = {}
    for label, call in cases.items():
        before = len(launched)
        call()
        assert len(launched) > before, f"{label}: never reached the (stubbed) launch"
        if ": torch.ops" in label:
            replayed[label] = call.op._schema.name
    assert set(replayed.values()) == registered_ops()
    for label, name in replayed.items():       # each torch.ops case replays the form its label names
        form = label.rsplit("torch.ops", 1)[1].strip()          # "", "_out" or "_with_lse"
        assert name == name.removesuffix("_out").removesuffix("_with_lse") + form, (label, name)

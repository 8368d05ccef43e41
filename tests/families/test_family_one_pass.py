"""The model families train bit for bit alike with vtrain.fused_binary's one-pass binary ops and without
them: the same logs, losses and states (batch and layer norms, attention and residual adds are where the
models use those ops; GPT-2's GELU and both families' norms run as vtrain.fused_gelu's and vtrain.fused_norms' passes
in both, tested on their own in tests/families/test_family_fused_ops.py; the one-pass way also writes autograd's sums
of gradients over a sole gradient, vtrain.accumulation)."""

from __future__ import annotations

import pytest
import torch

from familykit import family_spec
from vtrain import fused_binary
from vtrain.state import state_hash
from vtrain.train import TrainingSession

aten = torch.ops.aten


def _train(spec, on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(fused_binary, "MIN_ELEMENTS", 0 if on else 1 << 62)  # every size, or none
    calls, sums = [], []
    kernel, binary = fused_binary._binary, fused_binary.binary
    monkeypatch.setattr(fused_binary, "_binary", lambda *a: calls.append(a[0]) or kernel(*a))

    def noting(func, args, kwargs, m, limit, into_x=False):  # noqa: ANN001, ANN202
        out = binary(func, args, kwargs, m, limit, into_x)
        sums.append(func is aten.add.Tensor and out is args[0])  # autograd's sum written over its gradient
        return out

    monkeypatch.setattr(fused_binary, "binary", noting)
    s = TrainingSession(spec, "cpu")
    out = [s.step(t, "record") for t in range(1, 4)]
    return [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes()), set(calls), any(sums)


@pytest.mark.parametrize("family,resolution", [("resnet-tiny", "log"), ("gpt2-tiny", "log"),
                                               ("resnet-tiny", "exact")])
def test_training_with_the_one_pass_ops_is_bit_identical(family_data, family: str, resolution: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spec = family_spec(family, family_data, steps=10, resolution=resolution)
    logs_on, loss_on, state_on, codes, summed_over = _train(spec, True, monkeypatch)
    logs_off, loss_off, state_off, none, _ = _train(spec, False, monkeypatch)
    # every op ran the one-pass way (the norms' centring is fused_norms', and so was the one subtraction in the log
    # resolution; the exact one's log-softmax subtracts), and then none did; and autograd's sums of gradients
    # (residual streams, norms) ran written over a sole gradient (vtrain.accumulation)
    ops = set(range(4)) - ({fused_binary.SUB} if resolution == "log" else set())
    assert codes == ops and not none and summed_over
    assert logs_on == logs_off and loss_on == loss_off and state_on == state_off

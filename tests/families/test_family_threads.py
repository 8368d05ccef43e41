"""Training on two torch threads, where vtrain's own kernels split their passes across torch's OpenMP team
(vtrain.omp), gives the one-thread run's logs, losses and states bit for bit. Parts are made small here (MIN_VALUES
512), and the one-pass binary ops, the matmul pre-filter, the CPU device's line sums and the convolutions' E at
candidates taken at every size, so that the families' default sizes split every kind of pass but a matrix's norms
(below); the kernels' parts against their whole passes are tested in tests/numerics/test_num_omp.py."""

from __future__ import annotations

import pytest
import torch

from familykit import family_spec
from vtrain import fused, fused_binary, inline, omp, omp_kernels, prefilter
from vtrain.state import state_hash
from vtrain.train import TrainingSession

KERNELS = {"binary": omp_kernels._binary_part, "near": omp_kernels._near_part, "outer": omp_kernels._outer_part,
           "round": omp_kernels._round_part, "lanes": omp_kernels._lanes_part, "update": omp_kernels._update_part,
           "norms": omp_kernels._norms_part, "norms_batched": omp_kernels._norms_batched_part,
           "squares": omp_kernels._squares_part, "conv_abs": omp_kernels._conv_abs_part,
           "window": omp_kernels._window_part, "chain": omp_kernels._chain_part, "rows": omp_kernels._rows_part}


def _train(spec, threads: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    ran, run = set(), omp.run
    names = {k.address: name for name, k in KERNELS.items()}

    def noting(kernel, block, parts):  # noqa: ANN001, ANN202
        ran.add(names[kernel])
        return run(kernel, block, parts)

    monkeypatch.setattr(omp, "run", noting)
    monkeypatch.setattr(omp, "MIN_VALUES", 512)
    monkeypatch.setattr(fused_binary, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(inline, "INLINE_PRODUCTS", 0)
    monkeypatch.setattr(fused, "BLOCK_SUM_ELEMENTS", 0)
    monkeypatch.setattr(prefilter, "_SPLIT_TERMS", 64)
    torch.set_num_threads(threads)
    try:
        s = TrainingSession(spec, "cpu")
        out = [s.step(t, "record") for t in range(1, 4)]
    finally:
        torch.set_num_threads(1)
    return [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes()), ran


# (the pre-filter's norms split a matrix in blocks of prefilter.NORM_BLOCK rows, more than the default sizes' operands
# have: the attention's batched operands split here, a matrix in tests/numerics/test_num_omp.py)
@pytest.mark.parametrize("family,resolution,kernels", [
    ("gpt2-tiny", "log", {"binary", "near", "outer", "round", "lanes", "update", "norms_batched", "chain", "rows"}),
    ("resnet-tiny", "log", {"binary", "outer", "lanes", "update", "squares", "window"}),
    # (the exact resolution decomposes the softmax family into primitive ops: no "rows")
    ("gpt2-tiny", "exact", {"binary", "near", "outer", "round", "lanes", "update", "norms_batched", "chain"}),
    # (the convolutions' E at candidates: the exact resolution's, and the auditor's at its entries; the
    # recording trainer logs with U there, rounding.UPPER_BAND)
    ("resnet-tiny", "exact", {"binary", "outer", "lanes", "update", "squares", "conv_abs", "window"})])
def test_two_threads_train_as_one(family_data, family: str, resolution: str, kernels: set,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    spec = family_spec(family, family_data, steps=10, resolution=resolution)
    logs2, loss2, state2, ran2 = _train(spec, 2, monkeypatch)
    logs1, loss1, state1, ran1 = _train(spec, 1, monkeypatch)
    # every kind of pass split on two threads (a process compiling numba's kernels may split one more: autograd
    # then copies a gradient it would otherwise take over, rounded by `round`), none on one
    assert kernels <= ran2 and not ran1
    assert logs2 == logs1 and loss2 == loss1 and state2 == state1

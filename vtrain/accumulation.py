"""Autograd's sums of gradients, computed in place under rounded execution.

Where a tensor feeds several ops, the autograd engine sums the gradients that come back to it in one input
buffer (torch/csrc/autograd/input_buffer.cpp). Natively it adds into the buffer's tensor where the buffer
holds the only reference to it; under any dispatch mode it never does (torch counts every tensor as a
subclass while a mode is active), so each sum writes a fresh tensor, which costs a third more than adding in
place (2 MB operands: 0.23 against 0.15 ms). Rounded execution is such a mode. GPT-2-tiny at d_model 256 sums
28 gradients of 262K-1M values a step this way (its residual stream and layer norms, its GELU's input),
resnet-tiny at width 32 20.

`sole_gradient` tells the rounded execution that an add it was given is such a sum, and that nothing else will
read its left operand: vtrain.fused_binary then writes the rounded sum over that operand, the value the add
would have returned. It holds where

- a backward pass is running (a graph task) with grad mode off, so no graph of the gradients is recorded;
- the autograd node being evaluated is one whose backward formula dispatches no add (`ADD_FREE`; the test
  tests/numerics/test_num_accumulation.py runs each formula alone): so the add is the engine's, summing that
  node's outputs into the buffers that wait for them, or a tensor hook's (Python code that runs in the node's
  context, and holds its operands by name: the next condition refuses those);
- the left operand has one owner only, as the engine asks natively: its C++ use count and its Python reference
  count are those of a buffer's sole gradient, measured on the engine's own sums in this process (`sole_owners`). A
  second owner shows in them: another buffer holding the same gradient (an add's backward passes its one
  gradient on to both operands' nodes), a hook's or any Python structure's reference (the matmul pre-filter keeps
  its operands);
- and it alone sees its storage (vtrain.spare.sole): no view of it exists.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from vtrain import spare

_ADD = torch.ops.aten.add.Tensor

# The nodes whose sums these are in the model families, none of whose backward formulas adds: a product's
# gradient is a product, a mean's a division, a difference's a negation, a matmul's two matmuls, a
# convolution's the one convolution_backward op, vtrain.fused_gelu's and vtrain.fused_norms' their fused
# passes (their sums of gradients are computed in the passes; where a pass cannot run, its dispatched adds sum
# operands held by name, which the owner test below refuses).
ADD_FREE = frozenset({"MulBackward0", "MeanBackward1", "SubBackward0", "MmBackward0", "ConvolutionBackward0",
                      "_GeluBackward", "_NormBackward"})


def sole_gradient(func: Any, args: tuple) -> bool:
    """Whether the dispatched op `func` on `args` is the autograd engine's sum of two gradients whose first
    operand nothing else holds or sees (see the module docstring). Call it with the dispatch's own args tuple,
    with no name bound to args[0]: a name is one more reference."""
    if func is not _ADD or torch._C._current_graph_task_id() == -1 or torch.is_grad_enabled():
        return False
    node = torch._C._current_autograd_node()
    if node is None or node.name() not in ADD_FREE:
        return False
    sole = sole_owners()
    return sole is not None and _owners(args) == sole and spare.sole(args[0])


def _owners(args: tuple) -> tuple[int, int]:
    """args[0]'s C++ use count and Python reference count (read from the tuple: a name would add one)."""
    return args[0]._use_count(), sys.getrefcount(args[0])


_MEASURED: list[tuple[int, int] | None] = []  # (`sole_owners`: its answer, once measured)


def sole_owners() -> tuple[int, int] | None:
    """`_owners` of a gradient that an input buffer alone holds, seen in a dispatch mode, or None where a second
    owner would not show (or torch does not expose use counts). Measured once a process, outside any backward
    pass (inside one, None until then: the probe would see that pass's adds too); the rounded execution asks on
    entering, so that its backward passes find the answer."""
    if not _MEASURED:
        if torch._C._current_graph_task_id() != -1:
            return None
        _MEASURED.append(_measure())
    return _MEASURED[0]


def _measure() -> tuple[int, int] | None:
    """`sole_owners`' counts, from two tiny backward passes outside any other mode: one whose only sum adds to a
    sole gradient, and one where a gradient that two buffers hold is summed into one of them."""
    if not hasattr(torch.Tensor, "_use_count"):
        return None
    seen: list[tuple[int, int]] = []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func is _ADD and torch._C._current_graph_task_id() != -1:
                seen.append(_owners(args))
            return func(*args, **(kwargs or {}))

    # (under inference mode or a default device too: a CPU tensor that records its graph)
    with _disable_current_modes(), torch.inference_mode(False), torch.enable_grad():
        p = torch.ones(2, dtype=torch.float64, device="cpu", requires_grad=True)
        with Probe():
            (p * 2.0 + p * 3.0).sum().backward()  # p's buffer: the second product's gradient added to the first's
        if len(seen) != 1:
            return None
        sole = seen.pop()
        with Probe():
            a, b = p * 2.0, p * 3.0
            c = a * 5.0
            # (a + b)'s node runs first (made after c's), passing its one gradient on to a's node and to b's;
            # c's node then adds its gradient to a's while b's buffer still holds that one
            ((a + b) + c).sum().backward()
    return sole if seen and any(owners != sole for owners in seen) else None

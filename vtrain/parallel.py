"""Data-parallel training over processes (torch.distributed, gloo) and the gradient reduction.

The spec fixes `shards`, the number of micro-batches M a step's batch is split into; the number of
processes N (any divisor of M) is not part of the spec. Process r computes the gradients of the
contiguous shards r*M/N .. (r+1)*M/N - 1, each under its own rounded execution, exactly as one
process computes all M in turn. The mean gradient is then (1/M) * sum of the M shard gradients.

The sum is where world sizes differ: each process adds its own shards, and gloo's all-reduce adds the
partial sums in an order that depends on N. We make its result independent of that order by
*canonical rounding* (DESIGN.md 1.3b) instead of a log: the FP64 sum v of M grid values is within
E = gamma_(M-1) * sum|g_i| of the exact sum S whatever the order, so where the whole band [v - 2E,
v + 2E] rounds to one grid value, that value is RNE_grid(S); the few elements whose band straddles a
rounding boundary are recomputed exactly (fractions) from the M addends, gathered from the processes
that hold them. Every process and every N thus get RNE_grid(S) bit for bit, with nothing to log. The
division by M is one IEEE operation, rounded.

Batch norm's running statistics are updated by shard 0 only (like DistributedDataParallel, which
broadcasts rank 0's buffers), and broadcast from process 0 after each step.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from dataclasses import dataclass
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from vtrain.bounds import gamma
from vtrain.errors import VtrainError
from vtrain.grid import GridOverflowError, neighbours, round_to_grid, round_unchecked

_U64 = 2.0**-53
_TIMEOUT = timedelta(minutes=10)


class ParallelError(VtrainError):
    """A worker process failed, or the worker count does not fit the spec."""


class ShardLogRejected(VtrainError):
    """A worker rejected its shard's rounding log (the message is that worker's error)."""


@dataclass(frozen=True)
class Group:
    """This process's place among the data-parallel processes of a job."""

    rank: int = 0
    world: int = 1

    def shards(self, total: int) -> range:
        """The contiguous block of micro-batch shards this process computes."""
        per = total // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, in rank order (picklable objects)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_buffers(self, model: nn.Module) -> None:
        """Copy process 0's floating buffers (batch norm statistics) to every process, bit for bit."""
        if self.world == 1:
            return
        for _, b in sorted(model.named_buffers()):
            if b.is_floating_point():
                dist.broadcast(b, src=0)


SINGLE = Group()


def check_workers(workers: int, shards: int) -> None:
    if workers < 1 or shards % workers:
        raise ParallelError(f"--workers {workers} must divide the spec's shards ({shards}); the shards fix the "
                            "computation, the workers only share it out")


# -- the reduction ----------------------------------------------------------------------------------


def reduce_gradients(own: dict[int, list[torch.Tensor]], total: int, bits: int, group: Group) -> list[torch.Tensor]:
    """The mean over `total` shards of the per-parameter gradients, canonically rounded to the grid.

    `own` maps this process's shard indices to their gradient lists (grid values, one per parameter).
    """
    some = next(iter(own.values()))
    dtype = some[0].dtype
    shapes = [g.shape for g in some]
    stacked = torch.stack([torch.cat([g.reshape(-1) for g in own[i]]).double() for i in sorted(own)])  # (own, P)
    v, a = stacked.sum(0), stacked.abs().sum(0)
    if group.world > 1:
        dist.all_reduce(v)
        dist.all_reduce(a)
    # |v - S| <= E = gamma_(M-1) sum|g| for any order; `a` itself is computed with the same relative error.
    # The band is twice that, plus 2u|v| for the roundings of v -+ band themselves.
    e = gamma(max(total - 1, 1), _U64)
    band = 2 * (e * (1 + 2 * e) * a + 2.0**-1074) + 2 * _U64 * v.abs()
    try:
        lo, hi = round_unchecked(v - band, bits), round_unchecked(v + band, bits)
        summed = round_to_grid(v, bits)
    except GridOverflowError as exc:
        raise GridOverflowError(f"the reduced gradient overflows the grid: {exc}") from None
    ambiguous = (lo != hi).nonzero().squeeze(1)
    if ambiguous.numel():
        summed[ambiguous] = _exact_sums(stacked[:, ambiguous], sorted(own), ambiguous, bits, group)
    # one IEEE division per element, then rounded: the same bits on every device
    mean = round_to_grid(summed / total, bits).to(dtype)
    out, pos = [], 0
    for shape in shapes:
        n = shape.numel()
        out.append(mean[pos:pos + n].reshape(shape))
        pos += n
    return out


def _exact_sums(values: torch.Tensor, shard_ids: list[int], positions: torch.Tensor, bits: int,
                group: Group) -> torch.Tensor:
    """RNE_grid of the exact sums over all shards at `positions` (every process gets the same)."""
    parts = group.all_gather(values.tolist())           # per process: (its shards, positions) floats
    columns = [sum((Fraction(x) for rows in parts for x in (row[j] for row in rows)), Fraction(0))
               for j in range(positions.numel())]
    return torch.tensor([_round_fraction(s, bits) for s in columns], dtype=torch.float64)


def _round_fraction(s: Fraction, bits: int) -> float:
    """Round an exact rational to nearest, ties to even, on the grid."""
    f = float(s)                                         # correctly rounded to FP64
    r = round_to_grid(torch.tensor([f], dtype=torch.float64), bits)
    if Fraction(f) == s:
        return float(r)
    # FP64 -> grid is a second rounding: wrong only when f fell exactly on a grid midpoint
    lower, upper = neighbours(r, bits)
    for other in (lower, upper):
        mid = (r + other) / 2                            # exact: neighbours differ by one grid step
        if float(mid) == f:
            below, above = (other, r) if float(other) < float(r) else (r, other)
            return float(above if s > Fraction(f) else below)
    return float(r)


# -- processes --------------------------------------------------------------------------------------


def run_workers(fn: Callable[..., Any], workers: int, *args: Any, threads: int = 1) -> Any:
    """Run fn(group, *args) in `workers` processes joined by gloo; return process 0's result.

    `fn` must be a module-level function (the processes are spawned). A VtrainError in any process
    becomes a ParallelError with that process's message; the other processes are stopped.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="vtrain-dp-") as tmp:
        try:
            mp.spawn(_entry, args=(workers, tmp, fn, args, threads), nprocs=workers, join=True)
        except mp.ProcessRaisedException as exc:
            errors = sorted(Path(tmp).glob("error-*.txt"))
            if errors:
                raise ParallelError(errors[0].read_text(encoding="utf-8")) from None
            raise ParallelError(f"a worker process failed: {exc}") from None
        except mp.ProcessExitedException as exc:
            raise ParallelError(f"a worker process died: {exc}") from None
        with open(os.path.join(tmp, "result.pkl"), "rb") as f:
            return pickle.load(f)   # written by our own process 0 a moment ago


def _entry(rank: int, world: int, tmp: str, fn: Callable[..., Any], args: tuple, threads: int) -> None:
    torch.set_num_threads(threads)
    store = dist.FileStore(os.path.join(tmp, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=_TIMEOUT)
    try:
        result = fn(Group(rank, world), *args)
        if rank == 0:
            with open(os.path.join(tmp, "result.pkl"), "wb") as f:
                pickle.dump(result, f)
    except VtrainError as exc:
        Path(tmp, f"error-{rank}.txt").write_text(f"worker {rank} of {world}: {exc}", encoding="utf-8")
        raise
    except Exception:
        Path(tmp, f"error-{rank}.txt").write_text(f"worker {rank} of {world}: {traceback.format_exc()}",
                                                  encoding="utf-8")
        raise
    else:
        # Every process past its last collective before any tears its group down. Without this, process 0 (the
        # last broadcast's source) could close its connections while a peer was still receiving, and gloo then
        # called std::terminate in process 0 (SIGABRT in tests/families/test_family_parallel.py's two-process
        # audit: 3 runs of 14 at f93d662, 1 of 39 with this barrier, that one's cause not caught). (Here, not in
        # the try: a peer's failure ends this barrier with an error of its own, which must not take the place of
        # the peer's in the error files.)
        dist.barrier()
    finally:
        dist.destroy_process_group()

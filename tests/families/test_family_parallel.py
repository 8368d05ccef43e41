"""Data-parallel training: the canonical rounding of the gradient sum, and runs trained with N
processes audited bit-exactly with another number of processes."""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from familykit import cli, family_spec
from vtrain.audit import audit, replay_step_detail
from vtrain.grid import grid_index, round_to_grid
from vtrain.errors import VtrainError
from vtrain.parallel import SINGLE, Group, ParallelError, reduce_gradients, run_workers
from vtrain.run import Run
from vtrain.spec import spec_from_dict, to_toml
from vtrain.train import train


def _rne_fp32(s: Fraction) -> float:
    """Independent reference: the nearest FP32 value to s, ties to the even significand."""
    f = np.float32(float(s))
    cands = {float(f), float(np.nextafter(f, np.float32(np.inf))), float(np.nextafter(f, np.float32(-np.inf)))}
    best = min(abs(Fraction(c) - s) for c in cands)
    near = sorted(c for c in cands if abs(Fraction(c) - s) == best)
    if len(near) == 1:
        return near[0]
    return next(c for c in near if np.float32(c).view(np.int32) % 2 == 0)


def _grid(values: list[float]) -> torch.Tensor:
    return round_to_grid(torch.tensor(values, dtype=torch.float64), 32)


def test_reduction_is_the_correctly_rounded_exact_mean():
    rng = random.Random(7)
    shards = 4
    # cancellation (FP64 sums lose the small terms), ties of the grid, and ordinary values
    columns = [[2.0**30, 2.0**-30 * (1 + 2.0**-23), -(2.0**30), 0.0],
               [1.0, 2.0**-24, 2.0**-48, 0.0],
               [1.0, -(2.0**-25), 2.0**-60, 0.0]]
    columns += [[rng.uniform(-1, 1) * 2.0 ** rng.randint(-40, 40) for _ in range(shards)] for _ in range(300)]
    grads = {i: [_grid([c[i] for c in columns])] for i in range(shards)}
    (mean,) = reduce_gradients(grads, shards, 32, SINGLE)
    addends = [[float(grads[i][0][j]) for i in range(shards)] for j in range(len(columns))]
    for j, terms in enumerate(addends):
        exact_sum = _rne_fp32(sum(map(Fraction, terms), Fraction(0)))
        assert float(mean[j]) == _rne_fp32(Fraction(exact_sum) / shards), (j, terms)
    assert float(mean[0]) == 2.0**-32 * (1 + 2.0**-23)   # an FP64 sum in this order gives 0


def _last_rank_fails_after_the_collectives(group: Group) -> float:
    # (module level: the worker processes are spawned, and import it by name)
    total = group.all_gather(float(group.rank))
    if group.rank == group.world - 1:
        raise VtrainError(f"rank {group.rank} found its shard corrupt")
    return sum(total)


def test_a_workers_error_after_the_last_collective_is_the_one_reported():
    # The processes meet once more after their work, before tearing their group down (vtrain.parallel._entry);
    # a peer's failure then ends process 0's wait with an error of its own, which must not be reported instead
    with pytest.raises(ParallelError, match="worker 1 of 2: rank 1 found its shard corrupt"):
        run_workers(_last_rank_fails_after_the_collectives, 2)


def test_workers_must_divide_the_shards(tmp_path):
    spec = spec_from_dict({"model": "mlp", "batch_size": 12, "shards": 3, "steps": 2})
    with pytest.raises(ParallelError, match="must divide the spec's shards"):
        train(spec, tmp_path / "r", spec_toml=to_toml(spec), workers=2)


def test_two_processes_train_what_one_process_audits(tmp_path):
    spec = spec_from_dict({"model": "mlp", "dropout": 0.1, "optimizer": "adamw", "batch_size": 32, "shards": 2,
                           "steps": 3})
    result = train(spec, tmp_path / "r2", spec_toml=to_toml(spec), workers=2)
    run = Run.open(tmp_path / "r2")
    assert result.root == "0x" + run.root.hex() and result.size == 4
    report = audit(run, "emu:splitk8-tree")
    assert report.matched, report.divergence
    assert replay_step_detail(run, 2, "emu:lanes8-butterfly").equal   # the referee replays one sharded step
    single = train(spec, tmp_path / "r1", spec_toml=to_toml(spec))
    assert single.root == result.root


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2-tiny", "resnet-tiny"])
def test_four_process_trainer_audited_by_one_and_two_processes(family_data, tmp_path, family):
    spec = family_spec(family, family_data, shards=4, steps=4, warmup_steps=2)
    (tmp_path / "spec.toml").write_text(to_toml(spec))
    code, out, err = cli("train", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "run"), "--workers", "4")
    assert code == 0, err
    run = Run.open(tmp_path / "run")
    assert out.strip().splitlines()[-1] == f"root=0x{run.root.hex()} size=5"
    one = audit(run, "emu:lanes8-butterfly")
    assert one.matched, one.divergence
    code, out, err = cli("audit", str(run.path), "--workers", "2", "--device", "emu:splitk8-tree")
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == f"MATCH root=0x{run.root.hex()} size=5"


def _steer_shard(run_dir, step: int, shard: int) -> None:
    """Act as a dishonest trainer: add an entry forcing an unambiguous value in one shard's log of
    `step`, and commit to the doctored log (leaf and commitment rewritten to match)."""
    from vtrain.leaves import LeafRecord, keccak256
    from vtrain.run import atomic_write, encode_leaves, write_commitment
    from vtrain.shardlog import ShardedLog

    run = Run.open(run_dir)
    log = ShardedLog.from_bytes(run.read_log_bytes(step), "x", run.spec.shards + 1)
    part = log.parts[shard]
    i = next(k for k, s in enumerate(part.sites) if s.num_entries == 0)
    s = part.sites[i]
    bits = run.spec.bits  # a full-width residue names one grid value outright
    part.sites[i] = dataclasses.replace(s, val_pos=np.array([0]), val_res=grid_index(np.array([1024.0]), bits),
                                        val_bits=np.array([bits], np.uint8))
    data = log.to_bytes()
    atomic_write(run.log_path(step), data)
    old = run.records[step]
    records = list(run.records)
    records[step] = LeafRecord(step, old.state_hash, keccak256(data), old.batch_hash)
    atomic_write(run.path / "leaves.bin", encode_leaves(records))
    write_commitment(run.path / "commitment.json", records, run.spec)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_steered_shard_log_is_rejected_by_every_worker(tmp_path, workers):
    spec = spec_from_dict({"model": "mlp", "batch_size": 32, "shards": 2, "steps": 3})
    train(spec, tmp_path / "r", spec_toml=to_toml(spec))
    _steer_shard(tmp_path / "r", step=2, shard=1)
    report = audit(Run.open(tmp_path / "r"), "cpu", workers=workers)
    d = report.divergence
    assert d is not None and d.step == 2 and "log rejected" in d.reason and "illegitimate" in d.reason
    assert report.size == 4   # the auditor went on honestly after the rejection

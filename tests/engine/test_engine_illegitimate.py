"""A trainer that steers an unambiguous rounding through its log is caught at that entry.

The cheater adds one direction entry to a step's log at an element that was nowhere near a rounding
boundary and commits to the edited log (its leaves stay self-consistent). Of the two directions
one agrees with every honest device's rounding (a harmless, legitimate no-op) and the other flips
it; the flipped one must fail the audit naming the step, the op site and the element index.
"""

from __future__ import annotations

import dataclasses
import math
import shutil

import numpy as np

from enginekit import cli, example
from vtrain.audit import audit, replay_step_detail
from vtrain.leaves import LeafRecord, keccak256
from vtrain.roundlog import StepLog, site_tag
from vtrain.run import Run, encode_leaves

K = 4
SPEC = example("mlp", steps=6)


def _tamper(src, dst, up: bool) -> tuple[int, int]:
    """Copy the run and add one entry to step K's log; returns (site, element index)."""
    shutil.copytree(src, dst)
    run = Run.open(dst)
    log = StepLog.from_bytes(run.read_log_bytes(K))
    # (a log read back names its sites by tag only: a hidden x hidden weight gradient of the MLP)
    shape = (SPEC.hidden, SPEC.hidden)
    site = next(s for s in log.sites if s.tag == site_tag("aten.mm.default", shape))
    taken = set(site.dir_pos.tolist()) | set(site.val_pos.tolist())
    index = next(i for i in range(math.prod(shape) // 2, math.prod(shape)) if i not in taken)
    order = np.argsort(np.append(site.dir_pos, index), kind="stable")
    log.sites[site.site] = dataclasses.replace(
        site, dir_pos=np.append(site.dir_pos, index)[order].astype(np.int64),
        dir_up=np.append(site.dir_up, up)[order].astype(bool))
    data = log.to_bytes()
    run.log_path(K).write_bytes(data)
    records = list(run.records)
    records[K] = LeafRecord(K, records[K].state_hash, keccak256(data), records[K].batch_hash)
    (dst / "leaves.bin").write_bytes(encode_leaves(records))
    return site.site, index


def test_flipped_entry_outside_the_band_is_named(runs, tmp_path):
    src = runs.get(SPEC, "cpu")
    outcomes = {}
    for up in (False, True):
        site, index = _tamper(src, tmp_path / f"up{up}", up)
        outcomes[up] = audit(Run.open(tmp_path / f"up{up}"), "cpu")
    harmless = [r for r in outcomes.values() if r.matched]
    flipped = [(up, r) for up, r in outcomes.items() if not r.matched]
    assert len(harmless) == 1 and len(flipped) == 1
    up, report = flipped[0]
    assert report.divergence.step == K
    reason = report.divergence.reason
    assert f"step {K}, op site {site}" in reason and f"element {index}" in reason and "illegitimate" in reason
    detail = replay_step_detail(Run.open(tmp_path / f"up{up}"), K)
    assert not detail.equal and "illegitimate" in detail.note
    r = cli("audit", str(tmp_path / f"up{up}"))
    assert r.returncode == 1 and f"DIVERGED step={K} " in r.stdout and f"element {index}" in r.stdout

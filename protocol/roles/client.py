"""The client: posts a training job with the reward in escrow, and may cancel it before a commitment."""

from __future__ import annotations

from protocol.chain import JobStatus, JobTerms
from protocol.roles.base import Role, RoleError
from protocol.roles.tx import SentTx
from vtrain.intervals import Intervals
from vtrain.spec import Spec


def initial_leaf(spec: Spec) -> bytes:
    """Leaf 0 of any honest run of `spec`: the initial state, determined by the spec and its seed."""
    from vtrain.train import TrainingSession  # torch: only when a job is actually posted

    return TrainingSession(spec).record().leaf


def terms_for(spec: Spec, *, referee: str, challenge_window: int, clock_per_side: int, referee_window: int,
              trainer_bond: int, challenger_bond: int) -> JobTerms:
    """The on-chain terms of a job training `spec` (its hash, leaf 0 and number of steps).

    The contract's "steps" are the tree's leaves after leaf 0: the spec's steps when its
    checkpoint_interval is 1, its intervals otherwise (a dispute then isolates one interval).
    """
    leaves = Intervals(spec.steps, spec.checkpoint_interval).size
    return JobTerms(spec.hash, initial_leaf(spec), referee, leaves - 1, challenge_window, clock_per_side,
                    referee_window, trainer_bond, challenger_bond)


class Client(Role):
    """Posts jobs and takes back the reward of a job nobody committed to."""

    def create_job(self, terms: JobTerms, reward: int) -> tuple[int, SentTx]:
        """Post a job with `reward` wei in escrow; return its id and the transaction."""
        label = f"create job (spec 0x{terms.spec_hash.hex()[:12]}…, {terms.num_steps} steps, reward {reward} wei)"
        result = self._send("createJob", terms.as_tuple(), label=label, value=reward)
        events = [e for e in self.binding.tx.decode_logs(self.w3.eth.get_transaction_receipt(result.hash)["logs"])
                  if e.name == "JobCreated"]
        if not events:
            raise RoleError(f"{label}: transaction {result.hash} emitted no JobCreated event")
        return int(events[0]["jobId"]), result

    def cancel(self, job_id: int) -> SentTx:
        job = self.job(job_id)
        if job.status != JobStatus.OPEN:
            raise RoleError(f"job {job_id} is {job.status.name.lower()}: only an open job can be cancelled")
        return self._send("cancelJob", job_id, label=f"cancel job {job_id}", key=f"cancel:{job_id}")

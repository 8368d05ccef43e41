"""Every transition of VerificationGame and every revert, checked by custom-error selector."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gamekit import CHALLENGER_BOND, CLOCK, LEAF0, REFEREE_WINDOW, REWARD, TRAINER_BOND, leaves, play, reverts
from protocol.chain import EndReason, GameStatus, JobStatus, Side, TreeProver

ZERO = "0x0000000000000000000000000000000000000000"
ZERO32 = bytes(32)


# ------------------------------------------------------------------ jobs


def test_create_job_escrows_the_reward_and_stores_the_terms(world):
    before = world.game.balance()
    r = world.game.create_job(world.terms(8), REWARD, world.client)
    job = world.game.job(r.value)
    assert r.event("JobCreated").args == {
        "jobId": r.value, "client": world.client, "specHash": job.terms.spec_hash, "numSteps": 8, "reward": REWARD
    }  # fmt: skip
    assert (job.status, job.client, job.reward, job.terms) == (JobStatus.OPEN, world.client, REWARD, world.terms(8))
    assert world.game.balance() - before == REWARD
    assert world.game.job_count() == r.value


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"num_steps": 0}, "NoSteps"),
        ({"referee": ZERO}, "NoReferee"),
        ({"challenge_window": 0}, "ZeroTerm"),
        ({"clock_per_side": 0}, "ZeroTerm"),
        ({"referee_window": 0}, "ZeroTerm"),
        ({"trainer_bond": 0}, "ZeroTerm"),
        ({"challenger_bond": 0}, "ZeroTerm"),
    ],
)
def test_create_job_rejects_terms_that_could_not_end(world, overrides, error):
    with reverts(world, error):
        world.game.create_job(replace(world.terms(8), **overrides), REWARD, world.client)


def test_cancel_job_credits_the_client_only_while_open(world):
    job_id = world.new_job()
    with reverts(world, "Unauthorized", caller=world.stranger, expected=world.client):
        world.game.cancel_job(job_id, world.stranger)
    r = world.game.cancel_job(job_id, world.client)
    assert r.event("JobCancelled")["jobId"] == job_id
    assert world.game.job(job_id).status == JobStatus.CANCELLED
    assert world.game.credit(world.client) == REWARD
    with reverts(world, "WrongJobStatus", jobId=job_id, status=JobStatus.CANCELLED):
        world.game.cancel_job(job_id, world.client)
    with reverts(world, "JobNotFound", jobId=999):
        world.game.cancel_job(999, world.client)


def test_commit_binds_root_size_final_leaf_and_leaf0(world):
    job_id = world.new_job(8)
    prover = TreeProver(leaves(8))
    r = world.game.commit_tree(job_id, prover, world.trainer)
    assert r.event("Committed").args == {
        "jobId": job_id, "trainer": world.trainer, "root": prover.root, "size": 9, "finalLeaf": prover.leaf(8)
    }  # fmt: skip
    job = world.game.job(job_id)
    assert (job.status, job.trainer, job.root, job.final_leaf) == (JobStatus.COMMITTED, world.trainer, prover.root, prover.leaf(8))
    assert job.committed_at == world.now()
    with reverts(world, "WrongJobStatus", status=JobStatus.COMMITTED):
        world.game.commit_tree(job_id, prover, world.auditor)
    with reverts(world, "WrongJobStatus", status=JobStatus.COMMITTED):
        world.game.cancel_job(job_id, world.client)


def test_commit_reverts(world):
    job_id = world.new_job(8)
    p = TreeProver(leaves(8))
    with reverts(world, "WrongSize", expected=9, size=10):
        world.game.commit(job_id, p.root, 10, p.leaf(8), p.proof(8), p.proof(0), world.trainer)
    with reverts(world, "WrongValue", expected=TRAINER_BOND, sent=TRAINER_BOND - 1):
        world.game.commit(job_id, p.root, 9, p.leaf(8), p.proof(8), p.proof(0), world.trainer, bond=TRAINER_BOND - 1)
    with reverts(world, "InvalidProof", index=8, leaf=p.leaf(7)):
        world.game.commit(job_id, p.root, 9, p.leaf(7), p.proof(8), p.proof(0), world.trainer)
    with reverts(world, "InvalidProof", index=0, leaf=LEAF0):  # a proof of another leaf's place
        world.game.commit(job_id, p.root, 9, p.leaf(8), p.proof(8), p.proof(1), world.trainer)
    other_start = TreeProver(leaves(8, leaf0=leaves(0, tag="elsewhere")[0]))
    with reverts(world, "InvalidProof", index=0, leaf=LEAF0):  # a tree not starting from the job's leaf 0
        world.game.commit_tree(job_id, other_start, world.trainer)
    with reverts(world, "JobNotFound", jobId=77):
        world.game.commit(77, p.root, 9, p.leaf(8), p.proof(8), p.proof(0), world.trainer, bond=TRAINER_BOND)


# ------------------------------------------------------------------ challenges


def test_challenge_opens_a_game_with_the_roots_children_revealed(world):
    job_id, honest = world.committed_job(8)
    bad = TreeProver(leaves(8, diverge_at=3))
    r = world.game.challenge_tree(job_id, bad, world.auditor)
    ev = r.event("Challenged")
    # 9 leaves split 8 + 1: the right child is one leaf, revealed raw.
    children = (bad.subtree(0, 8), bad.leaf(8))
    assert bad.children(0, 9) == children
    assert (ev["jobId"], ev["challenger"], ev["root"], ev["finalLeaf"], ev["left"], ev["right"]) == (
        job_id, world.auditor, bad.root, bad.leaf(8), *children
    )  # fmt: skip
    g = world.game.game(r.value)
    assert (g.status, g.start, g.end, g.size, g.turn) == (GameStatus.ACTIVE, 0, 9, 9, Side.TRAINER)
    assert (g.node, g.opponent_children, g.isolated_step, g.leaf_lo) == (honest.root, children, None, None)
    assert (g.trainer_left, g.challenger_left, g.since) == (CLOCK, CLOCK, world.now())
    assert world.game.job(job_id).open_games == 1
    assert world.game.game_count() == r.value


def test_challenge_reverts(world):
    job_id, honest = world.committed_job(8)
    bad = TreeProver(leaves(8, diverge_at=3))
    open_job = world.new_job(8)
    with reverts(world, "WrongJobStatus", jobId=open_job, status=JobStatus.OPEN):
        world.game.challenge_tree(open_job, bad, world.auditor)
    children = bad.children(0, 9)
    with reverts(world, "WrongValue", expected=CHALLENGER_BOND, sent=0):
        world.game.challenge(job_id, bad.root, bad.leaf(8), bad.proof(8), bad.proof(0), children, world.auditor, bond=0)
    with reverts(world, "SameFinalLeaf", finalLeaf=honest.leaf(8)):
        world.game.challenge_tree(job_id, TreeProver(leaves(8, diverge_at=3)[:8] + [honest.leaf(8)]), world.auditor)
    with reverts(world, "InvalidProof", index=8):
        world.game.challenge(job_id, bad.root, bad.leaf(8), bad.proof(7), bad.proof(0), children, world.auditor)
    with reverts(world, "InvalidProof", index=0, leaf=LEAF0):  # a tree not starting from the job's leaf 0
        world.game.challenge_tree(job_id, TreeProver(leaves(8, tag="elsewhere")), world.auditor)
    with reverts(world, "InvalidChildren", start=0, end=9):  # the trainer's children, not the challenger's
        world.game.challenge(job_id, bad.root, bad.leaf(8), bad.proof(8), bad.proof(0), honest.children(0, 9), world.auditor)
    with reverts(world, "InvalidChildren", start=0, end=9):  # a one-leaf child must be given raw
        world.game.challenge(job_id, bad.root, bad.leaf(8), bad.proof(8), bad.proof(0), (children[0], bad.subtree(8, 1)),
                             world.auditor)


def test_challenge_window_closes_exactly_at_commit_plus_window(world):
    job_id, _ = world.committed_job(8)
    closes = world.game.job(job_id).challenge_closes_at
    bad = TreeProver(leaves(8, diverge_at=3))
    world.at(closes - 1)
    world.game.challenge_tree(job_id, bad, world.auditor)
    world.at(closes)
    with reverts(world, "ChallengeWindowClosed", jobId=job_id, closesAt=closes):
        world.game.challenge_tree(job_id, bad, world.auditor2)


def test_one_step_job_is_isolated_at_the_challenge(world):
    job_id, honest = world.committed_job(1)
    bad = TreeProver(leaves(1, diverge_at=1))
    r = world.game.challenge_tree(job_id, bad, world.auditor)
    iso = r.event("StepIsolated")
    assert (iso["step"], iso["preLeaf"], iso["trainerLeaf"], iso["challengerLeaf"]) == (1, honest.leaf(0), honest.leaf(1), bad.leaf(1))
    assert iso["deadline"] == world.now() + REFEREE_WINDOW
    assert world.game.game(r.value).status == GameStatus.ISOLATED


# ------------------------------------------------------------------ moves


def test_moves_narrow_to_the_first_differing_step_and_record_it(world):
    job_id, honest = world.committed_job(8)
    bad = TreeProver(leaves(8, diverge_at=3))
    game_id = world.game.challenge_tree(job_id, bad, world.auditor).value
    results = play(world, game_id, honest, bad)
    # [0,9) -> left [0,8) -> left [0,4) -> right [2,4) (leaves 0,1 agree) -> right: leaf 3, whose
    # pre-leaf 2 is the agreed left child just compared (no proof).
    moved = [(e["mover"], e["start"], e["end"], e["left"], e["right"]) for r in results for e in r.events if e.name == "Moved"]
    assert moved == [
        (Side.TRAINER, 0, 8, *honest.children(0, 8)), (Side.CHALLENGER, 0, 4, *bad.children(0, 4)),
        (Side.TRAINER, 2, 4, *honest.children(2, 4)),
    ]  # fmt: skip
    assert [r.function for r in results] == ["move"] * 4 and "Moved" not in [e.name for e in results[-1].events]
    iso = results[-1].event("StepIsolated")
    assert (iso["step"], iso["preLeaf"], iso["trainerLeaf"], iso["challengerLeaf"]) == (3, honest.leaf(2), honest.leaf(3), bad.leaf(3))
    g = world.game.game(game_id)
    assert (g.status, g.start, g.end, g.lo, g.hi, g.isolated_step) == (GameStatus.ISOLATED, 3, 4, 2, 3, 3)
    assert (g.leaf_lo, g.trainer_leaf_hi, g.challenger_leaf_hi) == (honest.leaf(2), honest.leaf(3), bad.leaf(3))
    assert world.game.referee_deadline(game_id) == world.now() + REFEREE_WINDOW


def test_isolation_by_a_left_descent_proves_the_pre_leaf(world):
    # Leaf 4 of 9 first differs: [0,9) -> [0,8) -> right [4,8) -> left [4,6) -> left: leaf 4, a
    # left child, so the isolating mover (the challenger) proves leaf 3 against its own root.
    job_id, honest, bad, game_id = game_on(world, 8, 4)
    for prover, who in ((honest, world.trainer), (bad, world.auditor), (honest, world.trainer)):
        world.game.move_tree(game_id, prover, who)
    g = world.game.game(game_id)
    assert (g.start, g.end, g.turn) == (4, 6, Side.CHALLENGER)
    children = bad.children(4, 6)
    with reverts(world, "InvalidProof", index=3, leaf=bad.leaf(4)):
        world.game.move(game_id, children, (ZERO32, ZERO32), bad.leaf(4), bad.proof(3), world.auditor)
    with reverts(world, "InvalidProof", index=3, leaf=bad.leaf(3)):  # the trainer's proof, not against this root
        world.game.move(game_id, children, (ZERO32, ZERO32), bad.leaf(3), honest.proof(3), world.auditor)
    r = world.game.move(game_id, children, (ZERO32, ZERO32), bad.leaf(3), bad.proof(3), world.auditor)
    iso = r.event("StepIsolated")
    assert (iso["step"], iso["preLeaf"], iso["trainerLeaf"], iso["challengerLeaf"]) == (4, honest.leaf(3), honest.leaf(4), bad.leaf(4))
    assert world.game.game(game_id).isolated_step == 4


def test_move_reverts(world):
    job_id, honest = world.committed_job(8)
    bad = TreeProver(leaves(8, diverge_at=3))
    game_id = world.game.challenge_tree(job_id, bad, world.auditor).value
    with reverts(world, "NotYourTurn", gameId=game_id, turn=Side.TRAINER):
        world.game.move_tree(game_id, bad, world.auditor)
    none = (ZERO32, ZERO32)
    with reverts(world, "InvalidChildren", start=0, end=9):  # the challenger's children, not the trainer's
        world.game.move(game_id, bad.children(0, 9), honest.children(0, 8), ZERO32, [], world.trainer)
    with reverts(world, "InvalidChildren", start=0, end=8):  # the descent goes into [0,8), not [8,9)
        world.game.move(game_id, honest.children(0, 9), none, ZERO32, [], world.trainer)
    with reverts(world, "InvalidChildren", start=0, end=8):  # next children of the wrong tree
        world.game.move(game_id, honest.children(0, 9), bad.children(0, 8), ZERO32, [], world.trainer)
    with reverts(world, "GameNotFound", gameId=404):
        world.game.move(404, none, none, ZERO32, [], world.trainer)
    play(world, game_id, honest, bad)
    with reverts(world, "WrongGameStatus", gameId=game_id, status=GameStatus.ISOLATED):
        world.game.move(game_id, honest.children(2, 4), none, ZERO32, [], world.auditor)


def test_clock_allows_its_last_second_and_charges_only_the_mover(world):
    job_id, honest = world.committed_job(8)
    bad = TreeProver(leaves(8, diverge_at=3))
    game_id = world.game.challenge_tree(job_id, bad, world.auditor).value
    start = world.game.game(game_id).since
    world.at(start + 100)
    world.game.move_tree(game_id, honest, world.trainer)
    g = world.game.game(game_id)
    assert (g.turn, g.trainer_left, g.challenger_left, g.since) == (Side.CHALLENGER, CLOCK - 100, CLOCK, start + 100)
    with world.rewind():
        world.at(start + 100 + CLOCK + 1)
        with reverts(world, "ClockExpired", gameId=game_id, turn=Side.CHALLENGER):
            world.game.move_tree(game_id, bad, world.auditor)
    world.at(start + 100 + CLOCK)  # the budget's last second is still the challenger's
    world.game.move_tree(game_id, bad, world.auditor)
    assert world.game.game(game_id).challenger_left == 0


# ------------------------------------------------------------------ timeouts, referee, refunds


def game_on(world, n: int = 8, diverge_at: int = 3):
    job_id, honest = world.committed_job(n)
    bad = TreeProver(leaves(n, diverge_at=diverge_at))
    return job_id, honest, bad, world.game.challenge_tree(job_id, bad, world.auditor).value


def test_timeout_only_after_the_budget_and_the_late_side_loses(world):
    job_id, honest, bad, game_id = game_on(world)
    start = world.game.game(game_id).since
    world.at(start + CLOCK)
    with reverts(world, "ClockNotExpired", gameId=game_id, remaining=0):
        world.game.timeout(game_id, world.stranger)
    world.at(start + CLOCK + 1)
    r = world.game.timeout(game_id, world.stranger)
    assert r.event("GameEnded").args == {"gameId": game_id, "jobId": job_id, "outcome": GameStatus.CHALLENGER_WON, "reason": EndReason.TIMEOUT}
    assert r.event("CommitmentVoided")["gameId"] == game_id
    split = r.event("BondSplit")
    assert (split["winners"], split["share"], split["remainder"]) == (1, TRAINER_BOND, 0)
    assert world.game.job(job_id).status == JobStatus.VOID
    assert world.game.credit(world.client) == REWARD
    assert world.game.credit(world.auditor) == CHALLENGER_BOND
    with reverts(world, "WrongGameStatus", status=GameStatus.CHALLENGER_WON):
        world.game.timeout(game_id, world.stranger)


def test_challenger_out_of_time_loses_its_bond_to_the_trainer(world):
    job_id, honest, bad, game_id = game_on(world)
    world.game.move_tree(game_id, honest, world.trainer)
    world.at(world.game.game(game_id).since + CLOCK + 1)
    r = world.game.timeout(game_id, world.auditor2)
    assert r.event("GameEnded")["outcome"] == GameStatus.TRAINER_WON
    assert world.game.credit(world.trainer) == CHALLENGER_BOND
    assert world.game.job(job_id).status == JobStatus.COMMITTED


@pytest.mark.parametrize("trainer_wins", [True, False])
def test_referee_resolves_an_isolated_step(world, trainer_wins):
    job_id, honest, bad, game_id = game_on(world)
    with reverts(world, "WrongGameStatus", status=GameStatus.ACTIVE):
        world.game.resolve(game_id, True, world.referee)
    play(world, game_id, honest, bad)
    with reverts(world, "Unauthorized", caller=world.trainer, expected=world.referee):
        world.game.resolve(game_id, True, world.trainer)
    r = world.game.resolve(game_id, trainer_wins, world.referee)
    outcome = GameStatus.TRAINER_WON if trainer_wins else GameStatus.CHALLENGER_WON
    assert r.event("GameEnded").args == {"gameId": game_id, "jobId": job_id, "outcome": outcome, "reason": EndReason.REFEREE}
    assert world.game.job(job_id).status == (JobStatus.COMMITTED if trainer_wins else JobStatus.VOID)
    with reverts(world, "WrongGameStatus", status=outcome):
        world.game.resolve(game_id, trainer_wins, world.referee)


def test_referee_deadline_is_inclusive_then_only_a_refund_remains(world):
    job_id, honest, bad, game_id = game_on(world)
    play(world, game_id, honest, bad)
    deadline = world.game.referee_deadline(game_id)
    world.at(deadline)
    with reverts(world, "RefereeDeadlineNotPassed", gameId=game_id, deadline=deadline):
        world.game.refund(game_id, world.stranger)
    world.at(deadline + 1)
    with reverts(world, "RefereeDeadlinePassed", gameId=game_id, deadline=deadline):
        world.game.resolve(game_id, True, world.referee)
    r = world.game.refund(game_id, world.stranger)
    assert r.event("GameEnded")["outcome"] == GameStatus.REFUNDED
    assert r.event("GameEnded")["reason"] == EndReason.REFEREE_MISSED_DEADLINE
    assert world.game.credit(world.auditor) == CHALLENGER_BOND
    assert world.game.job(job_id).open_games == 0
    with reverts(world, "WrongGameStatus", status=GameStatus.REFUNDED):
        world.game.refund(game_id, world.stranger)


def test_referee_can_resolve_at_its_deadline(world):
    job_id, honest, bad, game_id = game_on(world)
    play(world, game_id, honest, bad)
    world.at(world.game.referee_deadline(game_id))
    world.game.resolve(game_id, True, world.referee)


# ------------------------------------------------------------------ finalize, shares, withdraw


def test_finalize_after_the_window_with_no_open_game(world):
    job_id, honest, bad, game_id = game_on(world)
    play(world, game_id, honest, bad)
    closes = world.game.job(job_id).challenge_closes_at
    world.at(closes - 1)
    with reverts(world, "ChallengeWindowOpen", jobId=job_id, closesAt=closes):
        world.game.finalize(job_id, world.stranger)
    world.at(closes)
    with reverts(world, "GamesOpen", jobId=job_id, openGames=1):
        world.game.finalize(job_id, world.stranger)
    world.game.refund(game_id, world.stranger)  # the referee let its window (500 s) pass
    r = world.game.finalize(job_id, world.stranger)
    assert r.event("Finalized").args == {"jobId": job_id, "trainer": world.trainer, "amount": TRAINER_BOND + REWARD}
    assert world.game.credit(world.trainer) == TRAINER_BOND + REWARD
    assert world.game.job(job_id).status == JobStatus.FINAL
    with reverts(world, "WrongJobStatus", status=JobStatus.FINAL):
        world.game.finalize(job_id, world.stranger)
    with reverts(world, "WrongJobStatus", status=JobStatus.FINAL):
        world.game.challenge_tree(job_id, bad, world.auditor2)


def test_winning_challengers_share_the_trainer_bond_equally(world):
    # Three games end at different times: two challengers win, the trainer wins the third; the
    # split waits for the last open game, and the indivisible remainder goes to the client.
    bond = 2 * 10**18 + 1
    job_id = world.new_job(8, trainer_bond=bond)
    cheat = TreeProver(leaves(8, tag="cheat", leaf0=leaves(0)[0]))
    world.game.commit_tree(job_id, cheat, world.trainer)
    truth = TreeProver(leaves(8))
    g1 = world.game.challenge_tree(job_id, truth, world.auditor).value
    g2 = world.game.challenge_tree(job_id, truth, world.auditor2).value
    g3 = world.game.challenge_tree(job_id, TreeProver(leaves(8, tag="third", leaf0=leaves(0)[0])), world.stranger).value
    world.game.move_tree(g3, cheat, world.trainer)  # the trainer only defends game 3
    start = world.game.game(g1).since
    world.at(start + CLOCK + 1)
    r1 = world.game.timeout(g1, world.client)
    assert world.game.job(job_id).status == JobStatus.VOID and not [e for e in r1.events if e.name == "BondSplit"]
    assert world.game.credit(world.client) == REWARD
    with reverts(world, "NoShare", gameId=g1):  # games 2 and 3 are still open
        world.game.claim_share(g1, world.auditor)
    with reverts(world, "WrongJobStatus", status=JobStatus.VOID):  # no new challenge on a void job
        world.game.challenge_tree(job_id, truth, world.client)
    world.game.timeout(g2, world.client)
    world.at(world.game.game(g3).since + CLOCK + 1)
    r3 = world.game.timeout(g3, world.client)  # the third challenger gave up: the trainer wins game 3
    assert r3.event("GameEnded")["outcome"] == GameStatus.TRAINER_WON
    assert world.game.credit(world.trainer) == CHALLENGER_BOND
    split = r3.event("BondSplit")
    assert (split["winners"], split["share"], split["remainder"]) == (2, bond // 2, 1)
    assert world.game.credit(world.client) == REWARD + 1
    with reverts(world, "NoShare", gameId=g3):  # the trainer won game 3
        world.game.claim_share(g3, world.stranger)
    for g, who in ((g1, world.auditor), (g2, world.auditor2)):
        r = world.game.claim_share(g, world.referee)  # anyone may trigger it; the challenger is paid
        assert r.event("ShareClaimed").args == {"gameId": g, "challenger": who, "amount": bond // 2}
        assert world.game.credit(who) == CHALLENGER_BOND + bond // 2
        with reverts(world, "NoShare", gameId=g):
            world.game.claim_share(g, who)


def test_withdraw_pays_the_credit_once(world):
    job_id = world.new_job()
    world.game.cancel_job(job_id, world.client)
    before = world.w3.eth.get_balance(world.client)
    r = world.game.withdraw(world.client)
    assert r.event("Withdrawn").args == {"account": world.client, "amount": REWARD}
    fee = r.gas_used * world.w3.eth.get_transaction(r.tx_hash)["gasPrice"]
    assert world.w3.eth.get_balance(world.client) == before + REWARD - fee
    assert world.game.credit(world.client) == 0
    with reverts(world, "NothingToWithdraw", account=world.client):
        world.game.withdraw(world.client)


def test_withdraw_to_a_rejecting_or_reentering_contract_keeps_the_credit(world, artifacts):
    art = artifacts["PayoutProbe"]
    w3 = world.w3
    tx = w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor(world.game.address).transact({"from": world.client})
    probe = w3.eth.contract(address=w3.eth.wait_for_transaction_receipt(tx)["contractAddress"], abi=art.abi)
    probe.functions.earnCredit(world.terms().as_tuple()).transact({"from": world.client, "value": REWARD})
    assert world.game.credit(probe.address) == REWARD
    for mode in (1, 2):  # Reject, Reenter: the re-entrant withdraw finds no credit, so the send fails
        with reverts(world, "TransferFailed", to=probe.address, amount=REWARD):
            probe_withdraw(world, probe, mode)
        assert world.game.credit(probe.address) == REWARD
    balance = world.game.balance()
    probe.functions.withdrawWith(0).transact({"from": world.client})
    assert (w3.eth.get_balance(probe.address), probe.functions.received().call()) == (REWARD, 1)
    assert world.game.balance() == balance - REWARD


def probe_withdraw(world, probe, mode: int) -> None:
    """Make the probe withdraw; its revert carries the game's error, decoded with the game's ABI."""
    try:
        probe.functions.withdrawWith(mode).transact({"from": world.client})
    except Exception as e:  # noqa: BLE001 - re-raised decoded
        raise world.game.tx.decoder.from_exception(e, "withdraw") or e

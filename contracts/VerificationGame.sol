// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;

import {MerkleVerifier} from "./lib/MerkleVerifier.sol";
import {Clock, LibClock, Side} from "./lib/Clock.sol";

/// @title VerificationGame
/// @notice Jobs, bonded training commitments and on-chain bisection games over per-step Merkle
///         trees (DESIGN.md §2). The life of a job, top-down:
///
///         1. `createJob`: a client escrows the reward and fixes the terms (spec hash, leaf 0, steps,
///            referee, windows, clock, bonds). Status Open. `cancelJob` returns the reward while no
///            one has committed.
///         2. `commit`: the first trainer to post the tree root of leaves 0..numSteps, the trainer
///            bond and its final leaf (with inclusion proofs of it and of leaf 0 = job.leaf0)
///            holds the job. First come: the client
///            names no trainer, and a wrong commitment only costs its author the bond. Status
///            Committed; the challenge window opens.
///         3. `challenge`: before the window closes, any auditor whose tree ends in a different
///            final leaf posts its root, final leaf (proofs of it and of leaf 0, as in `commit`) and
///            the challenger bond. Each challenge is a game. The challenger also reveals its root's
///            two children, so the trainer moves first.
///            (A tree that ends in the trainer's final leaf is not a dispute: the client gets the
///            same final state either way, and bisection needs a differing leaf at hi to start.)
///         4. `move`: both trees have the same RFC 9162 shape (same size), so the game descends
///            them together, Cartesi-style, with no inclusion proofs. It keeps a node [start, end)
///            whose hashes differ in the two trees, every leaf left of it agreeing (initially the
///            roots). The side to move reveals its two children of the node, checked against its
///            own hash of it, and the contract compares them with the children its opponent
///            revealed: different left children -> descend left, else right (the left sibling is
///            then agreed). Descending leftmost-differing ends at the FIRST differing leaf. Unless
///            that is a single leaf, the mover reveals its children of the new node too and the
///            move passes: one transaction is one halving, 64 + 64 bytes of calldata. Children
///            that are single leaves are revealed as raw leaves (hashed here), so at the bottom
///            both post-leaves are known. Leaf 0 is proven equal to job.leaf0 in both trees, so
///            step 0 is never isolated; the agreed pre-leaf at step - 1 is the left child just
///            compared when the last node had two leaves, else the isolating move proves it
///            against the mover's root (one proof per game).
///         5. `resolve`: the referee replays step hi off-chain and names the winner before its
///            deadline; `refund` returns the challenger's bond if it does not. `timeout`: anyone ends
///            a game whose side to move ran out of its chess-clock time; that side loses.
///         6. Outcomes. A trainer that wins a game takes that challenger's bond. A challenger that
///            wins gets its bond back, the commitment is void (status Void) and the reward goes back
///            to the client. The trainer's bond is shared equally by every challenger that wins a
///            game of this job: the split is fixed when the last open game ends (no challenge can
///            join a void job, so the set of winners is final then), each winner pulls its share with
///            `claimShare`, and the indivisible remainder goes to the client. Equal shares instead
///            of "first winner takes all" so that honest auditors do not race each other, and a
///            slow honest auditor is not worse off than a fast one.
///            `finalize`: after the window, with no open game, the commitment is final and the
///            trainer is credited its bond and the reward.
///
///         Money only moves by pull: every payout is a credit, and `withdraw` zeroes the caller's
///         credit before sending it. The contract's balance always equals the sum of open rewards,
///         locked bonds, unclaimed shares and credits (a tested invariant). No loop runs over a
///         user-controlled length (Merkle proofs are capped at MerkleVerifier.MAX_DEPTH).
contract VerificationGame {
    // ------------------------------------------------------------------ types

    /// @notice Where a job stands.
    enum JobStatus {
        None, // no such job
        Open, // reward escrowed, waiting for a commitment
        Committed, // a trainer committed; challenge window and games run
        Final, // the trainer's commitment stands; trainer credited bond + reward
        Void, // the trainer lost a game; reward back to the client, bond to the winners
        Cancelled // the client took the reward back before any commitment
    }

    /// @notice Where a game stands.
    enum GameStatus {
        None, // no such game
        Active, // bisection in progress
        Isolated, // one step isolated, waiting for the referee
        TrainerWon,
        ChallengerWon,
        Refunded // the referee missed its deadline; the challenger got its bond back
    }

    /// @notice Why a game ended.
    enum EndReason {
        Timeout,
        Referee,
        RefereeMissedDeadline
    }

    /// @notice The terms a client fixes when it posts a job.
    /// @param specHash Hash of the training spec (canonical JSON).
    /// @param leaf0 Leaf 0, the initial state, agreed by everyone.
    /// @param numSteps Training steps; trees have numSteps + 1 leaves (0..numSteps).
    /// @param referee Who resolves isolated steps.
    /// @param challengeWindow Seconds after the commitment during which challenges are accepted.
    /// @param clockPerSide Seconds of chess-clock time each side has for a whole game.
    /// @param refereeWindow Seconds the referee has to resolve after a step is isolated.
    /// @param trainerBond Wei the trainer locks with its commitment.
    /// @param challengerBond Wei each challenger locks with its challenge.
    struct JobTerms {
        bytes32 specHash;
        bytes32 leaf0;
        address referee;
        uint48 numSteps;
        uint32 challengeWindow;
        uint32 clockPerSide;
        uint32 refereeWindow;
        uint96 trainerBond;
        uint96 challengerBond;
    }

    /// @notice A job and its (single) commitment.
    /// @param terms The client's terms.
    /// @param client Who posted the job and gets the reward back if the commitment fails.
    /// @param status See JobStatus.
    /// @param openGames Games not yet ended (Active or Isolated).
    /// @param winners Games of this job the challenger won.
    /// @param reward Escrowed wei.
    /// @param trainer The committed trainer (zero while Open).
    /// @param committedAt Timestamp of the commitment.
    /// @param root The trainer's tree root.
    /// @param finalLeaf The trainer's leaf numSteps (the claimed final state).
    struct Job {
        JobTerms terms;
        address client;
        JobStatus status;
        uint32 openGames;
        uint32 winners;
        uint256 reward;
        address trainer;
        uint40 committedAt;
        bytes32 root;
        bytes32 finalLeaf;
    }

    /// @notice One bisection game between a job's trainer and one challenger: a descent of both
    ///         trees to the first leaf where they differ.
    /// @param challenger The auditor that challenged.
    /// @param jobId The job whose commitment is disputed.
    /// @param status See GameStatus.
    /// @param shareClaimed Whether a winning challenger pulled its share of the trainer's bond.
    /// @param root The challenger's tree root (same size as the trainer's).
    /// @param start First leaf of the disputed node [start, end): its hashes differ in the two
    ///        trees and every leaf before `start` agrees. Once isolated, the step is `start`.
    /// @param end One past the node's last leaf (end - start = 1 exactly when a step is isolated).
    /// @param size Both trees' size, job.numSteps + 1 (copied here: one slot holds all a move needs).
    /// @param clock The chess clock; once the game stopped, clock.since() is when it stopped.
    /// @param node Active: the side to move's hash of node [start, end).
    ///        Isolated and after: the agreed pre-leaf (leaf start - 1 of both trees).
    /// @param left Active: the opponent's left child of the node (the raw leaf when that child is
    ///        one leaf). Isolated and after: the trainer's leaf at step `start`.
    /// @param right Active: the opponent's right child likewise. Isolated and after: the
    ///        challenger's leaf at step `start`.
    /// @dev node/left/right serve both phases because the isolating move has read all three: it
    ///      rewrites warm slots (2.9k gas each) instead of filling fresh ones (22.1k each).
    struct Game {
        address challenger;
        uint64 jobId;
        GameStatus status;
        bool shareClaimed;
        bytes32 root;
        uint48 start;
        uint48 end;
        uint48 size;
        Clock clock;
        bytes32 node;
        bytes32 left;
        bytes32 right;
    }

    // ------------------------------------------------------------------ errors

    /// @notice Thrown when a job id was never created.
    error JobNotFound(uint256 jobId);
    /// @notice Thrown when a game id was never created.
    error GameNotFound(uint256 gameId);
    /// @notice Thrown when the job's status does not allow this call.
    error WrongJobStatus(uint256 jobId, JobStatus status);
    /// @notice Thrown when the game's status does not allow this call.
    error WrongGameStatus(uint256 gameId, GameStatus status);
    /// @notice Thrown when a job would have no step to dispute (numSteps must be at least 1).
    error NoSteps();
    /// @notice Thrown when a job names the zero address as referee.
    error NoReferee();
    /// @notice Thrown when a window, clock or bond of a job is zero.
    error ZeroTerm();
    /// @notice Thrown when the value sent is not exactly what the call requires.
    error WrongValue(uint256 expected, uint256 sent);
    /// @notice Thrown when a committed tree size is not numSteps + 1.
    error WrongSize(uint256 expected, uint256 size);
    /// @notice Thrown when a Merkle proof does not show `leaf` at `index` under the sender's root.
    error InvalidProof(uint256 index, bytes32 leaf);
    /// @notice Thrown when a challenge comes after the window closed (at `closesAt`).
    error ChallengeWindowClosed(uint256 jobId, uint256 closesAt);
    /// @notice Thrown when finalize comes before the window closes (at `closesAt`).
    error ChallengeWindowOpen(uint256 jobId, uint256 closesAt);
    /// @notice Thrown when a job still has games that have not ended.
    error GamesOpen(uint256 jobId, uint256 openGames);
    /// @notice Thrown when a challenger's final leaf equals the trainer's: nothing to dispute.
    error SameFinalLeaf(bytes32 finalLeaf);
    /// @notice Thrown when revealed children do not hash to the revealer's node [start, end).
    error InvalidChildren(uint256 start, uint256 end);
    /// @notice Thrown when the caller is not the side to move (`turn`).
    error NotYourTurn(uint256 gameId, Side turn);
    /// @notice Thrown when the side to move has run out of time; the game can only be timed out.
    error ClockExpired(uint256 gameId, Side turn);
    /// @notice Thrown when a timeout is called while the side to move still has `remaining` seconds.
    error ClockNotExpired(uint256 gameId, uint256 remaining);
    /// @notice Thrown when someone other than the job's client or referee makes their call.
    error Unauthorized(address caller, address expected);
    /// @notice Thrown when the referee resolves after its deadline.
    error RefereeDeadlinePassed(uint256 gameId, uint256 deadline);
    /// @notice Thrown when a refund is asked before the referee's deadline passed.
    error RefereeDeadlineNotPassed(uint256 gameId, uint256 deadline);
    /// @notice Thrown when a share is claimed for a game the challenger did not win, twice, or
    ///         before the job's last open game ended.
    error NoShare(uint256 gameId);
    /// @notice Thrown when the caller has no credit to withdraw.
    error NothingToWithdraw(address account);
    /// @notice Thrown when sending a withdrawal failed (the recipient rejected it).
    error TransferFailed(address to, uint256 amount);

    // ------------------------------------------------------------------ events

    /// @notice Emitted when a client posts a job with `reward` in escrow.
    event JobCreated(uint256 indexed jobId, address indexed client, bytes32 specHash, uint256 numSteps, uint256 reward);
    /// @notice Emitted when a client takes back the reward of a job no one committed to.
    event JobCancelled(uint256 indexed jobId);
    /// @notice Emitted when a trainer commits its tree (root, size) with final leaf `finalLeaf`.
    event Committed(uint256 indexed jobId, address indexed trainer, bytes32 root, uint256 size, bytes32 finalLeaf);
    /// @notice Emitted when an auditor challenges; `left` and `right` are its root's children (raw
    ///         leaves where a child is one leaf; zero when numSteps = 1 isolates step 1 at once).
    event Challenged(
        uint256 indexed jobId,
        uint256 indexed gameId,
        address indexed challenger,
        bytes32 root,
        bytes32 finalLeaf,
        bytes32 left,
        bytes32 right
    );
    /// @notice Emitted after every move that does not isolate a step: the new node [start, end)
    ///         and the mover's children of it, which the other side must answer.
    event Moved(uint256 indexed gameId, Side mover, uint256 start, uint256 end, bytes32 left, bytes32 right);
    /// @notice Emitted when a game has narrowed to one step: step `step` turns `preLeaf` (agreed,
    ///         at step - 1) into `trainerLeaf` according to the trainer, `challengerLeaf` according
    ///         to the challenger. The referee must resolve by `deadline`.
    event StepIsolated(
        uint256 indexed gameId, uint256 step, bytes32 preLeaf, bytes32 trainerLeaf, bytes32 challengerLeaf, uint256 deadline
    );
    /// @notice Emitted when a game ends with `outcome` (TrainerWon, ChallengerWon or Refunded).
    event GameEnded(uint256 indexed gameId, uint256 indexed jobId, GameStatus outcome, EndReason reason);
    /// @notice Emitted when the trainer lost a game: its commitment is void, the reward credited back.
    event CommitmentVoided(uint256 indexed jobId, uint256 indexed gameId);
    /// @notice Emitted when the last game of a void job ended: each of `winners` may claim `share`;
    ///         `remainder` went to the client.
    event BondSplit(uint256 indexed jobId, uint256 winners, uint256 share, uint256 remainder);
    /// @notice Emitted when a winning challenger is credited its share of the trainer's bond.
    event ShareClaimed(uint256 indexed gameId, address indexed challenger, uint256 amount);
    /// @notice Emitted when a commitment becomes final and the trainer is credited `amount`.
    event Finalized(uint256 indexed jobId, address indexed trainer, uint256 amount);
    /// @notice Emitted when `account` withdraws its credit.
    event Withdrawn(address indexed account, uint256 amount);

    // ------------------------------------------------------------------ storage

    /// @notice Jobs by id (ids start at 1).
    mapping(uint256 => Job) internal jobs;
    /// @notice Games by id (ids start at 1).
    mapping(uint256 => Game) internal games;
    /// @notice Wei each account may withdraw.
    mapping(address => uint256) public credits;
    /// @notice The number of jobs created; the last job's id.
    uint256 public jobCount;
    /// @notice The number of games created; the last game's id.
    uint256 public gameCount;

    // ------------------------------------------------------------------ jobs

    /// @notice Post a job; the value sent is the reward, held in escrow.
    /// @param terms The job's terms (see JobTerms).
    /// @return jobId The new job's id.
    function createJob(JobTerms calldata terms) external payable returns (uint256 jobId) {
        // INVARIANT: a job has at least one step, so every game has a step to isolate.
        if (terms.numSteps == 0) revert NoSteps();
        // INVARIANT: someone can always resolve an isolated step.
        if (terms.referee == address(0)) revert NoReferee();
        // INVARIANT: windows, clocks and bonds are positive, so every phase can end and every
        // side has something at stake.
        if (
            terms.challengeWindow == 0 || terms.clockPerSide == 0 || terms.refereeWindow == 0 || terms.trainerBond == 0
                || terms.challengerBond == 0
        ) revert ZeroTerm();

        jobId = ++jobCount;
        Job storage job = jobs[jobId];
        job.terms = terms;
        job.client = msg.sender;
        job.status = JobStatus.Open;
        job.reward = msg.value;
        emit JobCreated(jobId, msg.sender, terms.specHash, terms.numSteps, msg.value);
    }

    /// @notice Take back the reward of a job that no trainer committed to.
    /// @param jobId The job.
    function cancelJob(uint256 jobId) external {
        Job storage job = _job(jobId);
        // INVARIANT: only the client decides to withdraw its offer.
        if (msg.sender != job.client) revert Unauthorized(msg.sender, job.client);
        // INVARIANT: once a trainer committed, the reward is bound to the commitment's fate.
        if (job.status != JobStatus.Open) revert WrongJobStatus(jobId, job.status);
        job.status = JobStatus.Cancelled;
        credits[job.client] += job.reward;
        emit JobCancelled(jobId);
    }

    /// @notice Commit a tree of numSteps + 1 leaves with the trainer bond (the value sent).
    /// @param jobId The job.
    /// @param root The tree's root.
    /// @param size The tree's size; must be numSteps + 1.
    /// @param finalLeaf Leaf numSteps, the claimed final state.
    /// @param finalProof Its inclusion proof against `root`.
    /// @param leaf0Proof The inclusion proof of job.leaf0 at index 0 against `root`.
    function commit(
        uint256 jobId,
        bytes32 root,
        uint256 size,
        bytes32 finalLeaf,
        bytes32[] calldata finalProof,
        bytes32[] calldata leaf0Proof
    ) external payable {
        Job storage job = _job(jobId);
        // INVARIANT: a job holds at most one commitment.
        if (job.status != JobStatus.Open) revert WrongJobStatus(jobId, job.status);
        uint256 expected = uint256(job.terms.numSteps) + 1;
        // INVARIANT: a root is meaningless without its size; the size is fixed by the job.
        if (size != expected) revert WrongSize(expected, size);
        // INVARIANT: the trainer's stake is exactly the agreed bond.
        if (msg.value != job.terms.trainerBond) revert WrongValue(job.terms.trainerBond, msg.value);
        // INVARIANT: the final leaf every game starts from, and leaf 0, are in the trainer's tree.
        _requireEnds(root, size, job.terms.leaf0, finalLeaf, finalProof, leaf0Proof);

        job.status = JobStatus.Committed;
        job.trainer = msg.sender;
        job.committedAt = uint40(block.timestamp);
        job.root = root;
        job.finalLeaf = finalLeaf;
        emit Committed(jobId, msg.sender, root, size, finalLeaf);
    }

    /// @notice Challenge a commitment with the challenger bond (the value sent), opening a game.
    /// @param jobId The job.
    /// @param root The challenger's root over numSteps + 1 leaves.
    /// @param finalLeaf The challenger's leaf numSteps; must differ from the trainer's.
    /// @param finalProof Its proof against `root`.
    /// @param leaf0Proof The proof of job.leaf0 at index 0 against `root`.
    /// @param left The challenger's left child of its root (the raw leaf when it is one leaf;
    ///        ignored when numSteps = 1: the only step is isolated at once).
    /// @param right Its right child likewise.
    /// @return gameId The new game's id.
    function challenge(
        uint256 jobId,
        bytes32 root,
        bytes32 finalLeaf,
        bytes32[] calldata finalProof,
        bytes32[] calldata leaf0Proof,
        bytes32 left,
        bytes32 right
    ) external payable returns (uint256 gameId) {
        Job storage job = _job(jobId);
        _checkChallenge(jobId, job, finalLeaf);
        uint256 size = uint256(job.terms.numSteps) + 1;
        // INVARIANT: the disputed final leaf, and leaf 0, are in the challenger's own tree.
        _requireEnds(root, size, job.terms.leaf0, finalLeaf, finalProof, leaf0Proof);
        // INVARIANT: the children the trainer must answer are the challenger's root's.
        if (size > 2 && _parent(left, right, 0, size) != root) revert InvalidChildren(0, size);
        gameId = _openGame(jobId, job, root, finalLeaf, left, right);
    }

    /// @dev Store a new game of `job` (guards done) and start its clock, or isolate step 1 at once
    ///      when the trees have two leaves.
    function _openGame(uint256 jobId, Job storage job, bytes32 root, bytes32 finalLeaf, bytes32 left, bytes32 right)
        internal
        returns (uint256 gameId)
    {
        uint256 size = uint256(job.terms.numSteps) + 1;
        gameId = ++gameCount;
        Game storage game = games[gameId];
        game.challenger = msg.sender;
        game.jobId = uint64(jobId); // lossless: ids count transactions, far below 2^64
        game.root = root;
        game.end = uint48(size);
        game.size = uint48(size);
        game.clock = LibClock.start(job.terms.clockPerSide, block.timestamp, Side.Trainer);
        job.openGames += 1;
        if (size == 2) {
            emit Challenged(jobId, gameId, msg.sender, root, finalLeaf, bytes32(0), bytes32(0));
            // Two leaves, leaf 0 agreed: step 1 is the first difference.
            game.start = 1;
            _isolate(gameId, game, job.terms.leaf0, job.finalLeaf, finalLeaf);
        } else {
            emit Challenged(jobId, gameId, msg.sender, root, finalLeaf, left, right);
            game.status = GameStatus.Active;
            (game.node, game.left, game.right) = (job.root, left, right);
        }
    }

    // ------------------------------------------------------------------ games

    /// @notice Reveal the own children of the disputed node [start, end); the contract descends
    ///         into the leftmost child where they differ from the opponent's. Unless that child is
    ///         one leaf (the move isolates a step), also reveal the own children of that child,
    ///         which the opponent must answer. Children that are single leaves are given raw.
    /// @param gameId The game.
    /// @param children The mover's (left, right) children of [start, end).
    /// @param next The mover's (left, right) children of the node descended into (ignored when
    ///        that node is one leaf).
    /// @param preLeaf Leaf step - 1, when this move isolates `step` and the node had more than two
    ///        leaves or the descent went left (ignored otherwise: the pre-leaf is then the agreed
    ///        left child).
    /// @param preProof Its proof against the mover's root (ignored likewise).
    function move(
        uint256 gameId,
        bytes32[2] calldata children,
        bytes32[2] calldata next,
        bytes32 preLeaf,
        bytes32[] calldata preProof
    ) external {
        Game storage game = _game(gameId);
        Side mover = _checkMove(gameId, game);
        (bytes32 mine, bytes32 theirs, bool agreedLeftLeaf) = _descend(game, children[0], children[1]);
        game.clock = game.clock.pass(block.timestamp);
        if (game.end - game.start > 1) {
            _reveal(gameId, game, mover, mine, theirs, next);
            return;
        }
        if (agreedLeftLeaf) {
            preLeaf = children[0];
        } else {
            // start >= 1: leaf 0 agrees (commit and challenge proved it), so it never differs.
            // INVARIANT: the pre-leaf is in the mover's tree; leaves before `start` agree, so it
            // is the opponent's too.
            _requireProof(_root(game, mover), preLeaf, game.start - 1, game.size, preProof);
        }
        bool t = mover == Side.Trainer;
        _isolate(gameId, game, preLeaf, t ? mine : theirs, t ? theirs : mine);
    }

    /// @notice End a game whose side to move ran out of time; that side loses. Anyone may call.
    /// @param gameId The game.
    function timeout(uint256 gameId) external {
        Game storage game = _game(gameId);
        // INVARIANT: clocks only run during bisection.
        if (game.status != GameStatus.Active) revert WrongGameStatus(gameId, game.status);
        Clock clock = game.clock;
        // INVARIANT: a side loses on time only after using more than its whole budget.
        if (!clock.expired(block.timestamp)) revert ClockNotExpired(gameId, clock.remaining(block.timestamp));
        bool trainerWins = clock.turn() == Side.Challenger;
        _end(gameId, game, trainerWins ? GameStatus.TrainerWon : GameStatus.ChallengerWon, EndReason.Timeout);
    }

    /// @notice The referee's verdict on an isolated step.
    /// @param gameId The game.
    /// @param trainerWins True when the trainer's post-leaf is the correct result of the step.
    function resolve(uint256 gameId, bool trainerWins) external {
        Game storage game = _game(gameId);
        // INVARIANT: the referee judges exactly one isolated step, once.
        if (game.status != GameStatus.Isolated) revert WrongGameStatus(gameId, game.status);
        Job storage job = jobs[game.jobId];
        // INVARIANT: only the job's referee judges.
        if (msg.sender != job.terms.referee) revert Unauthorized(msg.sender, job.terms.referee);
        uint256 deadline = _refereeDeadline(game, job);
        // INVARIANT: after its deadline the referee's say has lapsed (refund applies).
        if (block.timestamp > deadline) revert RefereeDeadlinePassed(gameId, deadline);
        _end(gameId, game, trainerWins ? GameStatus.TrainerWon : GameStatus.ChallengerWon, EndReason.Referee);
    }

    /// @notice Refund the challenger's bond of an isolated game the referee did not resolve in
    ///         time; the trainer's bond stays with its commitment. Anyone may call.
    /// @param gameId The game.
    function refund(uint256 gameId) external {
        Game storage game = _game(gameId);
        // INVARIANT: only an isolated step waits for a referee.
        if (game.status != GameStatus.Isolated) revert WrongGameStatus(gameId, game.status);
        uint256 deadline = _refereeDeadline(game, jobs[game.jobId]);
        // INVARIANT: the referee keeps its whole window.
        if (block.timestamp <= deadline) revert RefereeDeadlineNotPassed(gameId, deadline);
        _end(gameId, game, GameStatus.Refunded, EndReason.RefereeMissedDeadline);
    }

    // ------------------------------------------------------------------ payouts

    /// @notice Credit the trainer its bond and the reward once its commitment stands: the window
    ///         has closed and every game has ended without the trainer losing. Anyone may call.
    /// @param jobId The job.
    function finalize(uint256 jobId) external {
        Job storage job = _job(jobId);
        // INVARIANT: only a live commitment becomes final (a void one never does).
        if (job.status != JobStatus.Committed) revert WrongJobStatus(jobId, job.status);
        uint256 closesAt = uint256(job.committedAt) + job.terms.challengeWindow;
        // INVARIANT: every auditor had the whole window to challenge.
        if (block.timestamp < closesAt) revert ChallengeWindowOpen(jobId, closesAt);
        // INVARIANT: an open game could still void the commitment.
        if (job.openGames != 0) revert GamesOpen(jobId, job.openGames);
        job.status = JobStatus.Final;
        uint256 amount = uint256(job.terms.trainerBond) + job.reward;
        credits[job.trainer] += amount;
        emit Finalized(jobId, job.trainer, amount);
    }

    /// @notice Credit a winning challenger its equal share of the void commitment's trainer bond.
    ///         Anyone may call; the share goes to the game's challenger.
    /// @param gameId A game the challenger won.
    function claimShare(uint256 gameId) external {
        Game storage game = _game(gameId);
        Job storage job = jobs[game.jobId];
        // INVARIANT: a share is paid once, to a winner, after the set of winners is final.
        if (game.status != GameStatus.ChallengerWon || game.shareClaimed || job.openGames != 0) revert NoShare(gameId);
        game.shareClaimed = true;
        // winners >= 1: this game is one of them.
        uint256 share = uint256(job.terms.trainerBond) / job.winners;
        credits[game.challenger] += share;
        emit ShareClaimed(gameId, game.challenger, share);
    }

    /// @notice Send the caller all its credit.
    function withdraw() external {
        uint256 amount = credits[msg.sender];
        // INVARIANT: an empty withdrawal is a mistake worth reporting.
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        credits[msg.sender] = 0; // before the call: a re-entrant withdraw finds nothing
        emit Withdrawn(msg.sender, amount);
        (bool sent,) = msg.sender.call{value: amount}("");
        // INVARIANT: a failed send reverts, restoring the credit.
        if (!sent) revert TransferFailed(msg.sender, amount);
    }

    // ------------------------------------------------------------------ views

    /// @notice A job, as stored.
    /// @param jobId The job.
    /// @return The job (all-zero with status None when it does not exist).
    function getJob(uint256 jobId) external view returns (Job memory) {
        return jobs[jobId];
    }

    /// @notice A game, as stored (the Clock as its packed uint112; see `timeLeft` for seconds).
    /// @param gameId The game.
    /// @return The game (all-zero with status None when it does not exist).
    function getGame(uint256 gameId) external view returns (Game memory) {
        return games[gameId];
    }

    /// @notice The side to move and its seconds left now, and the other side's stopped budget.
    /// @param gameId The game.
    /// @return turn The side to move.
    /// @return moverLeft Seconds the side to move has left (0 when it may be timed out or is at 0).
    /// @return otherLeft Seconds the other side has left.
    function timeLeft(uint256 gameId) external view returns (Side turn, uint256 moverLeft, uint256 otherLeft) {
        Clock clock = _game(gameId).clock;
        turn = clock.turn();
        moverLeft = clock.remaining(block.timestamp);
        otherLeft = clock.budget(turn == Side.Trainer ? Side.Challenger : Side.Trainer);
    }

    /// @notice When the referee's time to resolve game `gameId` ends (meaningful once isolated).
    /// @param gameId The game.
    /// @return The last second at which `resolve` is accepted.
    function refereeDeadline(uint256 gameId) external view returns (uint256) {
        Game storage game = _game(gameId);
        return _refereeDeadline(game, jobs[game.jobId]);
    }

    /// @notice Check an RFC 9162 inclusion proof the way the game does (for clients and tests).
    /// @param root The tree's root.
    /// @param leaf The step leaf.
    /// @param index Its 0-based position.
    /// @param size The tree's size.
    /// @param proof The audit path, bottom-up.
    /// @return Whether the proof is valid.
    function verifyInclusion(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        external
        pure
        returns (bool)
    {
        return MerkleVerifier.verify(root, leaf, index, size, proof);
    }

    // ------------------------------------------------------------------ internal

    function _job(uint256 jobId) internal view returns (Job storage job) {
        job = jobs[jobId];
        // INVARIANT: every job that exists has a status other than None.
        if (job.status == JobStatus.None) revert JobNotFound(jobId);
    }

    function _game(uint256 gameId) internal view returns (Game storage game) {
        game = games[gameId];
        // INVARIANT: every game that exists has a status other than None.
        if (game.status == GameStatus.None) revert GameNotFound(gameId);
    }

    /// @dev The clock stopped when the step was isolated, so its `since` is the isolation time.
    function _refereeDeadline(Game storage game, Job storage job) internal view returns (uint256) {
        return game.clock.since() + job.terms.refereeWindow;
    }

    /// @dev The guards of `challenge` on the job and the sender's stake.
    function _checkChallenge(uint256 jobId, Job storage job, bytes32 finalLeaf) internal view {
        // INVARIANT: only a live commitment can be challenged (not Open, Final, Void or Cancelled).
        if (job.status != JobStatus.Committed) revert WrongJobStatus(jobId, job.status);
        uint256 closesAt = uint256(job.committedAt) + job.terms.challengeWindow;
        // INVARIANT: no game starts after the window, so finalize can never race a new game.
        if (block.timestamp >= closesAt) revert ChallengeWindowClosed(jobId, closesAt);
        // INVARIANT: the challenger's stake is exactly the agreed bond.
        if (msg.value != job.terms.challengerBond) revert WrongValue(job.terms.challengerBond, msg.value);
        // INVARIANT: a game needs a differing leaf at hi from the start.
        if (finalLeaf == job.finalLeaf) revert SameFinalLeaf(finalLeaf);
    }

    /// @dev The guards of `move`; returns the mover.
    function _checkMove(uint256 gameId, Game storage game) internal view returns (Side mover) {
        // INVARIANT: moves happen only during bisection.
        if (game.status != GameStatus.Active) revert WrongGameStatus(gameId, game.status);
        Clock clock = game.clock;
        mover = clock.turn();
        address player = mover == Side.Trainer ? jobs[game.jobId].trainer : game.challenger;
        // INVARIANT: only the side to move moves, so each side's clock is charged for its own time.
        if (msg.sender != player) revert NotYourTurn(gameId, mover);
        // INVARIANT: a side out of time has lost; it cannot move any more.
        if (clock.expired(block.timestamp)) revert ClockExpired(gameId, mover);
    }

    /// @dev Check the mover's children (`left`, `right`) of the node against its own hash of it and
    ///      descend into the leftmost child where they differ from the opponent's. Returns the two
    ///      sides' values of that child and whether it is the right one past a single agreed leaf.
    function _descend(Game storage game, bytes32 left, bytes32 right)
        internal
        returns (bytes32 mine, bytes32 theirs, bool agreedLeftLeaf)
    {
        (uint256 start, uint256 end) = (game.start, game.end);
        uint256 k = _split(end - start);
        // INVARIANT: revealed children are the mover's own (its node is bound to its root).
        if (_parent(left, right, k, end - start) != game.node) revert InvalidChildren(start, end);
        if (left != game.left) {
            (game.end, mine, theirs) = (uint48(start + k), left, game.left);
        } else {
            // The nodes differ and the left children agree, so the right children differ.
            (game.start, mine, theirs, agreedLeftLeaf) = (uint48(start + k), right, game.right, k == 1);
        }
    }

    /// @dev Store the mover's children `next` of the node just descended into (where the mover's
    ///      hash is `mine`, the opponent's `theirs`) for the opponent to answer, and pass the move.
    function _reveal(uint256 gameId, Game storage game, Side mover, bytes32 mine, bytes32 theirs, bytes32[2] calldata next)
        internal
    {
        (uint256 start, uint256 end) = (game.start, game.end);
        // INVARIANT: the children the opponent must answer are the mover's own.
        if (_parent(next[0], next[1], 0, end - start) != mine) revert InvalidChildren(start, end);
        (game.node, game.left, game.right) = (theirs, next[0], next[1]);
        emit Moved(gameId, mover, start, end, next[0], next[1]);
    }

    /// @dev The root of `side`'s tree in `game`.
    function _root(Game storage game, Side side) internal view returns (bytes32) {
        return side == Side.Trainer ? jobs[game.jobId].root : game.root;
    }

    /// @dev RFC 9162's split of a node of `width` >= 2 leaves: the largest power of two below it.
    function _split(uint256 width) internal pure returns (uint256) {
        // Smear the highest set bit of width - 1 (< 2^48) down, then keep only that bit.
        uint256 x = width - 1;
        unchecked {
            x |= x >> 1;
            x |= x >> 2;
            x |= x >> 4;
            x |= x >> 8;
            x |= x >> 16;
            x |= x >> 32;
            return (x >> 1) + 1;
        }
    }

    /// @dev The hash of a node of `width` >= 2 leaves split at `k` (0: compute the split) from its
    ///      revealed children, a child of one leaf being given raw.
    function _parent(bytes32 left, bytes32 right, uint256 k, uint256 width) internal pure returns (bytes32) {
        if (k == 0) k = _split(width);
        if (k == 1) left = MerkleVerifier.leafNode(left);
        if (width - k == 1) right = MerkleVerifier.leafNode(right);
        return MerkleVerifier.innerNode(left, right);
    }

    /// @dev Revert unless the proofs show `finalLeaf` and `leaf0` at both ends of the tree (`root`, `size`).
    function _requireEnds(
        bytes32 root,
        uint256 size,
        bytes32 leaf0,
        bytes32 finalLeaf,
        bytes32[] calldata finalProof,
        bytes32[] calldata leaf0Proof
    ) internal pure {
        _requireProof(root, finalLeaf, size - 1, size, finalProof);
        _requireProof(root, leaf0, 0, size, leaf0Proof);
    }

    /// @dev Revert unless `proof` shows `leaf` at `index` in the tree (`root`, `size`).
    function _requireProof(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        internal
        pure
    {
        if (!MerkleVerifier.verify(root, leaf, index, size, proof)) revert InvalidProof(index, leaf);
    }

    /// @dev Record the isolated step `game.start` and its leaves; the clock's `since` is now the
    ///      isolation time.
    function _isolate(uint256 gameId, Game storage game, bytes32 preLeaf, bytes32 trainerLeaf, bytes32 challengerLeaf)
        internal
    {
        game.status = GameStatus.Isolated;
        (game.node, game.left, game.right) = (preLeaf, trainerLeaf, challengerLeaf);
        uint256 deadline = block.timestamp + jobs[game.jobId].terms.refereeWindow;
        emit StepIsolated(gameId, game.start, preLeaf, trainerLeaf, challengerLeaf, deadline);
    }

    /// @dev Apply a game's outcome to credits and to its job (effects only; nothing is sent).
    function _end(uint256 gameId, Game storage game, GameStatus outcome, EndReason reason) internal {
        game.status = outcome;
        Job storage job = jobs[game.jobId];
        uint256 bond = job.terms.challengerBond;
        if (outcome == GameStatus.TrainerWon) {
            credits[job.trainer] += bond;
        } else {
            credits[game.challenger] += bond;
        }
        // Cannot underflow: this game was counted open when it started and ends once.
        job.openGames -= 1;
        emit GameEnded(gameId, game.jobId, outcome, reason);

        if (outcome == GameStatus.ChallengerWon) {
            job.winners += 1;
            if (job.status == JobStatus.Committed) {
                job.status = JobStatus.Void;
                credits[job.client] += job.reward;
                emit CommitmentVoided(game.jobId, gameId);
            }
        }
        if (job.status == JobStatus.Void && job.openGames == 0) {
            // The set of winners is final (a void job takes no challenge): fix the split.
            uint256 share = uint256(job.terms.trainerBond) / job.winners;
            uint256 remainder = uint256(job.terms.trainerBond) - share * job.winners;
            credits[job.client] += remainder;
            emit BondSplit(game.jobId, job.winners, share, remainder);
        }
    }
}

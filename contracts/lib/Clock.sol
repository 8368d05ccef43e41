// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;

/// @notice The two sides of a verification game.
enum Side {
    Trainer,
    Challenger
}

/// @notice A chess clock for two sides, packed in 112 bits:
///         [turn: 8 | since: 40 | trainerLeft: 32 | challengerLeft: 32] (high to low).
/// @dev `since` is when the side to move got the move; the side to move has
///      `budget(turn) - (now - since)` seconds left; the other side's clock is stopped. 40-bit
///      timestamps last until the year 36812; 32-bit budgets hold up to 136 years. 112 bits so
///      that a game's whole mutable state (lo, hi, size, clock) fits one storage slot.
type Clock is uint112;

using LibClock for Clock global;

/// @title LibClock
/// @notice Reading and advancing a `Clock` (in the spirit of Optimism's LibClock).
library LibClock {
    uint256 private constant MASK32 = (1 << 32) - 1;
    uint256 private constant MASK40 = (1 << 40) - 1;
    uint256 private constant TRAINER_SHIFT = 32; // above challengerLeft
    uint256 private constant SINCE_SHIFT = 64; // above two 32-bit budgets
    uint256 private constant TURN_SHIFT = 104; // above since (64 + 40)

    /// @notice A clock where each side has `budget` seconds and `first` is to move from `at`.
    /// @param budget Seconds per side.
    /// @param at The timestamp the first move's time starts from.
    /// @param first The side to move first.
    function start(uint32 budget, uint256 at, Side first) internal pure returns (Clock) {
        return pack(first, at, budget, budget);
    }

    /// @notice The side to move.
    function turn(Clock c) internal pure returns (Side) {
        return Side(uint8(Clock.unwrap(c) >> TURN_SHIFT));
    }

    /// @notice When the side to move got the move (or, once a game stopped, when it stopped).
    function since(Clock c) internal pure returns (uint256) {
        return (Clock.unwrap(c) >> SINCE_SHIFT) & MASK40;
    }

    /// @notice Seconds `side` had left when the move last changed hands.
    /// @param c The clock.
    /// @param side Whose budget.
    function budget(Clock c, Side side) internal pure returns (uint256) {
        uint256 shift = side == Side.Trainer ? TRAINER_SHIFT : 0;
        return (Clock.unwrap(c) >> shift) & MASK32;
    }

    /// @notice Seconds the side to move has left at time `at` (zero once it has run out).
    /// @param c The clock.
    /// @param at A timestamp not before `since`.
    function remaining(Clock c, uint256 at) internal pure returns (uint256) {
        uint256 elapsed = at - c.since();
        uint256 b = c.budget(c.turn());
        return elapsed >= b ? 0 : b - elapsed;
    }

    /// @notice True when the side to move has used more than its budget at time `at`; a side may
    ///         still move at the exact second its budget reaches zero.
    /// @param c The clock.
    /// @param at A timestamp not before `since`.
    function expired(Clock c, uint256 at) internal pure returns (bool) {
        return at - c.since() > c.budget(c.turn());
    }

    /// @notice The clock after the side to move moved at `at`: its time is charged and the move
    ///         passes to the other side. The caller has checked `!expired(at)`.
    /// @param c The clock.
    /// @param at The move's timestamp.
    function pass(Clock c, uint256 at) internal pure returns (Clock) {
        Side mover = c.turn();
        // Cannot underflow: the caller checked at - since <= budget(mover).
        uint256 left = c.budget(mover) - (at - c.since());
        Side next = mover == Side.Trainer ? Side.Challenger : Side.Trainer;
        return mover == Side.Trainer
            ? pack(next, at, left, c.budget(Side.Challenger))
            : pack(next, at, c.budget(Side.Trainer), left);
    }

    /// @notice Pack the fields. Budgets never grow (they start as a uint32 and only shrink), so
    ///         masking them loses nothing; `at` is a block timestamp (< 2^40 until 36812).
    function pack(Side t, uint256 at, uint256 trainerLeft, uint256 challengerLeft) private pure returns (Clock) {
        return Clock.wrap(
            uint112(
                (uint256(t) << TURN_SHIFT) | ((at & MASK40) << SINCE_SHIFT) | ((trainerLeft & MASK32) << TRAINER_SHIFT)
                    | (challengerLeft & MASK32)
            )
        );
    }
}

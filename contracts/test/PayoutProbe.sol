// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;

import {VerificationGame} from "../VerificationGame.sol";

/// @title PayoutProbe
/// @notice Test-only client contract that earns a credit (by posting and cancelling a job) and
///         then withdraws it while rejecting the payment or re-entering `withdraw`, to test that
///         withdrawals are pull-only, all-or-nothing and re-entrancy-safe. Never deployed for real.
contract PayoutProbe {
    /// @notice What `receive` does with an incoming payment.
    enum Mode {
        Accept,
        Reject,
        Reenter
    }

    /// @notice Thrown by `receive` in Reject mode.
    error Rejected();

    /// @notice The game under test.
    VerificationGame public immutable game;
    /// @notice Current behaviour of `receive`.
    Mode public mode;
    /// @notice How many payments `receive` has accepted.
    uint256 public received;

    /// @param game_ The game under test.
    constructor(VerificationGame game_) {
        game = game_;
    }

    /// @notice Post a job with the value sent as reward and cancel it at once: a credit for us.
    /// @param terms The job's terms.
    function earnCredit(VerificationGame.JobTerms calldata terms) external payable {
        uint256 jobId = game.createJob{value: msg.value}(terms);
        game.cancelJob(jobId);
    }

    /// @notice Set how `receive` behaves, then withdraw our credit.
    /// @param m The behaviour.
    function withdrawWith(Mode m) external {
        mode = m;
        game.withdraw();
    }

    /// @notice Accept, reject or re-enter, per `mode`.
    receive() external payable {
        if (mode == Mode.Reject) revert Rejected();
        if (mode == Mode.Reenter) game.withdraw();
        received += 1;
    }
}

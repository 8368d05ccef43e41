"""Chain-side commands: deploy, job (create/finalize/cancel), commit, challenge, resolve, status,
withdraw, watch.

This module only turns options into role objects (protocol.roles, protocol.agents), calls them and
maps errors to exit codes: 0 success; 2 bad input (a file, a key, a job that does not allow the
call, the wrong chain); 3 the chain refused or failed (a reverted transaction with its decoded
custom error, an unfunded key, an RPC node that does not answer after retries); 130 interrupted.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

ETHER = 10**18

EPILOG_KEYS = ("Keys: $VTRAIN_PRIVATE_KEY (hex) or --keystore FILE (password from $VTRAIN_KEYSTORE_PASSWORD or a "
               "hidden prompt). Keys are never printed.")


# ---------------------------------------------------------------------------------------------- errors


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def chain_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One line on stderr and a documented exit code for every deliberate failure; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import requests

        from protocol.chain.errors import ChainError
        from protocol.roles.network import WrongChainError
        from vtrain.errors import VtrainError

        try:
            return fn(*args, **kwargs)
        except WrongChainError as e:
            _fail(str(e), 2)
        except ChainError as e:
            _fail(str(e), 3)
        except VtrainError as e:
            _fail(str(e), 2)
        except requests.RequestException as e:
            _fail(f"lost the RPC node ({e.__class__.__name__}); nothing was lost: rerun the command once it answers", 3)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


# ---------------------------------------------------------------------------------------------- shared options


def _eth(text: str) -> int:
    """Ether amounts as decimal strings, exactly (no float rounding of wei)."""
    from decimal import Decimal, InvalidOperation

    try:
        wei = Decimal(text) * ETHER
    except InvalidOperation:
        raise click.BadParameter(f"{text!r} is not an amount of ether") from None
    if wei < 0 or wei != wei.to_integral_value():
        raise click.BadParameter(f"{text!r} is not a non-negative amount with at most 18 decimals")
    return int(wei)


class EtherType(click.ParamType):
    name = "ETH"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        return value if isinstance(value, int) else _eth(str(value))


ETH = EtherType()


def chain_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--rpc, --chain-id, --keystore, --contract, --deployments and --json, defined once for every command."""
    options = [
        click.option("--rpc", envvar="VTRAIN_RPC_URL", show_envvar=True, default=None, metavar="URL",
                     help="JSON-RPC node (anvil, a testnet). Default: an embedded eth-tester chain that lives only "
                          "inside this one command (use `vtrain demo` for a whole story on it)."),
        click.option("--chain-id", type=int, default=None, envvar="VTRAIN_CHAIN_ID", show_envvar=True,
                     help="Refuse to act unless the node is on this chain id."),
        click.option("--keystore", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     envvar="VTRAIN_KEYSTORE", show_envvar=True,
                     help="Encrypted V3 keystore holding the signing key (else $VTRAIN_PRIVATE_KEY)."),
        click.option("--contract", default=None, metavar="ADDRESS",
                     help="VerificationGame address (default: the one `vtrain deploy` recorded for this chain)."),
        click.option("--deployments", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     envvar="VTRAIN_DEPLOYMENTS", show_envvar=True,
                     help="Where deployments are recorded per chain id [default: ./vtrain-deployments.json]."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass
class Session:
    """What a chain command works with: the node, the signing account and (usually) the contract."""

    w3: Any
    account: Any
    rpc: str | None
    deployments: Path | None
    contract_address: str | None
    as_json: bool
    start_block: int = 0  # the contract's deployment block when recorded: event scans start there

    @functools.cached_property
    def binding(self) -> Any:
        from protocol.chain import VerificationGame
        from protocol.deployments import DeploymentError, lookup

        if self.contract_address:
            from web3 import Web3

            if not Web3.is_address(self.contract_address):
                raise click.BadParameter(f"{self.contract_address!r} is not an address", param_hint="--contract")
            if not bytes(self.w3.eth.get_code(Web3.to_checksum_address(self.contract_address))):
                raise DeploymentError(f"no contract at {self.contract_address} on chain {self.w3.eth.chain_id}")
            return VerificationGame(self.w3, self.contract_address)
        if self.rpc is None:
            raise DeploymentError("the embedded chain starts empty in every command: pass --rpc URL of a node where "
                                  "`vtrain deploy` ran (e.g. one started by `vtrain node`), or run `vtrain demo`")
        dep = lookup(self.w3, self.deployments)
        self.start_block = dep.block
        return VerificationGame(self.w3, dep.address)

    def role(self, cls: type, *args: Any, **kw: Any) -> Any:
        return cls(self.binding, self.account, *args, **kw)

    def out(self, text: str, data: dict) -> None:
        click.echo(json.dumps(data, indent=2, default=str) if self.as_json else text)


def open_session(rpc: str | None, chain_id: int | None, keystore: Path | None, contract: str | None,
                 deployments: Path | None, as_json: bool, need_key: bool = True) -> Session:
    from protocol.keys import load_account
    from protocol.roles.network import connect, fund

    w3 = connect(rpc, expect_chain_id=chain_id)
    account = None
    if need_key:
        account = load_account(keystore, prompt=lambda: click.prompt("keystore password", hide_input=True, err=True))
        if rpc is None:
            fund(w3, [account.address], 1000 * ETHER)  # a throwaway chain: give the key something to spend
    return Session(w3, account, rpc, deployments, contract, as_json)


def session_args(kw: dict) -> dict:
    return {k: kw.pop(k) for k in ("rpc", "chain_id", "keystore", "contract", "deployments", "as_json")}


def _tx_line(tx: Any) -> str:
    return f"{tx.label}: tx {tx.hash} (block {tx.block}, gas {tx.gas_used:,})"


def _tx_json(tx: Any) -> dict:
    return {"label": tx.label, "tx": tx.hash, "block": tx.block, "gas": tx.gas_used}


# ---------------------------------------------------------------------------------------------- commands


@click.command(epilog=EPILOG_KEYS)
@chain_options
@chain_errors
def deploy(**kw: Any) -> None:
    """Deploy the verification-game contract and record it for this chain id.

    Later commands on the same chain find the contract in the deployments file. Signs locally, so
    any RPC works (a testnet, anvil standing in for one).

    \b
    Examples:
      vtrain node &                                        # a local anvil; prints its URL
      VTRAIN_PRIVATE_KEY=0x… vtrain deploy --rpc http://127.0.0.1:8545
      vtrain deploy --rpc $URL --keystore key.json --chain-id 11155111
    """
    from protocol.chain import VerificationGame
    from protocol.deployments import Deployment, code_hash, record

    s = open_session(**session_args(kw))
    binding = VerificationGame.deploy(s.w3, s.account)
    receipt_block = s.w3.eth.block_number
    dep = Deployment(s.w3.eth.chain_id, binding.address, receipt_block, code_hash(s.w3, binding.address))
    if s.rpc is not None:
        record(dep, s.deployments)
    s.out(f"VerificationGame deployed at {binding.address} on chain {dep.chain_id} (block {receipt_block})",
          {"address": binding.address, "chain_id": dep.chain_id, "block": receipt_block})


@click.group()
def job() -> None:
    """Create, finalize and cancel training jobs.

    \b
    Examples:
      vtrain job create examples/logreg.toml --referee 0xRef… --reward 1 --rpc $URL
      vtrain job finalize 1 --rpc $URL
    """


@job.command("create", epilog=EPILOG_KEYS)
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--referee", required=True, metavar="ADDRESS", help="Who replays isolated steps and resolves games.")
@click.option("--reward", type=ETH, default="1", show_default=True, help="Reward in ether, escrowed with the job.")
@click.option("--trainer-bond", type=ETH, default="1", show_default=True, help="Ether a trainer locks to commit.")
@click.option("--challenger-bond", type=ETH, default="0.5", show_default=True, help="Ether each challenger locks.")
@click.option("--challenge-window", type=click.IntRange(1), default=86400, show_default=True,
              help="Seconds after the commitment during which anyone may challenge.")
@click.option("--clock", "clock_per_side", type=click.IntRange(1), default=3600, show_default=True,
              help="Chess-clock seconds each side of a game has in total.")
@click.option("--referee-window", type=click.IntRange(1), default=86400, show_default=True,
              help="Seconds the referee has to resolve an isolated step.")
@chain_options
@chain_errors
def create(spec: Path, referee: str, reward: int, trainer_bond: int, challenger_bond: int, challenge_window: int,
           clock_per_side: int, referee_window: int, **kw: Any) -> None:
    """Post a job to train SPEC, with the reward in escrow.

    The job fixes the spec's hash, its initial leaf (computed here from the spec), the number of
    steps, the referee, the windows, the clock and the bonds.

    \b
    Examples:
      vtrain job create examples/logreg.toml --referee 0x70997970C51812dc3A010C7d01b50e0d17dc79C8 --rpc $URL
    """
    from web3 import Web3

    from protocol.roles import Client, terms_for
    from vtrain.spec import load_spec

    if not Web3.is_address(referee):
        raise click.BadParameter(f"{referee!r} is not an address", param_hint="--referee")
    s = open_session(**session_args(kw))
    terms = terms_for(load_spec(spec), referee=Web3.to_checksum_address(referee), challenge_window=challenge_window,
                      clock_per_side=clock_per_side, referee_window=referee_window, trainer_bond=trainer_bond,
                      challenger_bond=challenger_bond)
    job_id, tx = s.role(Client).create_job(terms, reward)
    s.out(f"job {job_id} created. {_tx_line(tx)}", {"job": job_id, **_tx_json(tx)})


@job.command("finalize", epilog=EPILOG_KEYS)
@click.argument("job_id", type=click.IntRange(1), metavar="JOB")
@chain_options
@chain_errors
def finalize(job_id: int, **kw: Any) -> None:
    """Make a commitment final after its window (anyone may call); credits the trainer.

    \b
    Examples:
      vtrain job finalize 1 --rpc $URL
    """
    from protocol.roles import Role

    s = open_session(**session_args(kw))
    tx = s.role(Role).finalize(job_id)
    s.out(_tx_line(tx), _tx_json(tx))


@job.command("cancel", epilog=EPILOG_KEYS)
@click.argument("job_id", type=click.IntRange(1), metavar="JOB")
@chain_options
@chain_errors
def cancel(job_id: int, **kw: Any) -> None:
    """Take back the reward of a job nobody committed to (client only).

    \b
    Examples:
      vtrain job cancel 1 --rpc $URL
    """
    from protocol.roles import Client

    s = open_session(**session_args(kw))
    tx = s.role(Client).cancel(job_id)
    s.out(_tx_line(tx), _tx_json(tx))


@click.command(epilog=EPILOG_KEYS)
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@click.option("--job", "job_id", type=click.IntRange(1), required=True, help="The job to commit to.")
@chain_options
@chain_errors
def commit(run: Path, job_id: int, **kw: Any) -> None:
    """Commit a run's Merkle root to a job, with the trainer bond.

    Checks first that the run trains the job's spec, starts from its leaf 0 and has its number of
    steps. Publish the run directory (any static HTTP server) so auditors and the referee can read it.

    \b
    Examples:
      vtrain train examples/logreg.toml --out runs/a && vtrain commit runs/a --job 1 --rpc $URL
    """
    from protocol.roles import Trainer
    from vtrain.run import Run

    s = open_session(**session_args(kw))
    trainer = s.role(Trainer, Run.open(run))
    tx = trainer.commit(job_id)
    s.out(f"committed root 0x{trainer.root.hex()} (size {trainer.size}) to job {job_id}. {_tx_line(tx)}",
          {"job": job_id, "root": "0x" + trainer.root.hex(), "size": trainer.size, **_tx_json(tx)})


@click.command(epilog=EPILOG_KEYS)
@click.option("--job", "job_id", type=click.IntRange(1), required=True, help="The job whose commitment to challenge.")
@click.option("--audit", "audit_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The --out directory of `vtrain audit` (the auditor's own leaves).")
@chain_options
@chain_errors
def challenge(job_id: int, audit_dir: Path, **kw: Any) -> None:
    """Challenge a commitment with an audit's root, opening a bisection game.

    Then run `vtrain watch --role auditor` to play the game to its end.

    \b
    Examples:
      vtrain audit run/ --device emu:splitk8-tree --out audit/
      vtrain challenge --job 1 --audit audit/ --rpc $URL
    """
    from protocol.roles import Auditor, read_audit_leaves

    s = open_session(**session_args(kw))
    game_id, tx = s.role(Auditor, read_audit_leaves(audit_dir)).challenge(job_id)
    s.out(f"game {game_id} opened against job {job_id}. {_tx_line(tx)}", {"job": job_id, "game": game_id, **_tx_json(tx)})


@click.command(epilog=EPILOG_KEYS)
@click.option("--game", "game_id", type=click.IntRange(1), required=True, help="The game whose isolated step to judge.")
@click.option("--run", "source", required=True, metavar="DIR|URL", help="The trainer's run: a directory or an HTTP(S) URL.")
@click.option("--device", "-d", default="cpu", show_default=True, envvar="VTRAIN_DEVICE", show_envvar=True,
              help="Device to replay the step on.")
@click.option("--dry-run", is_flag=True, help="Judge and print the verdict without sending it.")
@chain_options
@chain_errors
def resolve(game_id: int, source: str, device: str, dry_run: bool, **kw: Any) -> None:
    """Referee: replay a game's isolated step and resolve the game.

    The step is replayed from the trainer's state before it with the trainer's rounding log; the
    trainer wins iff the replayed leaf equals its own. Files that contradict the trainer's
    commitment lose it the game; files that cannot be fetched are an error (try again).

    \b
    Examples:
      vtrain resolve --game 1 --run http://trainer.example/run/ --rpc $URL
    """
    from protocol.roles import Referee
    from protocol.runsource import RunSource

    s = open_session(**session_args(kw))
    referee = s.role(Referee)
    with _spinner(f"replaying the isolated step of game {game_id}", s.as_json):
        verdict = referee.judge(game_id, RunSource(source), device)
    winner = "trainer" if verdict.trainer_wins else "challenger"
    data = {"game": game_id, "step": verdict.step, "trainer_wins": verdict.trainer_wins, "reason": verdict.reason,
            "seconds": round(verdict.seconds, 3)}
    if dry_run:
        s.out(f"step {verdict.step}: {winner} wins ({verdict.reason}); not sent (--dry-run)", data)
        return
    tx = referee.resolve(verdict)
    s.out(f"step {verdict.step}: {winner} wins ({verdict.reason}). {_tx_line(tx)}", {**data, **_tx_json(tx)})


@click.command()
@click.option("--job", "job_id", type=click.IntRange(1), required=True, help="The job to show.")
@chain_options
@chain_errors
def status(job_id: int, **kw: Any) -> None:
    """Show a job, its commitment and its games as a table.

    \b
    Examples:
      vtrain status --job 1 --rpc $URL
      vtrain status --job 1 --rpc $URL --json | jq .games
    """
    s = open_session(**session_args(kw), need_key=False)
    job_view = s.binding.job(job_id)
    if job_view.status == 0:
        raise click.BadParameter(f"job {job_id} does not exist on contract {s.binding.address}", param_hint="--job")
    logs = s.binding.contract.events.Challenged.get_logs(from_block=s.start_block, argument_filters={"jobId": job_id})
    games = [s.binding.game(int(log["args"]["gameId"])) for log in logs]
    data = _status_json(job_view, games)
    if s.as_json:
        s.out("", data)
        return
    _print_status(data)


def _status_json(job_view: Any, games: list) -> dict:
    t = job_view.terms
    hx = lambda b: "0x" + b.hex()  # noqa: E731
    return {
        "job": job_view.job_id, "status": job_view.status.name, "client": job_view.client,
        "spec_hash": hx(t.spec_hash), "leaf0": hx(t.leaf0), "steps": t.num_steps, "referee": t.referee,
        "reward_wei": job_view.reward, "trainer_bond_wei": t.trainer_bond, "challenger_bond_wei": t.challenger_bond,
        "challenge_window_s": t.challenge_window, "clock_per_side_s": t.clock_per_side,
        "referee_window_s": t.referee_window, "trainer": job_view.trainer, "root": hx(job_view.root),
        "final_leaf": hx(job_view.final_leaf), "committed_at": job_view.committed_at,
        "challenge_closes_at": job_view.challenge_closes_at if job_view.committed_at else None,
        "open_games": job_view.open_games,
        "games": [{"game": g.game_id, "challenger": g.challenger, "status": g.status.name, "lo": g.lo, "hi": g.hi,
                   "turn": g.turn.name, "trainer_left_s": g.trainer_left, "challenger_left_s": g.challenger_left,
                   "isolated_step": g.isolated_step} for g in games],
    }


def _print_status(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"job {data['job']}", show_header=False)
    for key in ("status", "client", "spec_hash", "leaf0", "steps", "referee", "reward_wei", "trainer_bond_wei",
                "challenger_bond_wei", "challenge_window_s", "clock_per_side_s", "referee_window_s", "trainer", "root",
                "final_leaf", "committed_at", "challenge_closes_at", "open_games"):
        table.add_row(key, str(data[key]))
    console.print(table)
    if data["games"]:
        games = Table(title="games")
        for col in ("game", "challenger", "status", "lo", "hi", "turn", "trainer_left_s", "challenger_left_s",
                    "isolated_step"):
            games.add_column(col)
        for g in data["games"]:
            games.add_row(*(str(g[c]) for c in ("game", "challenger", "status", "lo", "hi", "turn", "trainer_left_s",
                                                 "challenger_left_s", "isolated_step")))
        console.print(games)
    else:
        console.print("no games")


@click.command(epilog=EPILOG_KEYS)
@click.option("--claim", "claims", multiple=True, type=click.IntRange(1), metavar="GAME",
              help="First claim the share of the trainer's bond from this won game. Repeatable.")
@chain_options
@chain_errors
def withdraw(claims: tuple[int, ...], **kw: Any) -> None:
    """Withdraw what the contract owes this account (bonds, rewards, shares).

    \b
    Examples:
      vtrain withdraw --rpc $URL
      vtrain withdraw --claim 3 --rpc $URL     # an auditor that won game 3
    """
    from protocol.roles import Role

    s = open_session(**session_args(kw))
    role = s.role(Role)
    txs = [role.claim_share(g) for g in claims]
    txs.append(role.withdraw())
    s.out("\n".join(_tx_line(t) for t in txs), {"txs": [_tx_json(t) for t in txs]})


def _parse_runs(values: tuple[str, ...]) -> dict[int, str]:
    runs = {}
    for v in values:
        job_text, sep, location = v.partition("=")
        if not sep or not job_text.isdigit() or not location:
            raise click.BadParameter(f"{v!r}: expected JOB=DIR_OR_URL", param_hint="--run")
        runs[int(job_text)] = location
    return runs


@click.command(epilog=EPILOG_KEYS)
@click.option("--role", "role_name", type=click.Choice(["trainer", "auditor", "referee"]), required=True,
              help="Which role's agent to run.")
@click.option("--state", "state_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The agent's state file (games, signed transactions); reuse it to resume after a restart.")
@click.option("--job", "job_id", type=click.IntRange(1), default=None, help="Trainer/auditor: the job to work on.")
@click.option("--run", "runs", multiple=True, metavar="DIR|URL|JOB=DIR|URL",
              help="Trainer: its run directory. Auditor: the trainer's run (directory or URL) to audit. "
                   "Referee: JOB=LOCATION of each job's trainer run (repeatable).")
@click.option("--audit", "audit_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Auditor: directory of its audit (written there if missing, reused if present).")
@click.option("--device", "-d", default="cpu", show_default=True, envvar="VTRAIN_DEVICE", show_envvar=True,
              help="Auditor/referee: device to replay on.")
@click.option("--no-commit", is_flag=True, help="Trainer: defend an existing commitment, do not commit.")
@click.option("--poll", type=click.FloatRange(0.01), default=0.5, show_default=True, help="Seconds between ticks.")
@click.option("--max-seconds", type=click.FloatRange(0), default=None,
              help="Stop after this long (exit 1 if the work is not done); default: until done (referee: forever).")
@chain_options
@chain_errors
def watch(role_name: str, state_path: Path, job_id: int | None, runs: tuple[str, ...], audit_dir: Path | None,
          device: str, no_commit: bool, poll: float, max_seconds: float | None, **kw: Any) -> None:
    """Run a role's agent: answer games as events arrive, until the work is settled.

    A trainer commits (unless --no-commit), answers every challenge, finalizes and withdraws. An
    auditor audits the committed run (or uses --audit), challenges if its root differs, plays,
    claims its share and withdraws. A referee judges every step isolated in a job naming it. The
    state file is written before every transaction: kill the agent at any time and start it again
    with the same --state, it resumes and sends nothing twice.

    \b
    Examples:
      vtrain watch --role trainer --job 1 --run runs/a --state trainer.json --rpc $URL
      vtrain watch --role auditor --job 1 --run http://host:8000/a/ --audit audit/ -d emu:splitk8-tree \\
                   --state auditor.json --rpc $URL
      vtrain watch --role referee --run 1=http://host:8000/a/ --state referee.json --rpc $URL
    """
    from protocol.agents.agent import AuditorAgent, RefereeAgent, TrainerAgent
    from protocol.agents.state import AgentState
    from protocol.roles import Auditor, Referee, Trainer
    from protocol.runsource import RunSource
    from vtrain.run import Run

    if role_name in ("trainer", "auditor") and job_id is None:
        raise click.UsageError(f"--role {role_name} needs --job")
    if role_name == "trainer" and len(runs) != 1:
        raise click.UsageError("--role trainer needs exactly one --run (its run directory)")
    if role_name == "auditor" and len(runs) > 1:
        raise click.UsageError("--role auditor takes at most one --run (the trainer's run)")
    if role_name == "auditor" and not runs and audit_dir is None:
        raise click.UsageError("--role auditor needs --run (to audit) or --audit (an existing audit)")
    referee_runs = _parse_runs(runs) if role_name == "referee" else {}
    s = open_session(**session_args(kw))
    binding = s.binding
    state = AgentState.load(state_path, role=role_name, account=s.account.address, contract=binding.address,
                            chain_id=s.w3.eth.chain_id, start_block=s.start_block)
    log = click.echo if not s.as_json else (lambda m: click.echo(json.dumps({"log": m})))
    agent: Any
    if role_name == "trainer":
        agent = TrainerAgent(Trainer(binding, s.account, Run.open(runs[0]), journal=state), state, job_id,
                             commit=not no_commit, log=log)
    elif role_name == "auditor":
        out = audit_dir or state_path.with_suffix(".audit")
        source = RunSource(runs[0], cache=state_path.with_suffix(".run")) if runs else None
        agent = AuditorAgent(Auditor(binding, s.account, journal=state), state, job_id, out, source, device, log=log,
                             progress=None if s.as_json else _audit_bar)
    else:
        sources = {j: RunSource(loc, cache=state_path.with_suffix(f".job{j}")) for j, loc in referee_runs.items()}
        agent = RefereeAgent(Referee(binding, s.account, journal=state), state, sources, device, log=log)
    log(f"{role_name} agent {s.account.address} on contract {binding.address}, state {state_path}")
    done = agent.run(poll_s=poll, max_seconds=max_seconds)
    if not done and role_name != "referee":
        _fail(f"{role_name}: not done after {max_seconds} s; rerun with the same --state to continue", 1)


def _audit_bar(total: int) -> Callable[[int, Any], None]:
    """A rich progress bar on stderr for an audit of `total` steps; it closes itself at the last one."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("audit"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True))
    task = bar.add_task("audit", total=total)
    bar.start()

    def update(t: int, _: Any) -> None:
        bar.update(task, completed=t)
        if t >= total:
            bar.stop()
    return update


class _spinner:
    """A rich spinner on stderr for a long step (silent with --json)."""

    def __init__(self, text: str, quiet: bool) -> None:
        self.text, self.quiet, self._status = text, quiet, None

    def __enter__(self) -> "_spinner":
        if not self.quiet:
            from rich.console import Console

            self._status = Console(stderr=True).status(self.text)
            self._status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

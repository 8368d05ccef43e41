"""Where a role's signing key comes from: the environment or an encrypted keystore file.

Keys are only ever held as eth-account `LocalAccount` objects and transactions are signed locally,
so the same code works against eth-tester, anvil and a remote RPC that holds no accounts. Nothing
here prints, logs or formats a private key; error messages name the source (variable or file), never
its content. The library does not prompt: the CLI passes a `password` callback that asks with a
hidden prompt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from eth_account import Account
from eth_account.signers.local import LocalAccount

from vtrain.errors import VtrainError

KEY_ENV = "VTRAIN_PRIVATE_KEY"
PASSWORD_ENV = "VTRAIN_KEYSTORE_PASSWORD"


class KeyConfigError(VtrainError):
    """No usable signing key: missing, malformed, or a keystore that does not decrypt."""


def account_from_hex(key: str, source: str) -> LocalAccount:
    """A LocalAccount from a hex private key; `source` names where it came from for errors."""
    text = key.strip()
    try:
        return Account.from_key(text if text.startswith("0x") else "0x" + text)
    except (ValueError, TypeError):
        # The key itself must not appear in the message, not even a prefix of it.
        raise KeyConfigError(f"{source} is not a 32-byte hex private key") from None


def load_keystore(path: Path, password: str | None = None,
                  prompt: Callable[[], str] | None = None) -> LocalAccount:
    """Decrypt an Ethereum V3 keystore file.

    The password comes from `password`, else $VTRAIN_KEYSTORE_PASSWORD, else `prompt()` (the CLI's
    hidden prompt); with none of them this raises rather than block.
    """
    try:
        blob = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise KeyConfigError(f"keystore file {path} does not exist") from None
    except (OSError, ValueError) as e:
        raise KeyConfigError(f"keystore file {path} is not readable JSON ({e.__class__.__name__})") from None
    if password is None:
        password = os.environ.get(PASSWORD_ENV)
    if password is None:
        if prompt is None:
            raise KeyConfigError(f"keystore {path} needs a password: set {PASSWORD_ENV} or run interactively")
        password = prompt()
    try:
        return Account.from_key(Account.decrypt(blob, password))
    except ValueError:
        raise KeyConfigError(f"keystore {path}: wrong password or a damaged file") from None


def load_account(keystore: Path | None = None, prompt: Callable[[], str] | None = None,
                 env: dict[str, str] | None = None) -> LocalAccount:
    """The account to sign with: `keystore` if given, else $VTRAIN_PRIVATE_KEY."""
    if keystore is not None:
        return load_keystore(keystore, prompt=prompt)
    env = os.environ if env is None else env
    key = env.get(KEY_ENV)
    if not key:
        raise KeyConfigError(f"no signing key: set {KEY_ENV} or pass --keystore FILE")
    return account_from_hex(key, f"${KEY_ENV}")


def write_keystore(account: LocalAccount, path: Path, password: str) -> None:
    """Encrypt `account` into a V3 keystore at `path` (mode 0600), e.g. for tests and set-up."""
    blob = Account.encrypt(account.key, password)
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(blob, f)

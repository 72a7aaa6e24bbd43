"""``cronwarden fence check``: is this run's fencing token still the newest
for its job? Best effort, for shell jobs between steps."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cronwarden.errors import UsageError

EXIT_STALE = 3

EPILOG = """exit status: 0 the token is the newest the job's lease was granted and the lease is
  still held by this run; 3 it is not (a newer run was granted the lease, or the lease
  expired or was released); 2 bad usage, or the store does not know the lease.

This is best effort, not a fence: the answer can change the moment after it is given (the
process can be paused between the check and its next write). Writes that must not land late
need a fence where they land: the fencing helpers for PostgreSQL, SQLite and Redis, or a
conditional write that compares $CRONWARDEN_FENCING_TOKEN. See docs/fencing.md.

Run it from the command `cronwarden run` started: it reads CRONWARDEN_FENCING_TOKEN,
CRONWARDEN_LEASE_KEY and CRONWARDEN_RUN_ID from the environment, and the store as
`cronwarden run` does (--store, $CRONWARDEN_STORE, the config file's store)."""


def configure(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "Fencing-token checks for shell jobs. `cronwarden fence check` tells the command "
        "`cronwarden run` started whether its token is still the newest for its job."
    )
    p.epilog = EPILOG
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    check = sub.add_parser("check", help="exit 0 if this run's token is still the newest, else 3",
                           description="Exit 0 if this run's fencing token is still the newest its job's "
                           "lease was granted and the lease is still this run's, else 3. Best effort: "
                           "see the epilog.", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    check.add_argument("--token", metavar="N", help="the token (default: $CRONWARDEN_FENCING_TOKEN)")
    check.add_argument("--lease-key", metavar="KEY", help="the lease (default: $CRONWARDEN_LEASE_KEY)")
    check.add_argument("--run-id", metavar="ID", help="the run (default: $CRONWARDEN_RUN_ID)")
    check.add_argument("--quiet", "-q", action="store_true", help="print nothing; the exit status says it")
    check.add_argument("--config", metavar="PATH", help="config file, for its store (default: "
                       "$CRONWARDEN_CONFIG or ./cronwarden.toml)")  # fmt: skip
    add_store_flag(check)


def _given(value: str | None, env: str, flag: str) -> str:
    found = value if value is not None else os.environ.get(env)
    if not found:
        raise UsageError(f"fence check: no {flag} and ${env} is not set; expected to run under "
                         "cronwarden run (or pass the flag)")  # fmt: skip
    return found


def main(args: Any) -> int:
    from cronwarden.cli.args import store_url
    from cronwarden.fence import check_token
    from cronwarden.stores import open_store

    token = check_token(_given(args.token, "CRONWARDEN_FENCING_TOKEN", "--token"))
    key = _given(args.lease_key, "CRONWARDEN_LEASE_KEY", "--lease-key")
    run_id = args.run_id if args.run_id is not None else os.environ.get("CRONWARDEN_RUN_ID")
    store = open_store(store_url(args))
    try:
        info = store.lease(key)
    finally:
        store.close()
    if info is None:
        raise UsageError(f"fence check: the store has no lease {key!r}; is --store the one the run uses?")
    if info.token > token:
        verdict = f"token {token} is stale: lease {key!r} was granted token {info.token} since"
    elif info.token < token:
        raise UsageError(f"fence check: token {token} is newer than any lease {key!r} was granted "
                         f"({info.token}); is --store the one the run uses?")  # fmt: skip
    elif info.owner is None:
        verdict = f"token {token} is the newest, but lease {key!r} was released"
    elif run_id is not None and info.owner != run_id:
        verdict = f"token {token} is the newest, but lease {key!r} is held by run {info.owner}"
    elif info.expires_in is None or info.expires_in <= 0:
        verdict = f"token {token} is the newest, but lease {key!r} expired; the next start takes it over"
    else:
        if not args.quiet:
            print(f"token {token} is the newest for lease {key!r}, held for {info.expires_in:.1f}s more")
        return 0
    if not args.quiet:
        print(verdict, file=sys.stderr)
    return EXIT_STALE

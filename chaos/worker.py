"""The command each chaos ``cronwarden run`` runs: read–sleep–write against
the referee, ``--steps`` times, with the run's ``CRONWARDEN_FENCING_TOKEN``.

Run as ``python -S chaos/worker.py``: standard library only, so the child
adds as little as possible to a cycle's cost.

Exit status: 0 done; 5 fenced out (the referee rejected an operation: this
run's token is stale, so it stops, as a fenced job should); 6 referee gone.
With ``--no-fencing`` (the positive control) every operation is sent with
``fence=0``: the referee accepts it whatever the token, as a resource with no
fencing would, and logs the token the run really held.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

EXIT_FENCED = 5
EXIT_REFEREE_GONE = 6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos-worker")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--sleep", type=float, default=0.1, help="seconds between each read and its write")
    p.add_argument("--no-fencing", action="store_true")
    args = p.parse_args(argv)
    run = os.environ["CRONWARDEN_RUN_ID"]
    token = int(os.environ["CRONWARDEN_FENCING_TOKEN"])
    fence = "0" if args.no_fencing else "1"
    try:
        sock = socket.create_connection(("127.0.0.1", args.port), timeout=30)
    except OSError:
        return EXIT_REFEREE_GONE
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = sock.makefile("rb")

    def ask(line: str) -> list[str]:
        sock.sendall(line.encode() + b"\n")
        reply = f.readline().decode().split()
        if not reply:
            raise ConnectionError
        return reply

    try:
        ask(f"HELLO {run} {token} {os.getpid()}")
        for step in range(args.steps):
            reply = ask(f"READ {token} {fence}")
            if reply[0] != "OK":
                return EXIT_FENCED
            head = reply[1]
            time.sleep(args.sleep)
            if ask(f"WRITE {token} {fence} {run}/{step} {head}")[0] != "OK":
                return EXIT_FENCED
    except (OSError, ConnectionError):
        return EXIT_REFEREE_GONE
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An APScheduler 3 service whose job runs in one process at a time, however
many copies of the service run against one store.

Run two copies (two terminals, or two hosts with a PostgreSQL or Redis
store)::

    export CRONWARDEN_STORE=sqlite:////tmp/cronwarden-example.db
    python app.py &  python app.py &

Each copy fires ``refresh_prices`` every ``--every`` seconds; the copy that
takes the lease runs it, the other records the slot ``skipped`` (with the
holder) and does nothing. Stop them with Ctrl-C or SIGTERM: a run in progress
finishes and records its end before the process exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
from datetime import datetime
from types import FrameType

from apscheduler.schedulers.blocking import BlockingScheduler

from cronwarden import Warden

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--every", type=float, default=60.0, help="seconds between fires (default 60)")
parser.add_argument("--work", type=float, default=5.0, help="seconds one run works (default 5)")
args = parser.parse_args()

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
logging.getLogger("apscheduler").setLevel(logging.WARNING)

warden = Warden()  # $CRONWARDEN_STORE: the one store every copy shares


# The lease outlives a stalled process by at most the ttl; the period is
# saved in the store, so `cronwarden audit` judges the job against it.
@warden.job("refresh-prices", ttl="30s", every=f"{args.every:g}s",
            reason="two refreshes at once would double-write the price table")  # fmt: skip
def refresh_prices() -> None:
    started = time.time()
    time.sleep(args.work)  # the real work
    print(f"pid {os.getpid()} refreshed prices {started:.3f}-{time.time():.3f}", flush=True)


scheduler = BlockingScheduler()
# max_instances=1 only stops overlap inside this process; the lease stops it
# across processes and hosts.
scheduler.add_job(
    refresh_prices,
    "interval",
    seconds=args.every,
    max_instances=1,
    coalesce=True,
    next_run_time=datetime.now(),
)  # fmt: skip: the first fire at start


def stop(signum: int, _frame: FrameType | None) -> None:
    # shutdown(wait=True) lets a run in progress finish and record its end.
    scheduler.shutdown(wait=True)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
try:
    scheduler.start()
finally:
    warden.close()

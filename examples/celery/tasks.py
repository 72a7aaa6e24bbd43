"""A Celery app whose periodic task runs once at a time, however many workers
take its deliveries and however many beats send them.

Celery beat sends ``tasks.build_report`` every ``REPORT_EVERY`` seconds;
any worker may take each delivery. Two deliveries that overlap (a slow run,
a second beat during a deploy, a retry) would both build the report. The
task takes the job's lease first: one delivery works, the other records the
slot ``skipped`` (with the holder) and returns at once. The skip is logged
by the ``cronwarden`` logger at INFO, in the worker's own log.

Run it (the Redis on this host as broker; a PostgreSQL or Redis store shared
by every worker's host)::

    export CRONWARDEN_STORE=sqlite:////tmp/cronwarden-example.db
    celery -A tasks worker --pool threads --concurrency 2 --loglevel INFO &
    celery -A tasks beat --loglevel INFO &

Settings, from the environment: ``CELERY_BROKER_URL`` (default
``redis://127.0.0.1:6379/0``), ``CELERY_KEY_PREFIX`` (prefix of every broker
key, default none), ``REPORT_EVERY`` (seconds between sends, default 3600)
and ``REPORT_WORK`` (seconds one report takes, default 5).
"""

from __future__ import annotations

import os
import time

from celery import Celery
from celery.utils.log import get_task_logger

from cronwarden import Warden

EVERY = float(os.environ.get("REPORT_EVERY", "3600"))
WORK = float(os.environ.get("REPORT_WORK", "5"))

app = Celery("tasks", broker=os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    # Every key and channel this app uses on the broker starts with the
    # prefix, so several apps can share one Redis database.
    broker_transport_options={"global_keyprefix": os.environ.get("CELERY_KEY_PREFIX", "")},
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    # The logger's name in each line, so cronwarden's lines say where they
    # come from.
    worker_log_format="[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s",
    worker_task_log_format="[%(asctime)s: %(levelname)s/%(processName)s] %(name)s: %(message)s",
    beat_schedule={"build-report": {"task": "tasks.build_report", "schedule": EVERY}},
)

# The worker's store: $CRONWARDEN_STORE, the one every worker shares. Opened
# when the worker imports this module, so run the worker with the threads
# (or solo) pool: a store connection must not be shared across the forks of
# the prefork pool.
warden = Warden()
log = get_task_logger(__name__)


# @app.task outside, @warden.job inside: the lease is taken when the
# delivery runs, not when beat sends it. The period is saved in the store,
# so `cronwarden audit` judges the job against it.
@app.task(name="tasks.build_report")
@warden.job("build-report", ttl="1m", every=EVERY,
            reason="two reports at once would both email the whole team")  # fmt: skip
def build_report() -> None:
    started = time.time()
    time.sleep(WORK)  # the real work
    log.info("pid %d built report %.3f-%.3f", os.getpid(), started, time.time())

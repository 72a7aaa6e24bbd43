"""``python manage.py send_reports``: mail the daily reports, once, however
many hosts run it from their crontab (or Kubernetes CronJob) at 07:00."""

from __future__ import annotations

import os
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from cronwarden import NotStarted, Warden


class Command(BaseCommand):
    help = "Send the daily reports (one host at a time; a start while another runs is recorded skipped)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--work", type=float, default=2.0, help="seconds the sending takes (example)")

    def handle(self, *args: Any, **options: Any) -> None:
        with Warden(settings.CRONWARDEN_STORE) as warden:
            try:
                with warden.guard("send-reports", ttl="2m", schedule="0 7 * * *", timezone="Europe/Berlin",
                                  reason="each customer gets each report once") as run:  # fmt: skip
                    started = time.time()
                    for _batch in range(3):
                        run.check()  # stop between batches if the lease is gone
                        time.sleep(options["work"] / 3)  # the real work
                    self.stdout.write(f"pid {os.getpid()} sent reports {started:.3f}-{time.time():.3f}")
            except NotStarted as e:
                # Not an error: the other host is sending them. Recorded in the ledger.
                self.stderr.write(f"send_reports: skipped, run {e.holder_run_id} is sending them")

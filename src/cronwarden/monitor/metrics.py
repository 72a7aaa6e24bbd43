"""Prometheus metrics over the ledger: a custom collector that computes, at
scrape time, the same bounded per-job statistics as ``cronwarden audit``.

``prometheus_client`` is an optional dependency (``pip install
'cronwarden[metrics]'``), imported only here, only when metrics are asked
for. The values describe the monitor's window (last N runs, last D days), so
they are gauges, not ever-growing counters: the ledger, not the process,
holds the history, and a scrape never counts the whole ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from cronwarden.errors import UsageError
from cronwarden.events import Outcome

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from cronwarden.monitor import Monitor

BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""Duration histogram bucket bounds in seconds (cron jobs: a second to a day)."""


def require_prometheus_client() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "metrics need the 'prometheus_client' package: pip install 'cronwarden[metrics]'"
        ) from None


class LedgerCollector:
    """A ``prometheus_client`` collector: register it in a registry, and each
    scrape reads the ledger through ``monitor`` (bounded reads per job)."""

    def __init__(self, monitor: Monitor) -> None:
        require_prometheus_client()
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; nothing to describe up front

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily

        m = self.monitor
        all_stats = m.audit()
        job = ["job"]
        runs = GaugeMetricFamily(
            "cronwarden_job_runs", "Runs in the monitor window by outcome (running: still open).",
            labels=["job", "outcome"],
        )  # fmt: skip
        skips = GaugeMetricFamily("cronwarden_job_skips", "Skipped starts in the window.", labels=job)
        in_a_row = GaugeMetricFamily(
            "cronwarden_job_skips_in_a_row", "Skipped starts since the last run started.", labels=job
        )
        overlaps = GaugeMetricFamily(
            "cronwarden_job_overlaps", "Runs that started while an earlier run was open, in the window.",
            labels=job,
        )  # fmt: skip
        open_runs = GaugeMetricFamily("cronwarden_job_open_runs", "Runs open now.", labels=job)
        lost = GaugeMetricFamily("cronwarden_job_lease_losses", "Runs that lost their lease, in the window.",
                                 labels=job)  # fmt: skip
        stuck = GaugeMetricFamily(
            "cronwarden_job_stuck_runs", "Runs open past max_runtime, expired, or abandoned.", labels=job
        )
        hist = GaugeHistogramMetricFamily(
            "cronwarden_job_duration_seconds",
            "Durations of completed runs in the window (a gauge histogram: the window moves).",
            labels=job,
        )
        quantiles = GaugeMetricFamily(
            "cronwarden_job_duration_quantile_seconds",
            "p50, p95 and max (quantile 1) of completed-run durations in the window.",
            labels=["job", "quantile"],
        )
        period = GaugeMetricFamily("cronwarden_job_period_seconds", "Seconds between scheduled fires.",
                                   labels=job)  # fmt: skip
        ratio = GaugeMetricFamily(
            "cronwarden_job_p95_period_ratio", "p95 duration as a share of the period (slow at 2/3).",
            labels=job,
        )  # fmt: skip
        queue = GaugeMetricFamily("cronwarden_job_queue_depth", "Pending starts (policy queue).", labels=job)
        success = GaugeMetricFamily(
            "cronwarden_job_last_success_timestamp_seconds", "End of the last successful run in the window.",
            labels=job,
        )  # fmt: skip
        for s in all_stats:
            name = [s.job]
            for outcome in (*(o.value for o in Outcome), "running"):
                runs.add_metric([s.job, outcome], float(s.outcomes.get(outcome, 0)))
            skips.add_metric(name, float(s.skips))
            in_a_row.add_metric(name, float(s.skips_in_a_row))
            overlaps.add_metric(name, float(s.overlaps))
            open_runs.add_metric(name, float(s.open_runs))
            lost.add_metric(name, float(s.lease_losses))
            stuck.add_metric(name, float(len(s.stuck)))
            buckets: list[tuple[str, float]] = []
            i = 0
            for bound in BUCKETS:
                while i < len(s.durations) and s.durations[i] <= bound:
                    i += 1
                buckets.append((_le(bound), float(i)))
            buckets.append(("+Inf", float(len(s.durations))))
            hist.add_metric(name, buckets, sum(s.durations))
            for q, v in (("0.5", s.p50), ("0.95", s.p95), ("1", s.max)):
                if v is not None:
                    quantiles.add_metric([s.job, q], v)
            if s.period is not None:
                period.add_metric(name, s.period)
            if s.ratio is not None:
                ratio.add_metric(name, s.ratio)
            info = m.store.lease(s.job)
            queue.add_metric(name, float(info.pending if info else 0))
            if s.last_success is not None:
                success.add_metric(name, s.last_success)
        yield from (runs, skips, in_a_row, overlaps, open_runs, lost, stuck, hist, quantiles, period, ratio,
                    queue, success)  # fmt: skip


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{int(bound)}.0"


def exposition(monitor: Monitor) -> bytes:
    """The text exposition format, as ``/metrics`` serves it."""
    require_prometheus_client()
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(monitor))
    return generate_latest(registry)

"""Prometheus metrics over the ledger: a custom collector that computes, at
scrape time, per job, counters of everything the ledger holds and gauges of
the monitor's window.

``prometheus_client`` is an optional dependency (``pip install
'cronwarden[metrics]'``), imported only here, only when metrics are asked
for, and used through its public API (``prometheus_client.core``'s metric
families). Counters (``cronwarden_runs_total``, ``…_skips_total``,
``…_overlaps_total``, ``…_lease_lost_total``, ``…_findings_total``) and the
``cronwarden_run_duration_seconds`` histogram count the ledger itself
(``Store.tally``), so they only grow, across processes and restarts, and
``rate()``/``increase()`` work on them; whichever process serves them, they
agree. The ``cronwarden_job_*`` gauges describe the window (last N runs,
last D days), as ``cronwarden audit`` does: the current state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from cronwarden.errors import UsageError
from cronwarden.events import EventKind, Outcome

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
        yield from self.counters([s.job for s in all_stats])
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

    def counters(self, jobs: list[str]) -> Iterator[Metric]:
        """The counters and the duration histogram, from each job's ``Store.tally``
        and its finding events."""
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        from cronwarden.monitor.rules import FINDING_KINDS, RESOLVED
        from cronwarden.stores.base import EventQuery

        store = self.monitor.store
        runs = CounterMetricFamily(
            "cronwarden_runs", "Runs that ended, by outcome.", labels=["job", "outcome"]
        )
        skips = CounterMetricFamily("cronwarden_skips", "Starts refused because a run held the lease.",
                                    labels=["job"])  # fmt: skip
        lost = CounterMetricFamily("cronwarden_lease_lost", "Runs that ended lease_lost.", labels=["job"])
        overlaps = CounterMetricFamily(
            "cronwarden_overlaps", "Starts while an earlier run of the same job was open.", labels=["job"]
        )
        findings = CounterMetricFamily(
            "cronwarden_findings", "Findings raised by the monitor, by rule.", labels=["job", "rule"]
        )
        hist = HistogramMetricFamily(
            "cronwarden_run_duration_seconds", "Durations of completed runs (succeeded, failed, timed_out).",
            labels=["job"],
        )  # fmt: skip
        for job in jobs:
            t = store.tally(job)
            for o in Outcome:
                runs.add_metric([job, o.value], float(t.events.get(o.value, 0)))
            skips.add_metric([job], float(t.events.get(EventKind.SKIPPED.value, 0)))
            lost.add_metric([job], float(t.events.get(EventKind.LEASE_LOST.value, 0)))
            raised: dict[str, int] = dict.fromkeys((k.value for k in FINDING_KINDS), 0)
            overlapped = 0
            if any(t.events.get(k.value) for k in FINDING_KINDS):
                limit = sum(t.events.get(k.value, 0) for k in FINDING_KINDS)
                for e in store.events(EventQuery(job=job, kinds=FINDING_KINDS, limit=limit)):
                    if e.data.get("state", "raised") == RESOLVED:
                        continue
                    # An overlap fact (no state) or a raised finding: each is one raise.
                    raised[e.kind.value] += 1
                    overlapped += e.kind is EventKind.OVERLAP
            overlaps.add_metric([job], float(overlapped))
            for rule, n in raised.items():
                findings.add_metric([job, rule], float(n))
            durations = sorted(t.durations)
            buckets: list[tuple[str, float]] = []
            i = 0
            for bound in BUCKETS:
                while i < len(durations) and durations[i] <= bound:
                    i += 1
                buckets.append((_le(bound), float(i)))
            buckets.append(("+Inf", float(len(durations))))
            hist.add_metric([job], buckets, sum(durations))
        yield from (runs, skips, lost, overlaps, findings, hist)


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{int(bound)}.0"


def exposition(monitor: Monitor) -> bytes:
    """The text exposition format, as ``/metrics`` serves it."""
    require_prometheus_client()
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(monitor))
    return generate_latest(registry)

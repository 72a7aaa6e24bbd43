"""Prometheus counters over the ledger, on every store: they only grow as
runs are made (so rate()/increase() work), whatever the window, and the
duration histogram exposes _bucket, _sum and _count."""

from __future__ import annotations

import time

import pytest

from cronwarden import cli
from cronwarden.events import Outcome
from cronwarden.stores.base import Refused, Store
from monitor_history import PERIOD, aligned, begin, describe, end, lease_of, run

JOB = "export"


def scrape(
    store_url: str, capsys: pytest.CaptureFixture[str], *flags: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One ``cronwarden metrics``, parsed by prometheus_client's own parser:
    (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    capsys.readouterr()
    assert cli.main(["metrics", "--store", store_url, *flags]) == 0
    text = capsys.readouterr().out
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_grow_by_the_runs_made_between_two_scrapes_while_the_window_stays(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("prometheus_client")
    t = aligned(time.time() - 86400)
    describe(store, JOB, at=t)
    for n in range(3):
        run(store, JOB, t + n * PERIOD, 100.0)
    run(store, JOB, t + 3 * PERIOD, 2.0, Outcome.FAILED)

    first = scrape(store_url, capsys, "--runs", "2")
    for n in range(4, 9):
        run(store, JOB, t + n * PERIOD, 400.0)
    run(store, JOB, t + 9 * PERIOD, 30.0, Outcome.LEASE_LOST)
    second = scrape(store_url, capsys, "--runs", "2")

    job = (("job", JOB),)

    def runs_total(sample: dict, outcome: str) -> float:
        return sample[("cronwarden_runs_total", (("job", JOB), ("outcome", outcome)))]

    # increase() over the two scrapes is the runs made in between.
    assert runs_total(second, "succeeded") - runs_total(first, "succeeded") == 5
    assert (runs_total(first, "failed"), runs_total(second, "failed")) == (1, 1)
    assert second[("cronwarden_lease_lost_total", job)] - first[("cronwarden_lease_lost_total", job)] == 1
    # The window gauge is the last 2 runs, whatever the history.
    assert (
        sum(
            v
            for (name, labels), v in second.items()
            if name == "cronwarden_job_runs" and ("job", JOB) in labels
        )
        == 2
    )
    # A real histogram of every completed run: _count, _sum, cumulative buckets.
    assert first[("cronwarden_run_duration_seconds_count", job)] == 4
    assert second[("cronwarden_run_duration_seconds_count", job)] == 9
    assert second[("cronwarden_run_duration_seconds_sum", job)] == 3 * 100 + 2 + 5 * 400
    assert second[("cronwarden_run_duration_seconds_bucket", (("job", JOB), ("le", "120.0")))] == 4
    assert second[("cronwarden_run_duration_seconds_bucket", (("job", JOB), ("le", "+Inf")))] == 9


def test_skip_and_finding_counters_count_each_once(
    store: Store, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("prometheus_client")
    for _ in range(2):
        assert cli.main(["run", "--job", "flaky", "--store", store_url, "--", "false"]) == 1
    for _ in range(3):  # three passes, one finding raised
        cli.main(["check", "--store", store_url])
    assert cli.main(["run", "--job", "flaky", "--store", store_url, "--", "true"]) == 0
    cli.main(["check", "--store", store_url])  # resolved: not a raise
    holder = lease_of(begin(store, "flaky", time.time()))
    assert isinstance(begin(store, "flaky", time.time() + 1), Refused)

    got = scrape(store_url, capsys)

    assert got[("cronwarden_findings_total", (("job", "flaky"), ("rule", "failing")))] == 1
    assert got[("cronwarden_runs_total", (("job", "flaky"), ("outcome", "failed")))] == 2
    assert got[("cronwarden_skips_total", (("job", "flaky"),))] == 1
    end(store, holder, time.time() + 2)

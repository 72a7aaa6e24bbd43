"""``cronwarden audit`` on a fixture ledger, on every store: the seed's "this
week" list, its verdicts, and ``--strict``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cronwarden import cli
from cronwarden.clock import FakeClock
from cronwarden.events import JobInfo
from cronwarden.report import Reporter
from cronwarden.stores.base import Store
from monitor_history import PERIOD, aligned, describe, runs_every_period

REASON = "writes one snapshot per window; a second start must skip"


def ledger(store: Store, *jobs: str) -> None:
    """Write the named fixture jobs: a day-old history of 8 runs each, ending an hour ago."""
    first = aligned(time.time() - 86400)
    spec: dict[str, tuple[list[float], str]] = {
        "quick": ([55.0, 60, 58, 62, 61, 57, 59, 60], ""),  # ~10% of the period
        "creeping": ([300.0, 310, 305, 320, 315, 318, 322, 330], REASON),  # ~55%: watch, decided
        "undecided": ([300.0, 310, 305, 320, 315, 318, 322, 330], ""),  # ~55%: watch, no reason
        "slow": ([400.0, 420, 430, 450, 460, 470, 480, 490], REASON),  # ~81%: at risk
    }
    for job in jobs:
        if job == "hourly":
            store.save_job(JobInfo(name=job, schedule="0 * * * *", updated_at=first))
            runs_every_period(store, job, first, [240.0] * 8, period=3600)
        elif job == "doubled":
            describe(store, job, at=first, reason="")
            clock = FakeClock(start=first)
            reporter = Reporter(store, clock=clock)
            a = reporter.start(job).run_id
            clock.advance(PERIOD)
            b = reporter.start(job).run_id
            clock.advance(100)
            reporter.success(job, a)
            reporter.success(job, b)
        else:
            durations, reason = spec[job]
            describe(store, job, at=first, reason=reason)
            runs_every_period(store, job, first, durations)


def audit_json(store_url: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[Any], str]:
    """Exit status, the JSON rows and stderr of ``cronwarden audit --json``."""
    capsys.readouterr()
    code = cli.main(["audit", "--json", "--store", store_url, *flags])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_audit_gives_each_fixture_job_its_expected_verdict(store: Store, store_url: str, capsys) -> None:
    ledger(store, "quick", "creeping", "undecided", "slow", "doubled", "hourly")

    code, rows, _ = audit_json(store_url, capsys)

    assert code == 0
    verdicts = {r["job"]: (r["verdict"], r["undecided"]) for r in rows}
    assert verdicts == {
        "creeping": ("watch", False),
        "doubled": ("overlapping", False),  # two runs only, too few to judge durations: overlap is enough
        "hourly": ("ok", False),
        "quick": ("ok", False),
        "slow": ("at risk", False),
        "undecided": ("watch", True),
    }


def test_audit_reports_percentiles_and_the_share_of_the_period(store: Store, store_url: str, capsys) -> None:
    ledger(store, "slow", "hourly")

    _, rows, _ = audit_json(store_url, capsys)

    slow = next(r for r in rows if r["job"] == "slow")
    assert (slow["period"], slow["p50"], slow["max"], slow["completed"]) == (PERIOD, 455.0, 490.0, 8)
    assert slow["p95"] == pytest.approx(486.5)
    assert slow["p95_share_of_period"] == pytest.approx(486.5 / PERIOD, abs=1e-4)
    hourly = next(r for r in rows if r["job"] == "hourly")
    assert (hourly["schedule"], hourly["period"]) == ("0 * * * *", 3600.0)


def test_audit_table_has_one_row_per_job_with_its_verdict(store: Store, store_url: str, capsys) -> None:
    ledger(store, "quick", "slow")

    assert cli.main(["audit", "--store", store_url]) == 0

    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["JOB", "SCHEDULE", "PERIOD", "P50", "P95", "MAX", "P95/PERIOD", "POLICY",
                              "REASON", "VERDICT", "NOTES"]  # fmt: skip
    verdict_at = header.index("VERDICT")
    assert [(r.split()[0], r[verdict_at:].split("  ")[0]) for r in rows] == [
        ("quick", "ok"),
        ("slow", "at risk"),
    ]


def test_strict_exits_1_when_a_job_is_at_risk(store: Store, store_url: str, capsys) -> None:
    ledger(store, "quick", "slow")

    code, _, err = audit_json(store_url, capsys, "--strict")

    assert code == 1
    assert err == "cronwarden: audit --strict: slow (at risk)\n"


def test_strict_exits_1_when_a_job_is_undecided(store: Store, store_url: str, capsys) -> None:
    ledger(store, "quick", "undecided")

    code, _, err = audit_json(store_url, capsys, "--strict")

    assert code == 1
    assert err == "cronwarden: audit --strict: undecided (undecided)\n"


def test_strict_exits_1_when_a_job_overlapped(store: Store, store_url: str, capsys) -> None:
    ledger(store, "doubled")

    code, _, err = audit_json(store_url, capsys, "--strict")

    assert code == 1
    assert err == "cronwarden: audit --strict: doubled (overlapping)\n"


def test_strict_exits_0_when_every_job_is_ok_or_watched_with_a_reason(
    store: Store, store_url: str, capsys
) -> None:
    ledger(store, "quick", "creeping", "hourly")

    code, rows, _ = audit_json(store_url, capsys, "--strict")

    assert code == 0
    assert all(r["strict"] == [] for r in rows)


def test_a_written_reason_takes_a_watched_job_off_the_strict_list(
    store: Store, store_url: str, capsys
) -> None:
    ledger(store, "undecided")
    assert audit_json(store_url, capsys, "--strict")[0] == 1

    code = cli.main(["report", "describe", "--job", "undecided", "--reason", REASON, "--store", store_url])

    assert code == 0
    assert audit_json(store_url, capsys, "--strict")[0] == 0


def test_slow_threshold_flag_moves_the_at_risk_line(store: Store, store_url: str, capsys) -> None:
    ledger(store, "creeping")

    _, rows, _ = audit_json(store_url, capsys, "--slow", "50%")

    assert rows[0]["verdict"] == "at risk"


@pytest.mark.parametrize("given", ["most", "5", "0", "150%", "1e9", "nan"])
def test_bad_threshold_is_one_line_naming_the_range_and_exit_2(store_url: str, capsys, given: str) -> None:
    assert cli.main(["audit", "--slow", given, "--store", store_url]) == 2

    assert capsys.readouterr().err == (
        "cronwarden: --slow must be a fraction of the period like 2/3, 0.67 or 67%, greater than 0 and at "
        f"most 1 (the whole period), got {given!r}\n"
    )


def test_reason_written_in_the_config_file_decides_the_policy(
    store: Store, store_url: str, capsys, tmp_path
) -> None:
    ledger(store, "undecided")
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'[jobs.undecided]\nevery = "10m"\npolicy = "skip"\nreason = "{REASON}"\n')

    code, rows, _ = audit_json(store_url, capsys, "--strict", "--config", str(config))

    assert code == 0
    assert (rows[0]["verdict"], rows[0]["reason"], rows[0]["undecided"]) == ("watch", REASON, False)

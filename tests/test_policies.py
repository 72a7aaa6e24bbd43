"""The overlap policies end to end: real ``cronwarden run`` processes, real
children and signals, on every store (the ``store_url`` fixture).

Children are small ``sh`` scripts that write their run id (and pid) to files
and wait for a ``release`` file, so each test decides when work ends and
waits on files and ledger state with deadlines, never on guessed sleeps.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from tests.contract import assert_one_terminal_per_start, ledger
from tests.processes import alive

from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store

T = TypeVar("T")

CLI = [sys.executable, "-m", "cronwarden"]
DEADLINE = 30.0
"""Most seconds any wait in these tests may take before it fails: a bound on
a failure, never a pause (a loaded CI machine took over 10 s to start a run)."""

HOLD = 'echo $$ > "$0/$CRONWARDEN_RUN_ID.pid"; while [ ! -e "$0/release" ]; do sleep 0.02; done'
"""Child: record its pid under its run id, then work until the test releases it."""


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment minus anything that would point cronwarden at
    another config or store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env.update(extra)
    return env


def cli(store_url: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "run", "--store", store_url, *args], cwd=cwd, env=env or clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def hold(work: Path) -> list[str]:
    return ["--", "sh", "-c", HOLD, str(work)]


def wait_for(what: str, predicate: Callable[[], T], timeout: float = DEADLINE) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def started_runs(work: Path) -> dict[str, int]:
    """run id -> pid of every child that has started working."""
    out = {}
    for f in work.glob("*.pid"):
        text = f.read_text().strip()
        if text:
            out[f.name.removesuffix(".pid")] = int(text)
    return out


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Wait for a cronwarden process; its exit status and stderr."""
    try:
        _, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"cronwarden run did not exit within {DEADLINE:g}s; stderr: {err}")
    return proc.returncode, err


@pytest.fixture(autouse=True)
def created_store(store_url: str) -> None:
    """Create the store's schema before the processes race to use it: these
    tests are about policies; concurrent first opens are the contract suite's."""
    open_store(store_url).close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


# -- allow -------------------------------------------------------------------


def test_allow_with_shards_runs_each_shard_once_and_skips_the_second_start_on_it(
    store_url: str, work: Path
) -> None:
    shards = ["eu", "eu", "us", "us"]
    procs = [cli(store_url, "--job", "sync", "--policy", "allow", "--shard", s, "--ttl", "3s", *hold(work),
                 cwd=work) for s in shards]  # fmt: skip
    shard_of_pid = {p.pid: s for p, s in zip(procs, shards, strict=True)}

    # The two refused starts end on their own; the two that run wait for release.
    wait_for("two starts to be refused", lambda: sum(p.poll() is not None for p in procs) >= 2)
    running = wait_for("two children to run", lambda: len(started_runs(work)) == 2 and started_runs(work))
    assert sum(p.poll() is None for p in procs) == 2
    (work / "release").touch()
    results = [finish(p) for p in procs]

    assert [code for code, _ in results] == [0, 0, 0, 0], results
    with open_store(store_url) as store:
        started = ledger(store, kinds=[EventKind.STARTED])
        skipped = ledger(store, kinds=[EventKind.SKIPPED])
        assert sorted(e.data["key"] for e in started) == ["sync:eu", "sync:us"]
        assert {e.run_id for e in started} == set(running)
        assert len(skipped) == 2
        key_of_run = {e.run_id: e.data["key"] for e in started}
        for skip in skipped:  # each refused start met the holder of its own shard
            assert key_of_run[skip.data["holder_run_id"]] == f"sync:{shard_of_pid[skip.data['pid']]}"
        assert ledger(store, kinds=[EventKind.OVERLAP]) == []
        assert_one_terminal_per_start(store)


def test_allow_unpartitioned_runs_both_and_records_an_overlap_naming_both_runs(
    store_url: str, work: Path
) -> None:
    flags = ["--job", "fanout", "--policy", "allow", "--allow-unpartitioned", "--reason",
             "each run only reads and sends idempotent pings", "--ttl", "3s", *hold(work)]  # fmt: skip
    first = cli(store_url, *flags, cwd=work)
    (first_run,) = wait_for("the first child", lambda: started_runs(work))
    second = cli(store_url, *flags, cwd=work)
    both = wait_for(
        "the second child while the first runs", lambda: len(started_runs(work)) == 2 and started_runs(work)
    )
    (second_run,) = set(both) - {first_run}
    (work / "release").touch()

    (code1, _), (code2, err2) = finish(first), finish(second)

    assert (code1, code2) == (0, 0)
    assert "overlaps run " + first_run in err2
    with open_store(store_url) as store:
        (overlap,) = ledger(store, kinds=[EventKind.OVERLAP])
        assert (overlap.run_id, overlap.data["holder_run_id"]) == (second_run, first_run)
        assert [r.outcome for r in store.runs("fanout")] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
        assert_one_terminal_per_start(store)


UNPARTITIONED = [
    "--policy",
    "allow",
    "--allow-unpartitioned",
    "--reason",
    "each run only sends idempotent pings",
]


@pytest.mark.parametrize("where", ["side lease", "shard"])
def test_a_dead_run_on_another_key_is_abandoned_by_the_next_start_of_the_job(
    store_url: str, work: Path, where: str
) -> None:
    """A side lease (policy allow) or a shard is never started again by its
    key, so the next start of the job, not only the monitor, gives its dead
    run its terminal record."""
    if where == "side lease":  # the dead run overlaps a live one on the job's key
        holder_flags, victim_flags = UNPARTITIONED, UNPARTITIONED
    else:  # the dead run is on shard eu; the next start is on shard us
        holder_flags, victim_flags = ["--shard", "us"], ["--shard", "eu"]
    holder = cli(store_url, "--job", "fanout", *holder_flags, "--ttl", "5s", *hold(work), cwd=work)
    victim: subprocess.Popen[str] | None = None
    try:
        (holder_run,) = wait_for("the holder's child", lambda: started_runs(work))
        # A short ttl, so its lease expires soon after the kill; not so short
        # that a busy machine's late renewal loses it before its child starts.
        victim = cli(store_url, "--job", "fanout", *victim_flags, "--ttl", "3s", *hold(work), cwd=work)
        both = wait_for("the victim's child", lambda: len(started_runs(work)) == 2 and started_runs(work))
        (victim_run,) = set(both) - {holder_run}
        victim.kill()  # its child dies with it (G5); its lease is left to expire
        victim.communicate(timeout=DEADLINE)
        wait_for("the victim's child to die", lambda: not alive(both[victim_run]))
    finally:
        (work / "release").touch()
        if victim is not None and victim.poll() is None:
            victim.kill()
        code, err = finish(holder)
    assert code == 0, err
    with open_store(store_url) as store:
        wait_for(
            "the victim's lease to expire", lambda: all(r.expires_in <= 0 for r in store.open_runs("fanout"))
        )
        assert [r.run_id for r in store.open_runs("fanout")] == [victim_run]

    code, err = finish(cli(store_url, "--job", "fanout", *holder_flags, "--", "true", cwd=work))

    assert code == 0, err
    with open_store(store_url) as store:
        assert store.open_runs("fanout") == []
        victim_record = store.run(victim_run)
        assert victim_record is not None and victim_record.outcome is Outcome.ABANDONED
        (third,) = [r for r in store.runs("fanout") if r.run_id not in (holder_run, victim_run)]
        assert victim_record.detail.endswith(f"found by run {third.run_id}")
        assert_one_terminal_per_start(store)


def test_allow_without_a_partition_or_a_reason_is_refused_before_touching_the_store(
    store_url: str, work: Path
) -> None:
    no_shard = cli(store_url, "--job", "fanout", "--policy", "allow", "--", "true", cwd=work)
    no_reason = cli(store_url, "--job", "fanout", "--policy", "allow", "--allow-unpartitioned", "--", "true",
                    cwd=work)  # fmt: skip

    (code1, err1), (code2, err2) = finish(no_shard), finish(no_reason)

    assert (code1, code2) == (2, 2)
    assert "needs a partition" in err1 and "--reason" in err2
    assert "Traceback" not in err1 + err2
    with open_store(store_url) as store:
        assert ledger(store, job="fanout") == []


# -- replace -----------------------------------------------------------------


def test_replace_stops_the_holder_on_another_host_within_grace_plus_one_renewal(
    store_url: str, work: Path
) -> None:
    ttl, grace = 3.0, 1.0
    renew_interval = ttl / 3
    # The old child ignores SIGTERM, so it is stopped only by the SIGKILL at
    # the end of the grace: the slowest legitimate path.
    stubborn = "trap '' TERM; " + HOLD
    flags = ["--job", "cache", "--policy", "replace", "--reason", "the cache mirrors the latest inputs",
             "--ttl", f"{ttl:g}s", "--replace-grace", f"{grace:g}s"]  # fmt: skip
    old = cli(store_url, *flags, "--", "sh", "-c", stubborn, str(work), cwd=work,
              env=clean_env(CRONWARDEN_HOST="host-a"))  # fmt: skip
    ((old_run, old_pid),) = wait_for("the old child", lambda: started_runs(work)).items()

    new = cli(store_url, *flags, "--", "sh", "-c", 'echo $$ > "$0/$CRONWARDEN_RUN_ID.pid"', str(work),
              cwd=work, env=clean_env(CRONWARDEN_HOST="host-b"))  # fmt: skip
    with open_store(store_url) as store:

        def revoked() -> float | None:
            info = store.lease("cache")
            return time.monotonic() if info is not None and info.revoked_by is not None else None

        revoked_at = wait_for("the new start to revoke the old run", revoked)
    wait_for("the old child to be stopped", lambda: not alive(old_pid))
    stopped_after = time.monotonic() - revoked_at
    (old_code, old_err), (new_code, new_err) = finish(old), finish(new)

    # 0.5s for this test's polling and a loaded machine.
    assert stopped_after <= grace + renew_interval + 0.5, f"stopped {stopped_after:.2f}s after revocation"
    assert (old_code, new_code) == (4, 0), (old_err, new_err)
    (new_run,) = set(started_runs(work)) - {old_run}
    with open_store(store_url) as store:
        old_record, new_record = store.run(old_run), store.run(new_run)
        assert old_record is not None and new_record is not None
        assert (old_record.outcome, old_record.host) == (Outcome.REPLACED, "host-a")
        assert (new_record.outcome, new_record.host) == (Outcome.SUCCEEDED, "host-b")
        (replaced,) = ledger(store, kinds=[EventKind.REPLACED])
        assert (replaced.run_id, replaced.data["replaced_by"]) == (old_run, new_run)
        (new_started,) = ledger(store, kinds=[EventKind.STARTED], run_id=new_run)
        (old_started,) = ledger(store, kinds=[EventKind.STARTED], run_id=old_run)
        assert new_started.data["token"] > old_started.data["token"]
        assert ledger(store, kinds=[EventKind.ABANDONED, EventKind.LEASE_LOST]) == []
        assert_one_terminal_per_start(store)


def test_replace_grace_longer_than_the_lease_still_stops_the_old_child_before_the_new_one_starts(
    store_url: str, work: Path
) -> None:
    # A revoked holder can no longer renew, so its lease runs out within the
    # ttl; a 30s grace must not let the old child outlive it.
    stubborn = "trap '' TERM; " + HOLD
    flags = ["--job", "cache", "--policy", "replace", "--reason", "latest wins", "--ttl", "2s",
             "--replace-grace", "30s"]  # fmt: skip
    old = cli(store_url, *flags, "--", "sh", "-c", stubborn, str(work), cwd=work)
    ((old_run, old_pid),) = wait_for("the old child", lambda: started_runs(work)).items()
    check = f'[ -e /proc/{old_pid} ] && touch "$0/overlapped"; echo $$ > "$0/$CRONWARDEN_RUN_ID.pid"'
    new = cli(store_url, *flags, "--", "sh", "-c", check, str(work), cwd=work)

    (old_code, old_err), (new_code, new_err) = finish(old), finish(new)

    assert (old_code, new_code) == (4, 0), (old_err, new_err)
    assert not (work / "overlapped").exists(), "the new child started while the old one was alive"
    with open_store(store_url) as store:
        record = store.run(old_run)
        assert record is not None and record.outcome is Outcome.REPLACED
        assert_one_terminal_per_start(store)


def test_replace_of_a_free_lease_is_a_plain_start(store_url: str, work: Path) -> None:
    p = cli(
        store_url, "--job", "cache", "--policy", "replace", "--reason", "latest wins", "--", "true", cwd=work
    )

    code, err = finish(p)

    assert code == 0, err
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("cache")] == [Outcome.SUCCEEDED]
        assert_one_terminal_per_start(store)


# -- queue -------------------------------------------------------------------


def test_queue_coalesces_five_starts_into_one_more_run(store_url: str, work: Path) -> None:
    flags = ["--job", "drain", "--policy", "queue", "--max-pending", "1", "--ttl", "3s"]
    holder = cli(store_url, *flags, *hold(work), cwd=work)
    (first_run,) = wait_for("the first run", lambda: started_runs(work))

    starts = [cli(store_url, *flags, *hold(work), cwd=work) for _ in range(5)]
    assert [finish(p)[0] for p in starts] == [0] * 5
    with open_store(store_url) as store:
        info = store.lease("drain")
        assert info is not None and (info.owner, info.pending) == (first_run, 1)
    (work / "release").touch()
    code, err = finish(holder)

    assert code == 0, err
    runs = started_runs(work)
    assert len(runs) == 2, f"expected the first run and exactly one more, got {runs}"
    # With max_pending=1, five starts give 1 queued and 4 queue_full (the issue
    # text's "3 queue_full" counts four starts).
    with open_store(store_url) as store:
        assert len(ledger(store, kinds=[EventKind.QUEUED])) == 1
        assert len(ledger(store, kinds=[EventKind.QUEUE_FULL])) == 4
        started = ledger(store, kinds=[EventKind.STARTED])
        assert started[0].run_id == first_run
        assert {e.data["pid"] for e in started} == {holder.pid}  # the holder ran the queued start
        assert started[1].data["token"] > started[0].data["token"]
        assert [r.outcome for r in store.runs("drain")] == [Outcome.SUCCEEDED, Outcome.SUCCEEDED]
        info = store.lease("drain")
        assert info is not None and (info.owner, info.pending) == (None, 0)
        assert_one_terminal_per_start(store)


def test_queue_runs_the_pending_start_even_when_the_run_before_it_failed(store_url: str, work: Path) -> None:
    # The first run fails once released; the queued run succeeds.
    script = HOLD + '; [ -e "$0/failed" ] || { touch "$0/failed"; exit 3; }'
    flags = ["--job", "drain", "--policy", "queue", "--ttl", "3s", "--", "sh", "-c", script, str(work)]
    holder = cli(store_url, *flags, cwd=work)
    wait_for("the first run", lambda: started_runs(work))
    assert finish(cli(store_url, *flags, cwd=work))[0] == 0
    (work / "release").touch()

    code, _ = finish(holder)

    assert code == 3  # the first non-zero status of the runs it made
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("drain")] == [Outcome.SUCCEEDED, Outcome.FAILED]
        assert_one_terminal_per_start(store)


# -- max_runtime -------------------------------------------------------------


def test_max_runtime_stops_the_run_and_records_timed_out(store_url: str, work: Path) -> None:
    max_runtime = 1.0
    p = cli(store_url, "--job", "slow", "--ttl", "3s", "--max-runtime", f"{max_runtime:g}s", *hold(work),
            cwd=work)  # fmt: skip
    ((run_id, pid),) = wait_for("the child", lambda: started_runs(work)).items()

    code, err = finish(p)

    assert code == 124, err
    assert not alive(pid)
    with open_store(store_url) as store:
        record = store.run(run_id)
        assert record is not None and record.outcome is Outcome.TIMED_OUT
        assert record.duration is not None and max_runtime <= record.duration < max_runtime + 2.0
        (timed_out,) = ledger(store, kinds=[EventKind.TIMED_OUT])
        assert timed_out.run_id == run_id
        assert_one_terminal_per_start(store)


def test_sigterm_during_a_queue_drain_ends_the_run_and_starts_no_more(store_url: str, work: Path) -> None:
    flags = ["--job", "drain", "--policy", "queue", "--ttl", "3s"]
    holder = cli(store_url, *flags, *hold(work), cwd=work)
    ((_, child),) = wait_for("the first run", lambda: started_runs(work)).items()
    assert finish(cli(store_url, *flags, *hold(work), cwd=work))[0] == 0

    holder.send_signal(signal.SIGTERM)
    code, _ = finish(holder)

    assert code == 128 + signal.SIGTERM
    assert not alive(child)
    assert len(started_runs(work)) == 1
    with open_store(store_url) as store:
        assert [r.outcome for r in store.runs("drain")] == [Outcome.INTERRUPTED]
        assert_one_terminal_per_start(store)

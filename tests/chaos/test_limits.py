"""What cronwarden does not guarantee, shown with real processes: a process
that left the command's process group (``setsid``) outlives its run when the
keeper that sweeps such processes is itself SIGKILLed, so it can act after
its lease is gone; a Redis failover with asynchronous replication can grant a
held lease again. In both, only a fenced resource refuses the stale holder.
See docs/RELIABILITY.md, "What is not guaranteed".
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from chaos.referee import Referee  # noqa: E402

from cronwarden.events import Outcome  # noqa: E402
from cronwarden.stores.base import End  # noqa: E402

WORKER = os.path.join(ROOT, "chaos", "worker.py")


def guarded(url: str, *command: str, ttl: str = "2s") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cronwarden", "run", "--job", "escape", "--ttl", ttl, "--store", url, "--",
         *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("fenced", [True, False], ids=["fenced", "unfenced"])
def test_a_process_that_left_the_group_outlives_its_run_when_the_keeper_is_sigkilled(
    tmp_path: Path, fenced: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    keeper_file = tmp_path / "keeper"
    with Referee() as referee:
        # The command starts a helper in a new session (out of the group
        # cronwarden stops) that writes 5 s later with the run's token. The
        # keeper (the command's parent) would sweep it when the command
        # ends; here the keeper is SIGKILLed, the command dies with it
        # (PDEATHSIG), the run ends and releases its lease, and the helper
        # is left to init.
        late = [sys.executable, "-S", WORKER, "--port", str(referee.port), "--steps", "1", "--sleep", "5"]
        if not fenced:
            late.append("--no-fencing")
        escape = (
            f"echo $PPID > {keeper_file}; setsid {' '.join(late)} >/dev/null 2>&1 < /dev/null & exec sleep 30"
        )
        first = guarded(url, "sh", "-c", escape)
        deadline = time.monotonic() + 20
        try:
            # The helper said hello to the referee: it has left the group.
            while not (keeper_file.exists() and any(e["op"] == "hello" for e in referee.dump()["log"])):
                assert time.monotonic() < deadline, "the escaped helper never started"
                time.sleep(0.02)
            os.kill(int(keeper_file.read_text()), signal.SIGKILL)
        except BaseException:
            first.kill()  # do not leave it running its 30 s
            first.communicate()
            raise
        _, err = first.communicate(timeout=30)
        assert first.returncode == 137, err
        # The next run takes the lease and works on the resource meanwhile.
        now = [sys.executable, "-S", WORKER, "--port", str(referee.port), "--steps", "1", "--sleep", "0"]
        second = guarded(url, *now)
        _, err = second.communicate(timeout=30)
        assert second.returncode == 0, err
        while sum(1 for e in referee.dump()["log"] if e["op"] == "close") < 2:
            assert time.monotonic() < deadline, f"the escaped helper never finished: {referee.dump()['log']}"
            time.sleep(0.05)
        log = referee.dump()["log"]
    writes = [e for e in log if e["op"] == "write"]
    runs = [e["run"] for e in log if e["op"] == "hello"]
    assert len(set(runs)) == 2, runs
    escaped, current = runs
    # The helper of the first run, which ended before the second started,
    # wrote after the second run: nothing stopped it.
    late_writes = [e for e in writes if e["run"] == escaped]
    assert late_writes and late_writes[0]["t"] > next(e["t"] for e in writes if e["run"] == current)
    # Only fencing keeps its stale write out.
    assert late_writes[0]["ok"] is (not fenced)


def test_a_redis_failover_can_grant_a_held_lease_again_and_fencing_still_orders_the_tokens(
    tmp_path: Path,
) -> None:
    """Asynchronous replication: a grant the primary acknowledged but had not
    yet sent to its replica is gone after a failover, and the promoted replica
    grants the lease again while the first holder still believes it holds it
    (docs/stores/redis.md). What survives is the order of fencing tokens."""
    for module in ("redis", "cronwarden.stores.redis", "tests.redisserver"):
        if importlib.util.find_spec(module) is None:
            unavailable(f"redis: module {module} is missing")
    from tests.contract import start
    from tests.redisserver import RedisServer

    from cronwarden.stores import open_store
    from cronwarden.stores.base import Granted

    primary = RedisServer(tmp_path / "primary")
    primary.start()
    replica = RedisServer(tmp_path / "replica", args=("--replicaof", "127.0.0.1", str(primary.port)))
    try:
        replica.start()
        deadline = time.monotonic() + 20
        while replica.admin().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synchronised"
            time.sleep(0.05)
        with open_store(primary.url(prefix="fo:")) as store:
            # An earlier run of the key, granted and released, reaches the
            # replica: it has the key's token counter.
            earlier = store.acquire(start("failover", ttl=60))
            assert isinstance(earlier, Granted)
            store.finish(earlier.lease, end_now())
            assert primary.admin().execute_command("WAIT", 1, 5000) == 1
            # The link to the replica breaks (a partition, a slow replica):
            # the next grant reaches the primary only.
            replica.pause()
            assert primary.admin().execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
            first = store.acquire(start("failover", ttl=60))
            assert isinstance(first, Granted)  # acknowledged to its holder
        assert first.lease.token == earlier.lease.token + 1
        primary.kill()  # before the replica received that grant
        replica.resume()
        replica.admin().execute_command("REPLICAOF", "NO", "ONE")
        with open_store(replica.url(prefix="fo:")) as store:
            second = store.acquire(start("failover", ttl=60))
        # Exclusion is lost: `first` believes it holds a 60 s lease, and `second` was granted it.
        assert isinstance(second, Granted)
        assert second.lease.run_id != first.lease.run_id
        # Fencing order survives: a fenced resource refuses `first` from now on.
        assert second.lease.token > first.lease.token
    finally:
        replica.stop()
        primary.stop()


def end_now() -> End:
    return End(outcome=Outcome.SUCCEEDED, at=time.time(), exit_code=0)


def unavailable(reason: str) -> None:
    if os.environ.get("CRONWARDEN_REQUIRE_BACKENDS", "") == "1":
        pytest.fail(f"{reason} (CRONWARDEN_REQUIRE_BACKENDS=1)", pytrace=False)
    pytest.skip(reason)

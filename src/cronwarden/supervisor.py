"""The child process of ``cronwarden run``: its own process group, signals
forwarded, killed with its supervisor (G5), stopped before the lease could
expire (G3).

Waiting is event-driven: a pidfd for the child's exit and a pipe the
heartbeat writes to when the lease is lost; the only timed wake-ups are the
deadlines themselves.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from cronwarden.errors import LeaseLost, LeaseRevoked, UsageError
from cronwarden.guard import Run

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died between fork and prctl; then we are orphaned.
    if os.getppid() == 1:
        os._exit(137)


class CommandNotFound(UsageError):
    exit_code = 127


class CommandNotExecutable(UsageError):
    exit_code = 126


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` (never through a shell) in a new process group that dies
    with us."""
    try:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            process_group=0,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            close_fds=True,
        )
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {argv[0]!r}") from None
    except PermissionError:
        raise CommandNotExecutable(f"command not executable: {argv[0]!r}") from None


def exit_status(returncode: int) -> int:
    """A shell's convention: killed by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Runs one child for one guarded run and stops it when the run must stop."""

    def __init__(self, run: Run, argv: Sequence[str], env: Mapping[str, str], *, kill_grace: float,
                 replace_grace: float) -> None:  # fmt: skip
        self.run = run
        self.argv = argv
        self.env = env
        self.kill_grace = kill_grace
        self.replace_grace = replace_grace
        self.child: subprocess.Popen[bytes] | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.signalled: int | None = None
        """The signal forwarded to the child (SIGTERM, SIGINT, SIGHUP), if any:
        someone asked this run to stop, so no queued run may follow it."""

    def _on_lost(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _forward(self, signum: int, _frame: object) -> None:
        self.signalled = signum
        if self.child is not None and self.child.returncode is None:
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                pass

    def execute(self) -> int:
        """Run the child to its end; return its exit status. Sets
        ``run.exit_code`` and, when it had to stop the child, ``run.stopped_by``."""
        previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
        hb = self.run.heartbeat
        hb.on_lost = lambda _why: self._on_lost()
        try:
            self.child = spawn(self.argv, self.env)
            if hb.lost is not None:
                self._on_lost()
            code = self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)
        self.run.exit_code = code
        return code

    def _wait(self) -> int:
        child = self.child
        assert child is not None
        clock = self.run.heartbeat.clock
        hb = self.run.heartbeat
        pidfd = os.pidfd_open(child.pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        try:
            while child.poll() is None:
                now = clock.monotonic()
                why = self.run.lost_reason()
                # Stop early enough that SIGKILL lands before the belief ends.
                if why is None and now >= hb.deadline - self.kill_grace:
                    why = LeaseLost(self.run.lease.key, hb.last_error or "renewal overdue")
                if why is not None:
                    return self._stop(why)
                wake_at = hb.deadline - self.kill_grace
                if hb.stop_at is not None:
                    wake_at = min(wake_at, hb.stop_at)
                timeout = max(0.0, min(wake_at - now, hb.interval))
                poller.poll(timeout * 1000)
            return exit_status(child.returncode)
        finally:
            os.close(pidfd)

    def _stop(self, why: LeaseLost) -> int:
        """SIGTERM to the group, SIGKILL after the grace, reap."""
        child = self.child
        assert child is not None
        self.run.stopped_by = why
        hb = self.run.heartbeat
        grace = self.replace_grace if isinstance(why, LeaseRevoked) else self.kill_grace
        # Whatever grace was asked, the child must be gone before the belief
        # ends: after a revocation renewals are refused, so the lease runs out
        # at the deadline and the replacer may take it; after a refusal or an
        # overdue renewal the deadline is near.
        grace = min(grace, max(0.0, hb.deadline - hb.clock.monotonic()))
        print(f"cronwarden: stopping {self.run.job} run {self.run.run_id}: {why}", file=sys.stderr)
        _killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _killpg(child.pid, signal.SIGKILL)
            child.wait()
        _killpg(child.pid, signal.SIGKILL)  # stragglers left in the group
        return exit_status(child.returncode)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass

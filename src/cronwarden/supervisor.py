"""The child process of ``cronwarden run``: its own process group, signals
forwarded, killed with its supervisor, stopped before the lease could
expire.

Waiting is event-driven: a descriptor that becomes readable when the child
exits and a pipe the heartbeat writes to when the lease is lost; the only
timed wake-ups are the deadlines themselves. The child's descriptor is a
pidfd, or where ``pidfd_open`` fails (kernels before 5.3, seccomp sandboxes
that refuse it, valgrind) a pipe only the child holds open (``_exit_descriptor``).
The keeper itself is in ``keeper``.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from cronwarden.errors import Interrupted, LeaseLost, LeaseRevoked, StopRequested, UsageError
from cronwarden.guard import Run
from cronwarden.keeper import FORWARDED, Launcher, exit_status, keep, libc_prctl, signal_group


class CommandNotFound(UsageError):
    exit_code = 127


class CommandNotExecutable(UsageError):
    exit_code = 126


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _exit_descriptor(pid: int, pipe: int) -> tuple[int, bool]:
    """A descriptor that becomes readable when the child ``pid`` exits, and
    whether it is a pidfd; ``pipe`` is the read end of a pipe whose write end
    only that child holds, closed here if a pidfd is had.

    A pidfd is readable exactly when the child can be reaped. Where there is
    none, the pipe reports EOF once the child's descriptors are closed, which
    the kernel does as it exits, moments before the child can be reaped
    (``Child.poll`` waits out those moments). Not a SIGCHLD handler with
    ``signal.set_wakeup_fd``: that is the main thread's, one per process (it
    would displace asyncio's or the application's), and changes what every
    child's exit does to the whole process.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        # ENOSYS: a kernel before 5.3, or valgrind; EPERM: a seccomp filter;
        # AttributeError: an os module built without it. Or out of
        # descriptors: the pipe is already open.
        return pipe, False
    os.close(pipe)
    return pidfd, True


class Child:
    """The command's keeper (waited on through ``fileno()``, readable when it
    exits) and the command's process group (signalled)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], marker: int | None = None,
                 launcher: Launcher | None = None) -> None:  # fmt: skip
        """Start ``argv`` (never through a shell) under a keeper that dies
        with us and takes the command's group with it. ``marker``, the
        run's marker descriptor, is passed to the keeper and the command.
        The keeper is forked here, or with ``launcher`` by the launcher
        process (see ``keeper``), which dies with us and reaps it."""
        report_r, report_w = os.pipe()
        # Made before the fork, whether or not pidfd_open works: only the
        # keeper may hold the write end (close-on-exec, so the command does not).
        exit_r, exit_w = os.pipe()
        self.launched = launcher is not None
        try:
            if launcher is None:
                pid = self._fork(argv, env, marker, report_w, exit_w)
            else:
                pid = launcher.keeper(argv, env, report_w, exit_w, marker)
        except BaseException:
            os.close(report_r)
            os.close(exit_r)
            raise
        finally:
            os.close(report_w)
            os.close(exit_w)
        self.pid = pid
        self.returncode: int | None = None
        # Not our child when launched: its exit pipe is the descriptor.
        self._exit_fd, self._pidfd = (exit_r, False) if self.launched else _exit_descriptor(pid, exit_r)
        with os.fdopen(report_r, "rb") as f:
            # EOF once the command exec'd (the pipe is close-on-exec) or failed.
            lines = f.read().decode().split()
        group = [int(x[1:]) for x in lines if x.startswith("P")]
        failure = [int(x[1:]) for x in lines if x.startswith("E")]
        self.group = group[0] if group else 0
        if failure or not group:
            self.wait()
            code = failure[0] if failure else 0
            if code == errno.ENOENT:
                raise CommandNotFound(f"command not found: {argv[0]!r}")
            if code in (errno.EACCES, errno.EPERM, errno.ENOEXEC):
                raise CommandNotExecutable(f"command not executable: {argv[0]!r}")
            raise UsageError(f"cannot run {argv[0]!r}: {os.strerror(code) if code else 'keeper failed'}")

    @staticmethod
    def _fork(argv: Sequence[str], env: Mapping[str, str], marker: int | None, report: int,
              held: int) -> int:  # fmt: skip
        prctl = libc_prctl()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 127
            try:
                code = keep(argv, env, parent, report, held, prctl, marker)
            finally:
                os._exit(code)
        return pid

    def signal(self, signum: int) -> None:
        """Signal the command and everything it started."""
        if self.returncode is None and self.group:
            signal_group(self.group, signum)

    def fileno(self) -> int:
        """Readable once the keeper has exited (for ``select`` and ``poll``);
        closed when it has been reaped."""
        return self._exit_fd

    def poll(self) -> int | None:
        if self.returncode is None and self.launched:
            if _readable(self._exit_fd):
                # The launcher's word once it reaped the keeper; nothing (EOF)
                # if it died first, and its keeper (SIGKILLing the command's
                # group as it went) with it.
                said = os.read(self._exit_fd, 32)
                self.returncode = int(said) if said else -signal.SIGKILL
                os.close(self._exit_fd)
        elif self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if not pid and not self._pidfd and _readable(self._exit_fd):
                # EOF on the exit pipe: the keeper is exiting (only its exit
                # closes its end), it is reapable within moments, and until
                # then the pipe stays readable; a loop selecting on it would
                # spin, so block for those moments.
                pid, status = os.waitpid(self.pid, 0)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                os.close(self._exit_fd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The keeper's exit status (the command's), or None if still running
        after ``timeout``."""
        while self.poll() is None:
            ready, _, _ = select.select([self], [], [], timeout)
            if not ready and timeout is not None:
                return None
        return self.returncode


class Sender(NamedTuple):
    """Who sent a signal, as the kernel tells ``sigwaitinfo``."""

    pid: int
    name: str | None
    """The sender's process name (``/proc/PID/comm``) when it was read, if
    the sender was still there to read."""


class SignalRelay:
    """SIGTERM, SIGINT and SIGHUP for the whole life of a guarded run.

    From before the lease is taken until its end is recorded, these signals
    are remembered and passed to the command's group while one runs; they
    never kill cronwarden between its ledger writes, which would leave a
    started run with no terminal record and its lease held until expiry.
    The supervisor gives the command its kill grace to exit, then SIGKILLs
    its group, and the run is recorded ``interrupted``.

    Who sent the signal: a Python signal handler is not told, so when the
    relay is entered in a process with no other thread yet, the signals are
    blocked (in every thread started after) and one thread takes them with
    ``sigwaitinfo``, which carries the sender's pid. In a process that
    already has threads a signal could reach one of them; there the plain
    handlers take the signals and the sender stays unknown.

    As PID 1 (a container's entrypoint) it also reaps the zombies the
    kernel hands it: processes orphaned in the container outside the
    command's tree (the keeper reaps those inside it).
    """

    def __init__(self) -> None:
        self.signalled: int | None = None
        """The last such signal received, if any: someone asked this run to
        stop, so no queued run may follow it."""
        self.first: tuple[int, Sender | None] | None = None
        """The first such signal, which asked for the stop, and who sent it
        when the kernel said (see the class): what the run records."""
        self.child: Child | None = None
        self.wake: Callable[[], None] | None = None
        """Called after a signal, to wake the supervisor's wait."""
        self._previous: dict[int, Any] = {}
        self._waiter: threading.Thread | None = None
        self._closed = False
        self._late: list[int] = []
        """Signals the waiter took after ``close`` began, raised again after."""

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._received(signum, None)

    def _received(self, signum: int, sender: Sender | None) -> None:
        # signalled before child: a command started meanwhile sees it (execute).
        if self.first is None:
            self.first = (signum, sender)
        self.signalled = signum
        if self.child is not None:
            self.child.signal(signum)
        if self.wake is not None:
            self.wake()

    def _take_signals(self) -> None:
        """The waiter thread: each forwarded signal with its sender, until
        ``close`` wakes it with a signal of its own."""
        while True:
            info = signal.sigwaitinfo(FORWARDED)
            if self._closed:
                if info.si_pid == os.getpid():  # close's wake-up: no other process has our pid
                    return
                self._late.append(info.si_signo)  # for the handlers close restored
                continue
            # The kernel names a sender that used kill/sigqueue (si_code <=
            # 0); a signal it raised itself (a terminal hang-up) or one from
            # outside this pid namespace has pid 0: unknown.
            pid = info.si_pid if info.si_code <= 0 and info.si_pid > 0 else None
            self._received(info.si_signo, None if pid is None else Sender(pid, _process_name(pid)))

    def __enter__(self) -> SignalRelay:
        self._previous = {s: signal.signal(s, self._on_signal) for s in FORWARDED}
        if os.getpid() == 1:
            self._previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._on_child)
        if threading.active_count() == 1:
            signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
            self._waiter = threading.Thread(target=self._take_signals, name="cronwarden-signals", daemon=True)
            self._waiter.start()
        return self

    def _on_child(self, _signum: int, _frame: object) -> None:
        reap_orphans(None if self.child is None else self.child.pid)

    def interrupted(self, detail: str, **how: Any) -> Interrupted:
        """The ``Interrupted`` of the first signal received, with its sender."""
        signum, sender = self._first()
        return Interrupted(signum, detail, sender_pid=None if sender is None else sender.pid,
                           sender=None if sender is None else sender.name, **how)  # fmt: skip

    def describe(self) -> str:
        """The first signal and its sender, as a line says it."""
        signum, sender = self._first()
        name = signal.Signals(signum).name
        if sender is None:
            return name
        return f"{name} from pid {sender.pid}" + (f" ({sender.name})" if sender.name else "")

    def _first(self) -> tuple[int, Sender | None]:
        if self.first is not None:
            return self.first
        # Set from outside (the scheduler passes its own signal on): no sender.
        assert self.signalled is not None
        return self.signalled, None

    def close(self) -> None:
        """Give the signals back: the previous handlers, and the mask as it
        was (a signal that came meanwhile goes to the restored handler)."""
        if self._closed:
            return
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._closed = True
        if self._waiter is not None:
            assert self._waiter.ident is not None
            signal.pthread_kill(self._waiter.ident, signal.SIGHUP)  # wakes it: it returns
            self._waiter.join(timeout=5)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
            for signum in self._late:
                signal.raise_signal(signum)

    def __exit__(self, *exc: object) -> None:
        self.close()


def _process_name(pid: int) -> str | None:
    """``/proc/PID/comm``, read as soon as the signal is taken: the sender
    may be gone (or its pid reused) by the time anyone asks."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            name = f.read().decode(errors="replace").strip()
    except OSError:
        return None
    return name if name.isprintable() else repr(name)


def reap_orphans(keeper: int | None) -> list[int]:
    """Reap every exited child of this process but ``keeper`` (whose status
    ``Child.poll`` waits for). For PID 1, whose children include whatever
    the kernel reparents to it. Returns the pids reaped."""
    reaped = []
    for pid in _own_children():
        if pid == keeper:
            continue
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done:
            reaped.append(done)
    return reaped


def _own_children() -> list[int]:
    """This process's children, from every thread's children file (an
    orphan is adopted by any live thread of its new parent)."""
    found: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                found += [int(pid) for pid in f.read().split()]
        except OSError:
            continue
    return found


class Exit(NamedTuple):
    """How the command of a run ended."""

    code: int
    """Its exit status (128+N if killed by signal N)."""
    stopped_by: LeaseLost | None = None
    """Why the supervisor stopped it (lease lost, revoked, timed out), if it did."""
    interrupted: Interrupted | None = None
    """The signal cronwarden itself was told to stop with while the command
    ran, if one came (the command was given it, then SIGKILL after the grace)."""


class Supervisor:
    """Runs one child for one guarded run and stops it when the run must stop."""

    def __init__(self, run: Run, argv: Sequence[str], env: Mapping[str, str], *, kill_grace: float,
                 replace_grace: float, relay: SignalRelay,
                 on_started: Callable[[Child], None] | None = None,
                 launcher: Launcher | None = None) -> None:  # fmt: skip
        """``on_started`` is told the child once its command runs (the
        scheduler says so, with the pid); ``launcher`` forks its keeper
        (``Child``)."""
        self.on_started = on_started
        self.launcher = launcher
        self.run = run
        self.argv = argv
        self.env = env
        self.kill_grace = kill_grace
        self.replace_grace = replace_grace
        self.relay = relay
        self.child: Child | None = None
        self._wake_r, self._wake_w = os.pipe()

    def _wake(self) -> None:
        """Wake ``_wait`` to read the heartbeat again (a renewal, a loss)."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def execute(self) -> Exit:
        """Run the child to its end: its exit status, and why it was stopped
        if the supervisor had to stop it."""
        hb = self.run.heartbeat
        hb.on_lost = lambda _why: self._wake()
        hb.on_renewed = self._wake
        self.relay.wake = self._wake
        try:
            marker = self.run.marker
            self.child = Child(self.argv, self.env, None if marker is None else marker.fd, self.launcher)
            self.relay.child = self.child
            if self.relay.signalled is not None:  # arrived while the command was starting
                self.child.signal(self.relay.signalled)
            if hb.lost is not None:
                self._wake()
            if self.on_started is not None:
                self.on_started(self.child)
            return self._wait()
        finally:
            self.relay.child = None
            self.relay.wake = None
            hb.on_lost = hb.on_renewed = None
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wait(self) -> Exit:
        child = self.child
        assert child is not None
        clock = self.run.heartbeat.clock
        hb = self.run.heartbeat
        poller = select.poll()
        poller.register(child, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        signalled: int | None = None
        kill_at: float | None = None  # after a signal to cronwarden: when the command's grace ends
        killed = False
        while child.poll() is None:
            now = clock.monotonic()
            if signalled is None and self.relay.signalled is not None:
                signalled = self.relay.signalled  # the handler has passed it to the command's group
                kill_at = now + self.kill_grace
                self._say_stopping()
            if kill_at is not None and not killed and now >= kill_at:
                child.signal(signal.SIGKILL)
                killed = True
            why = self.run.lost_reason()
            # Stop early enough that SIGTERM's grace ends before the belief
            # does; but not for a renewal that is only late (this process was
            # frozen or starved, the store did not fail): it may still land
            # before the deadline, and if it does not, lost_reason stops the
            # child at the deadline, with SIGKILL at once (issue 6: a pause
            # of half the ttl, thawed in the grace window, kept its lease).
            wake_at = hb.deadline - self.kill_grace
            if why is None and now >= wake_at:
                late_until = hb.late_until(now, within=self.kill_grace)
                if late_until is None:
                    why = LeaseLost(self.run.lease.key, hb.last_error or "renewal overdue")
                else:  # until it lands, fails, or has waited on the store for the grace
                    wake_at = late_until
            if why is not None:
                return self._stop(why)
            if hb.stop_at is not None:
                wake_at = min(wake_at, hb.stop_at)
            if kill_at is not None and not killed:
                wake_at = min(wake_at, kill_at)
            timeout = max(0.0, min(wake_at - now, hb.interval))
            if poller.poll(timeout * 1000) and _readable(self._wake_r):
                os.read(self._wake_r, 64)  # drained: the loop re-reads the heartbeat and the relay
        code = exit_status(child.poll() or 0)
        # The handler passes the signal on at once: the command may have died
        # of it before this loop looked at the relay again.
        if self.relay.signalled is None:
            return Exit(code)
        if signalled is None:  # it died of the signal before the loop said so
            self._say_stopping()
        waited = 0.0 if kill_at is None else max(0.0, clock.monotonic() - (kill_at - self.kill_grace))
        if killed:
            how = f"the command was killed after its {self.kill_grace:g}s grace"
        else:
            how = f"the command stopped with exit status {code} within its {self.kill_grace:g}s grace"
        return Exit(code, interrupted=self.relay.interrupted(how, grace=self.kill_grace, waited=waited,
                                                             sigkill=killed))  # fmt: skip

    def _say_stopping(self) -> None:
        print(f"cronwarden: {self.relay.describe()} received; stopping {self.run.job} run "
              f"{self.run.run_id} (SIGKILL after {self.kill_grace:g}s)", file=sys.stderr)  # fmt: skip

    def _stop(self, why: LeaseLost) -> Exit:
        """SIGTERM to the group, SIGKILL after the grace, reap."""
        child = self.child
        assert child is not None
        hb = self.run.heartbeat
        if isinstance(why, StopRequested):
            grace = why.grace  # cronwarden stop --grace
        elif isinstance(why, LeaseRevoked):
            grace = self.replace_grace
        else:
            grace = self.kill_grace
        # Whatever grace was asked, the child must be gone before the belief
        # ends: after a revocation renewals are refused, so the lease runs out
        # at the deadline and the replacer may take it; after a refusal or an
        # overdue renewal the deadline is near.
        grace = min(grace, max(0.0, hb.deadline - hb.clock.monotonic()))
        print(f"cronwarden: stopping {self.run.job} run {self.run.run_id}: {why}", file=sys.stderr)
        child.signal(signal.SIGTERM)
        if child.wait(timeout=grace) is None:
            child.signal(signal.SIGKILL)
        code = child.wait()
        assert code is not None
        return Exit(exit_status(code), stopped_by=why)

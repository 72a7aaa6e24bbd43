"""The child process of ``cronwarden run``: its own process group, signals
forwarded, killed with its supervisor, stopped before the lease could
expire.

Waiting is event-driven: a descriptor that becomes readable when the child
exits and a pipe the heartbeat writes to when the lease is lost; the only
timed wake-ups are the deadlines themselves. The child's descriptor is a
pidfd, or where ``pidfd_open`` fails (kernels before 5.3, seccomp sandboxes
that refuse it, valgrind) a pipe only the child holds open (``_exit_descriptor``).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from cronwarden.errors import Interrupted, LeaseLost, LeaseRevoked, StopRequested, UsageError
from cronwarden.guard import Run

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_DIED = signal.SIGUSR1
"""What the kernel sends the keeper when the supervisor dies."""


class CommandNotFound(UsageError):
    exit_code = 127


class CommandNotExecutable(UsageError):
    exit_code = 126


def _prctl() -> Callable[..., int]:
    import ctypes

    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def _keep(argv: Sequence[str], env: Mapping[str, str], parent: int, report: int, held: int,
          prctl: Callable[..., int], marker: int | None) -> int:  # fmt: skip
    """The keeper: a fork of the supervisor (no exec) that starts the command
    in a new process group and answers for the whole group.

    ``PR_SET_PDEATHSIG`` reaches only the direct child of a process that
    dies, so a command that is a shell script would leave its own children
    running under a lease about to expire. The keeper is that direct child:
    when the supervisor dies it SIGKILLs the command's group. It is also
    the subreaper of everything the command starts, so every process of the
    command is reaped here rather than left a zombie, and when the command
    exits it stops what the command left behind, in its group or out of it
    (``_sweep``): the run ends with its command.

    ``held`` is the write end of the supervisor's exit pipe: kept open, never
    written, it closes when the keeper exits (``_exit_descriptor``).
    ``marker`` is the run's marker (``local``): the keeper and the command's
    processes hold it, so it stays locked while any of them lives.
    """
    _close_fds(keep=(report, held) if marker is None else (report, held, marker))
    # A group of its own: a kill of the supervisor's whole group (timeout -k,
    # kill -9 -PGID) must leave the keeper alive to take the command down.
    os.setpgid(0, 0)
    keeper = os.getpid()
    group = 0
    stop = False

    def supervisor_died(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True
        if group:
            _killpg(group, signal.SIGKILL)

    signal.signal(PARENT_DIED, supervisor_died)
    for s in (*FORWARDED, signal.SIGTTOU):  # the supervisor signals the command's group itself
        signal.signal(s, signal.SIG_IGN)
    # The supervisor may block them (SignalRelay): the command must get them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    prctl(PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        return 137
    command = os.fork()
    if command == 0:
        try:
            os.setpgid(0, 0)
            # Second layer: if the keeper itself is killed, so is the command.
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != keeper:
                os._exit(137)
            # Python ignores SIGPIPE and SIGXFSZ, and the keeper the forwarded
            # signals; the command expects defaults.
            for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTOU, PARENT_DIED, *FORWARDED):
                signal.signal(s, signal.SIG_DFL)
            if marker is not None:
                os.set_inheritable(marker, True)
            os.execvpe(argv[0], list(argv), dict(env))
        except OSError as e:
            os.write(report, f"E{e.errno}\n".encode())
        os._exit(127)
    try:
        os.setpgid(command, command)
    except OSError:
        pass  # the command already did it, or already exited
    group = command
    terminal = _take_terminal(parent, group)
    os.write(report, f"P{command}\n".encode())
    os.close(report)
    if stop:
        _killpg(group, signal.SIGKILL)
    status = 0
    while True:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == command:
            status = exit_status(os.waitstatus_to_exitcode(raw))
            break
    _sweep(group, keeper)
    if terminal is not None:
        _give_back_terminal(terminal)
    return status


SWEEP_GIVE_UP = 0.5
"""Seconds the keeper waits, after the last process it reaped, for what the
command left to die after SIGKILL."""
SWEEP_HARD_STOP = 2.0
"""Seconds the whole sweep may take. What outlasts it (a process in
uninterruptible sleep, one the keeper may not signal, such as a setuid
program's) is left running, signalled."""


def _sweep(group: int, keeper: int) -> None:
    """Stop and reap everything the command left behind once it has exited.

    Its process group gets SIGKILL, and so does every process that left the
    group (``setsid``, a double-forking daemon): the keeper is their
    subreaper, so once the process that started one is gone, it is the
    keeper's child. Killing one orphans its own children to the keeper in
    turn, so the sweep repeats while it makes progress, until the keeper has
    no children left. No process of the run works on after its run ended
    and its lease was released.
    """
    _killpg(group, signal.SIGKILL)
    now = time.monotonic()
    hard_stop = now + SWEEP_HARD_STOP
    give_up = now + SWEEP_GIVE_UP
    while True:
        _kill_children(keeper)
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        now = time.monotonic()
        if pid:
            # A layer died; the next one may be on its way to the keeper.
            give_up = min(now + SWEEP_GIVE_UP, hard_stop)
        if now >= give_up:  # hard_stop bounds even a sweep that keeps reaping
            break
        if not pid:
            time.sleep(0.005)
    _kill_children(keeper)  # what arrived meanwhile is signalled, if not waited for


def _kill_children(keeper: int) -> None:
    for pid in _children(keeper):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _children(keeper: int) -> list[int]:
    """The keeper's children, living or not yet reaped."""
    try:
        with open("/proc/thread-self/children", "rb") as f:  # the keeper has one thread
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
    # A kernel without CONFIG_PROC_CHILDREN: find them by their parent.
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # After the command name, which may hold spaces and parentheses: state, ppid.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == keeper:
            found.append(int(name))
    return found


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _take_terminal(parent: int, group: int) -> int | None:
    """Run from a terminal, the command's group (not the supervisor's) must be
    the foreground one, or a command that reads the terminal is stopped by
    SIGTTIN while its lease is renewed forever. Returns the group to give the
    terminal back to."""
    try:
        if not os.isatty(0):
            return None
        foreground = os.tcgetpgrp(0)
        if foreground != os.getpgid(parent):
            return None  # cronwarden itself runs in the background
        os.tcsetpgrp(0, group)
        return foreground
    except OSError:
        return None


def _give_back_terminal(foreground: int) -> None:
    try:
        os.tcsetpgrp(0, foreground)
    except OSError:
        pass


def _close_fds(keep: Collection[int]) -> None:
    """Close every descriptor above stderr but those in ``keep`` (like Popen's
    close_fds): the store's sockets and files are the supervisor's."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


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

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], marker: int | None = None) -> None:
        """Start ``argv`` (never through a shell) under a keeper that dies
        with us and takes the command's group with it. ``marker``, the
        run's marker descriptor, is passed to the keeper and the command."""
        prctl = _prctl()  # load libc before forking, not in the child
        report_r, report_w = os.pipe()
        # Made before the fork, whether or not pidfd_open works: only the
        # keeper may hold the write end (close-on-exec, so the command does not).
        exit_r, exit_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 127
            try:
                code = _keep(argv, env, parent, report_w, exit_w, prctl, marker)
            finally:
                os._exit(code)
        os.close(report_w)
        os.close(exit_w)
        self.pid = pid
        self.returncode: int | None = None
        self._exit_fd, self._pidfd = _exit_descriptor(pid, exit_r)
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

    def signal(self, signum: int) -> None:
        """Signal the command and everything it started."""
        if self.returncode is None and self.group:
            _killpg(self.group, signum)

    def fileno(self) -> int:
        """Readable once the keeper has exited (for ``select`` and ``poll``);
        closed when it has been reaped."""
        return self._exit_fd

    def poll(self) -> int | None:
        if self.returncode is None:
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


def exit_status(returncode: int) -> int:
    """A shell's convention: killed by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


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
                 on_started: Callable[[Child], None] | None = None) -> None:  # fmt: skip
        """``on_started`` is told the child once its command runs (the
        scheduler says so, with the pid)."""
        self.on_started = on_started
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
            self.child = Child(self.argv, self.env, None if marker is None else marker.fd)
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


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass

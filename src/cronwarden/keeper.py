"""A run's keeper, and the launcher that starts keepers for the scheduler.

The keeper (``keep``) stands between cronwarden and the command: it starts
the command in a process group of its own and answers for that group.
``Supervisor`` starts one per run. By default it forks the supervising
process itself; ``cronwarden scheduler`` has its keepers forked by a
``Launcher`` instead, a small helper process started with the scheduler,
because a fork copies the page tables of the process forked and the child
then copies each page it writes: for a scheduler holding thousands of jobs
that cost several times the command itself, at every fire. The launcher
process (``python -m cronwarden.keeper``) imports only this module and the
standard library. It dies with the scheduler (``PR_SET_PDEATHSIG``), and
each of its keepers with it, taking its command's group down: the same chain
as a keeper forked by the supervisor.

A keeper forked by the supervisor forks again for the command, to give the
command a parent death signal of its own: a keeper that is killed takes its
command with it. A keeper forked by the launcher starts its command with
``posix_spawn`` instead, which copies no page table (the second fork of a
Python process was most of what a fire cost): there the launcher is the
command's second parent. It is the subreaper of its keepers' trees, so the
command of a keeper that was killed becomes its child, and it kills that
command's group (``serve``).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_DIED = signal.SIGUSR1
"""What the kernel sends the keeper when its parent dies (the supervisor, or
the launcher, which dies with the scheduler)."""


def libc_prctl() -> Callable[..., int]:
    """libc's ``prctl``: loaded before forking, not in the child."""
    import ctypes

    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def keep(argv: Sequence[str], env: Mapping[str, str], parent: int, report: int, held: int,
         prctl: Callable[..., int], marker: int | None, *, spawn: bool = False) -> int:  # fmt: skip
    """The keeper: a fork of the supervisor or the launcher (no exec) that starts the command
    in a new process group and answers for the whole group; its exit status.

    ``PR_SET_PDEATHSIG`` reaches only the direct child of a process that
    dies, so a command that is a shell script would leave its own children
    running under a lease about to expire. The keeper is that direct child:
    when its parent dies it SIGKILLs the command's group. It is also
    the subreaper of everything the command starts, so every process of the
    command is reaped here rather than left a zombie, and when the command
    exits it stops what the command left behind, in its group or out of it
    (``_sweep``): the run ends with its command.

    ``held`` is the write end of the supervisor's exit pipe: kept open, never
    written here, it closes when the keeper exits (``_exit_descriptor``); the
    launcher writes a keeper's exit status to it (``Launcher.keeper``).
    ``marker`` is the run's marker (``local``): the keeper and the command's
    processes hold it, so it stays locked while any of them lives.
    ``spawn`` (the launcher's keepers): the command is started with
    ``posix_spawn``, not forked (see the module).
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
            signal_group(group, signal.SIGKILL)

    signal.signal(PARENT_DIED, supervisor_died)
    for s in (*FORWARDED, signal.SIGTTOU):  # the supervisor signals the command's group itself
        signal.signal(s, signal.SIG_IGN)
    # The supervisor may block them (SignalRelay): the command must get them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    prctl(PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        return 137
    if spawn:
        try:
            command = _spawn(argv, env, marker)
        except OSError as e:
            os.write(report, f"E{e.errno}\n".encode())
            return 127
    else:
        command = _fork_command(argv, env, marker, keeper, report, prctl)
    try:
        os.setpgid(command, command)
    except OSError:
        pass  # the command already did it, or already exited
    group = command
    terminal = _take_terminal(parent, group)
    os.write(report, f"P{command}\n".encode())
    os.close(report)
    if stop:
        signal_group(group, signal.SIGKILL)
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


DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTOU, PARENT_DIED, *FORWARDED)
"""Signals the command starts with at their default: Python ignores SIGPIPE
and SIGXFSZ, the keeper the forwarded signals and SIGTTOU."""


def _fork_command(argv: Sequence[str], env: Mapping[str, str], marker: int | None, keeper: int,
                  report: int, prctl: Callable[..., int]) -> int:  # fmt: skip
    """Fork the command, in a group of its own and killed if the keeper is; its pid."""
    command = os.fork()
    if command == 0:  # pragma: no cover - runs in the command, until its exec
        try:
            os.setpgid(0, 0)
            # Second layer: if the keeper itself is killed, so is the command.
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != keeper:
                os._exit(137)
            for s in DEFAULTS:
                signal.signal(s, signal.SIG_DFL)
            if marker is not None:
                os.set_inheritable(marker, True)
            os.execvpe(argv[0], list(argv), dict(env))
        except OSError as e:
            os.write(report, f"E{e.errno}\n".encode())
        os._exit(127)
    return command


def _spawn(argv: Sequence[str], env: Mapping[str, str], marker: int | None) -> int:
    """``posix_spawn`` the command in a group of its own, looked up in
    ``env``'s PATH as ``os.execvpe`` does it (the first error other than
    "not there" is the one raised); its pid."""
    if marker is not None:
        os.set_inheritable(marker, True)  # the keeper holds it anyway, and spawns nothing else
    name = argv[0]
    paths = [name] if os.path.dirname(name) else [os.path.join(d, name) for d in os.get_exec_path(env)]
    args, environ = list(argv), dict(env)
    saved: OSError | None = None
    last: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    for path in paths:
        try:
            os.stat(path)  # a name not there costs no process
            return os.posix_spawn(path, args, environ, setpgroup=0, setsigdef=DEFAULTS)
        except (FileNotFoundError, NotADirectoryError) as e:
            last = e
        except OSError as e:
            last = e
            saved = saved or e
    raise saved or last


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
    signal_group(group, signal.SIGKILL)
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


def exit_status(returncode: int) -> int:
    """A shell's convention: killed by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pgid: int, signum: int) -> None:
    """Signal a process group, if it is still there to be signalled."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


HEADER = struct.Struct("!i")
"""Each message's first bytes: the length of the request that follows, or
the launcher's answer (a keeper's pid, or minus the errno of a failed fork)."""


class LauncherGone(OSError):
    """The launcher process died (someone killed it): its keepers took their
    commands down with them."""


class Launcher:
    """The scheduler's side of the launcher process: ``keeper`` forks one
    run's keeper there. Usable from any thread (one request at a time); a
    launcher that died is started again at the next request."""

    def __init__(self) -> None:
        import subprocess

        self._popen = subprocess.Popen
        self._lock = threading.Lock()
        self._process: Any = None
        self._sock: socket.socket | None = None
        self._start()

    @property
    def pid(self) -> int:
        """The launcher process's."""
        return int(self._process.pid)

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            # stdin, stdout and stderr are the scheduler's: its runs' commands inherit them.
            argv = [sys.executable, "-m", "cronwarden.keeper", str(theirs.fileno()), str(os.getpid())]
            self._process = self._popen(argv, pass_fds=(theirs.fileno(),))
        self._sock = ours

    def keeper(self, argv: Sequence[str], env: Mapping[str, str], report: int, held: int,
               marker: int | None) -> int:  # fmt: skip
        """Fork a keeper of ``argv`` in the launcher (``keep``, given copies of
        ``report``, ``held`` and ``marker``); its pid. The keeper is not this
        process's child: the launcher reaps it, and then writes its exit
        status (``os.waitstatus_to_exitcode``) to ``held``, whose read end
        is thus readable once the keeper is gone (``Child.poll``)."""
        request = json.dumps({"argv": list(argv), "env": dict(env)}).encode()
        fds = [report, held] if marker is None else [report, held, marker]
        with self._lock:
            try:
                self._send(request, fds)
            except ConnectionError:
                # Gone before it had the whole request, so nothing started:
                # start another and ask it. (From this thread: it dies when
                # this thread ends, as a parent death signal follows the
                # thread, which a fire's worker does only when the scheduler
                # stops.)
                self._restart()
                self._send(request, fds)
            try:
                return self._answer()
            except (LauncherGone, ConnectionError):
                # Gone once it had the request: its keeper may have started
                # the command before dying with it, so this run is not asked
                # for again; the next one gets a new launcher.
                self._restart()
                raise LauncherGone("the launcher process died while starting the command") from None

    def _send(self, request: bytes, fds: list[int]) -> None:
        assert self._sock is not None
        message = HEADER.pack(len(request)) + request
        sent = socket.send_fds(self._sock, [message], fds)
        self._sock.sendall(message[sent:])  # a signal may cut a long message short

    def _answer(self) -> int:
        assert self._sock is not None
        answer = _read_exactly(self._sock, HEADER.size)
        if answer is None:
            raise LauncherGone("the launcher process is gone")
        (pid,) = HEADER.unpack(answer)
        if pid < 0:
            raise OSError(-pid, f"could not start the keeper: {os.strerror(-pid)}")
        return int(pid)

    def _restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        """Stop the launcher (at EOF it exits; a keeper still going then
        kills its command's group) and reap it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._process is not None:
            self._process.wait()
            self._process = None


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or None at EOF."""
    got = b""
    while len(got) < n:
        more = sock.recv(n - len(got))
        if not more:
            return None
        got += more
    return got


def serve(sock: socket.socket, parent: int) -> int:
    """The launcher process: fork a keeper for each request on ``sock`` until
    the scheduler (``parent``) closes it; reap the keepers and pass on their
    exit statuses."""
    prctl = libc_prctl()
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The commands' second parent (see the module): a killed keeper's command
    # is handed here, not to init.
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if os.getppid() != parent:  # the scheduler died before prctl took effect
        return 1
    # In the scheduler's process group: a Ctrl-C reaches it too, and the
    # scheduler, not the launcher, decides how its runs stop.
    for s in FORWARDED:
        signal.signal(s, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # the wakeup fd ends the select
    held: dict[int, int] = {}
    """Each keeper's exit pipe, by pid: written its status once reaped."""
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            while _drain(wake_r):
                pass
        _reap(held)
        if sock.fileno() not in ready:
            continue
        request = _receive(sock)
        if request is None:
            return 0  # the scheduler is done
        (argv, env), fds = request
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            sock.sendall(HEADER.pack(-(e.errno or 1)))
            continue
        if pid == 0:  # pragma: no cover - runs in the keeper
            code = 127
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                code = keep(
                    argv, env, me, fds[0], fds[1], prctl, fds[2] if len(fds) > 2 else None, spawn=True
                )
            finally:
                os._exit(code)
        os.close(fds[0])
        for fd in fds[2:]:
            os.close(fd)
        held[pid] = fds[1]
        sock.sendall(HEADER.pack(pid))


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(held: dict[int, int]) -> None:
    """Reap what exited, and write each keeper's exit status to its pipe. A
    keeper killed by a signal did not stop its command: the command is this
    process's child now (its subreaper), and any child that is not a keeper
    is what is left of a run whose keeper is gone: killed with its group
    (and what it started, handed here as it dies, in turn)."""
    orphaned = False
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not pid:
            break
        fd = held.pop(pid, None)
        if fd is None:
            orphaned = True
            continue
        os.write(fd, str(os.waitstatus_to_exitcode(raw)).encode())  # far below a pipe's buffer
        os.close(fd)
        orphaned = orphaned or os.WIFSIGNALED(raw)
    if orphaned:
        for pid in _children(os.getpid()):
            if pid not in held:
                signal_group(pid, signal.SIGKILL)  # a command leads its group
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _receive(sock: socket.socket) -> tuple[tuple[list[str], dict[str, str]], list[int]] | None:
    """One request: the command and its environment, and the descriptors
    sent with it (close-on-exec, so the command inherits only the marker,
    which ``keep`` makes inheritable); None at EOF."""
    head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, 3)
    for fd in fds:
        # Received inheritable: a command holding the report pipe would keep
        # its reader waiting until the command ends.
        os.set_inheritable(fd, False)
    if not head:
        return None
    rest = _read_exactly(sock, HEADER.size - len(head))
    (length,) = HEADER.unpack(head + (rest or b""))
    body = _read_exactly(sock, length)
    if body is None:
        return None
    request = json.loads(body)
    return (request["argv"], request["env"]), fds


if __name__ == "__main__":
    sys.exit(serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2])))

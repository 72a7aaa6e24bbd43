"""Evidence, on this host, that a run's processes are gone.

Each run started here leaves a marker: a file named by its run id, locked
(``flock``) from before its work starts until its end is recorded. The lock
is held by an open file description that every process of the run shares:
the supervisor (or the library's process), the keeper, and the command and
what it starts (they inherit the descriptor). The kernel drops the lock when
the last of them exits, however it exits (``kill -9`` included), so a marker
that can be locked is a run none of whose processes is left, even when its
pids were reused. That is stronger than comparing pids and start times, and
costs one small file per run.

A start that finds such a marker for its job closes the dead run at once
(``abandoned``, through the store's own compare of the owner) instead of
waiting for its lease to expire. A marker the next start never sees (the
job is not started again) is left for the next start of that job; a
reboot clears it with the runtime directory (or it is locked by nobody, so
found dead, which it is).

Only this host's runs have markers here: runs on other hosts, or in other
containers of this host (their own runtime directory), still wait out
their lease.
"""

from __future__ import annotations

import fcntl
import os
import zlib

ENV_RUNTIME_DIR = "CRONWARDEN_RUNTIME_DIR"


def runtime_dir(store_url: str, host: str) -> str:
    """Where this host's markers for the store ``store_url`` live: one
    directory per user, store and host id (``CRONWARDEN_HOST`` may differ
    between processes on one machine: each sees only its own host's)."""
    base = os.environ.get(ENV_RUNTIME_DIR)
    if not base:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        if xdg:
            base = os.path.join(xdg, "cronwarden")
        else:
            # tmpfs where there is one: emptied at boot, as the runs are.
            root = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
            base = os.path.join(root, f"cronwarden-{os.getuid()}")
    store = f"{zlib.crc32(store_url.encode()):08x}"
    return os.path.join(base, store, host.replace("/", "_"))


class Marker:
    """A live run's marker, locked while any process of the run lives."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        """Inherit it into every process of the run (``os.set_inheritable``)."""

    def release(self) -> None:
        """The run's end is recorded: remove the marker."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        """Let go of the marker, leaving it: once every process of the run
        has too, the next start here finds the run dead."""
        try:
            os.close(self.fd)
        except OSError:
            pass


def mark(directory: str, job: str, key: str, run_id: str, token: int) -> Marker | None:
    """Leave the marker of a run that was just granted its lease. None when
    the directory cannot be written: the run is unaffected, a start after
    its death waits out the lease as it would without markers."""
    folder = os.path.join(directory, job)
    path = os.path.join(folder, run_id)
    fd = -1
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        # Locked under a temporary name, then renamed: a marker is never
        # visible unlocked while its run lives.
        tmp = f"{path}.new"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        pid = os.getpid()
        os.write(fd, f"{token}\n{key}\n{pid}\n{_started(pid)}\n".encode())
        os.rename(tmp, path)
    except OSError:
        if fd >= 0:
            os.close(fd)
        return None
    return Marker(path, fd)


class DeadRun:
    """A run of this host whose processes are all gone."""

    def __init__(self, run_id: str, key: str, token: int, path: str, fd: int) -> None:
        self.run_id = run_id
        self.key = key
        self.token = token
        self._path = path
        self._fd = fd

    def forget(self) -> None:
        """Its end is recorded: remove the marker."""
        Marker(self._path, self._fd).release()

    def close(self) -> None:
        """Leave the marker for another start to find."""
        Marker(self._path, self._fd).close()


def dead_runs(directory: str, job: str) -> list[DeadRun]:
    """This host's runs of ``job`` whose markers no process holds. Each is
    returned locked by this process, until ``forget``."""
    folder = os.path.join(directory, job)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".new"):
            _drop_if_unlocked(path)  # its maker died before it was a marker
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            token, key, pid, started = os.read(fd, 4096).decode().split("\n")[:4]
            # Belt and braces: a process that closed the descriptor it was
            # given (a library process calling closerange) is still alive.
            if _started(int(pid)) == started:
                raise ValueError("its process still runs")
            found.append(DeadRun(name, key, int(token), path, fd))
        except (OSError, ValueError):
            os.close(fd)  # held: a process of the run lives (or the marker is not ours)
    return found


def _drop_if_unlocked(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Its maker is gone, or between its open and its flock: then its
        # rename fails and that run simply has no marker.
        os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _started(pid: int) -> str:
    """``pid``'s start time (clock ticks after boot), or "" if it is gone:
    a pid reused by another process has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    # After the command name, which may hold spaces and parentheses: field 3 on.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return ""  # a zombie is gone too: it runs nothing
    return fields[19].decode()

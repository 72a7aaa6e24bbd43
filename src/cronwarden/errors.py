"""One error tree. Every error builds its message from data, so the CLI can
print ``cronwarden: <message>`` and exit with the error's status, never a
traceback."""

from __future__ import annotations


class CronwardenError(Exception):
    """Base of every error cronwarden raises on purpose."""

    exit_code = 2


class UsageError(CronwardenError):
    """A bad flag, value, config entry or environment variable."""

    exit_code = 2


class UnknownOption(UsageError, TypeError):
    """A keyword a function does not take (a ``TypeError``, as Python's own
    is), named with the nearest one it does take."""


class StoreError(CronwardenError):
    """The store is not usable as configured: a corrupt or unreadable file, a
    database on a network filesystem, a schema newer than this version."""

    exit_code = 2


class StoreUnavailable(StoreError):
    """The store cannot be reached or is locked right now (connection refused,
    timeout, database locked). A guarded start fails closed with exit code 75
    (EX_TEMPFAIL) unless ``--on-store-error=run`` was given."""

    exit_code = 75


class StoreUrlError(UsageError):
    """A store URL with an unknown scheme or a malformed part."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"bad store URL {mask_password(url)!r}: {why}")
        self.url = url


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a newline, the
    ESC of an escape sequence, …) written as its Python escape (``\\n``,
    ``\\x1b``). The one function for values from the store shown as text
    (host names, notes, in ``status``/``history`` tables, stderr lines and
    the dashboard): a newline would break a table, an escape sequence clear
    or rewrite a terminal. Any store may hold such a value: a host name is
    checked when a run is recorded, but not by other writers or older
    versions."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def mask_password(text: str) -> str:
    """``text`` with every password in it shown as ``***``: the one function
    for every URL cronwarden prints (messages, ``config check``/``show``,
    ``status``, the dashboard), since they end up in logs and on screens.
    Masks the password of each URL in ``text`` (``scheme://user:PW@host``)
    and a ``password=`` query parameter (libpq's URLs accept one)."""
    if "@" not in text and "password" not in text.lower():
        return text  # the common case, without importing re
    import re

    text = re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^/?#\s]*@", r"\1***@", text)
    return re.sub(r"(?i)([?&;]password=)[^&#\s]*", r"\1***", text)


class MissingDriver(UsageError):
    """The URL's backend needs an optional dependency that is not installed."""

    def __init__(self, scheme: str, module: str, extra: str) -> None:
        super().__init__(
            f"the {scheme}:// store needs the {module!r} package: pip install 'cronwarden[{extra}]'"
        )


class LeaseLost(CronwardenError):
    """The run no longer owns its lease: renewal failed past the deadline, the
    lease expired and was taken, or the owner id did not match."""

    exit_code = 3

    def __init__(self, key: str, why: str = "the lease is no longer ours") -> None:
        super().__init__(f"lease {key!r} lost: {why}")
        self.key = key
        self.why = why


class LeaseRevoked(LeaseLost):
    """Another run asked this one to stop (policy ``replace``)."""

    def __init__(self, key: str, by_run_id: str) -> None:
        super().__init__(key, f"revoked by run {by_run_id}")
        self.by_run_id = by_run_id


class StopRequested(LeaseRevoked):
    """Someone asked this run to stop through the store (``cronwarden
    stop``): its command gets SIGTERM, SIGKILL after ``grace``, and the run
    records ``stopped``. ``by_run_id`` is the lease's revocation mark
    (``stores.base.stop_mark``)."""

    def __init__(self, key: str, mark: str, grace: float) -> None:
        LeaseLost.__init__(self, key, "stop requested (cronwarden stop)")
        self.by_run_id = mark
        self.grace = grace


class TimedOut(LeaseLost):
    """The run exceeded its ``max_runtime``."""

    def __init__(self, key: str, max_runtime: float) -> None:
        super().__init__(key, f"ran longer than max_runtime {max_runtime:g}s")
        self.max_runtime = max_runtime


class NotStarted(CronwardenError):
    """A guarded start did not run the work (skipped, queued, queue full).
    Raised by ``with warden.guard(...)``; the refusal is already recorded in
    the ledger. (``@warden.job`` returns None instead.)"""

    exit_code = 0

    def __init__(self, job: str, outcome: str, holder_run_id: str | None) -> None:
        super().__init__(f"job {job!r} not started ({outcome}); held by run {holder_run_id}")
        self.job = job
        self.outcome = outcome
        self.holder_run_id = holder_run_id


class Interrupted(CronwardenError):
    """The run's process was told to stop by a signal (SIGTERM from a pod
    shutdown or ``systemctl stop``, SIGINT from Ctrl-C, SIGHUP): the run ends
    ``interrupted``, not ``failed``. ``exit_code`` is the shell's 128+N.

    What is known of the stop goes on the run's end event as ``signal``
    (``fields``): the sender's pid and process name when the kernel said who
    sent it (never for a sender outside this process's pid namespace, as a
    container runtime stopping PID 1 is), the kill grace the command was
    given, how long it took to exit, and whether it had to be SIGKILLed."""

    def __init__(self, signum: int, detail: str = "", *, sender_pid: int | None = None,
                 sender: str | None = None, grace: float | None = None, waited: float | None = None,
                 sigkill: bool | None = None) -> None:  # fmt: skip
        import signal

        self.signum = signum
        self.signal = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.sender_pid = sender_pid
        self.sender = sender
        self.grace = grace
        self.waited = waited
        self.sigkill = sigkill
        by = ""
        if sender_pid is not None:
            by = f" from pid {sender_pid}" + (f" ({sender})" if sender else "")
        super().__init__(f"{self.signal}{by} to the supervisor" + (f"; {detail}" if detail else ""))

    def fields(self) -> dict[str, object]:
        """The stop as the end event's ``signal`` records it: what is not
        known is left out, never guessed."""
        found: dict[str, object] = {"name": self.signal, "sender_pid": self.sender_pid}
        if self.sender:
            found["sender"] = self.sender
        if self.grace is not None:
            found["grace"] = round(self.grace, 3)
        if self.waited is not None:
            found["waited"] = round(self.waited, 3)
        if self.sigkill is not None:
            found["sigkill"] = self.sigkill
        return found


class Fenced(CronwardenError):
    """A write carried a fencing token older than the newest one its resource
    has seen: a newer run of the job has written (or fenced) it since, so this
    run's lease is gone and its write must not land. Raised by the helpers in
    ``cronwarden.fence``; the write did not happen (on the SQL stores the
    statement failed, so the surrounding transaction cannot commit)."""

    exit_code = 3

    def __init__(self, resource: str, token: int, current: int | None) -> None:
        newest = "a newer one" if current is None else str(current)
        super().__init__(
            f"fenced: token {token} is older than {newest}, the newest token resource {resource!r} "
            "has seen; a newer run holds the job, so this write was refused"
        )
        self.resource = resource
        self.token = token
        self.current = current

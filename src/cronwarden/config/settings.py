"""What cronwarden knows about a job, and the one source of its defaults.

``JobSettings`` is a job's resolved settings (from flags, the environment,
the config file and the built-in defaults, by ``cronwarden.config.resolve``);
the guard's ``Options`` take their defaults from the constants here. Light
on purpose: it is on the path of every ``cronwarden run``.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from cronwarden.durations import format_duration
from cronwarden.errors import UsageError
from cronwarden.events import EMPTY
from cronwarden.policy import Policy

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
"""A job or shard name: it becomes part of lease keys, URLs and file names."""


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid name, else a UsageError saying what a name is."""
    if not NAME.fullmatch(value):
        raise UsageError(
            f"{what} must be 1-128 characters of letters, digits, '_', '.', '@' or '-' "
            f"starting with a letter or digit, got {value!r}"
        )
    return value


FILE_NAME = "cronwarden.toml"
ENV_CONFIG = "CRONWARDEN_CONFIG"
ENV_STORE = "CRONWARDEN_STORE"
ENV_SCHEDULER_STORE = "CRONWARDEN_SCHEDULER_STORE"
"""How ``cronwarden scheduler`` gives the runs it starts its store:
``fd:N``, a pipe the run inherits and reads the URL from. Not on their
command line (``ps`` shows arguments to every local user), and not in their
environment either (``/proc/PID/environ`` keeps a process's first
environment for its whole life, and the keeper's too); the variable itself
is taken out of the environment before the run's command gets it."""
ENV_DASHBOARD_TOKEN = "CRONWARDEN_DASHBOARD_TOKEN"
WITHHELD_FROM_COMMAND = (ENV_STORE, ENV_SCHEDULER_STORE, ENV_DASHBOARD_TOKEN)
"""Variables a run's command does not get, since they may hold a password
(``cronwarden run --pass-store`` gives it ``$CRONWARDEN_STORE``)."""

# Built-in defaults: the config's and the guard's ``Options``' (which take them from here).
DEFAULT_TTL = 60.0
DEFAULT_REPLACE_GRACE = 10.0
DEFAULT_MAX_PENDING = 1

DURATION_KEYS = ("ttl", "grace", "max_runtime", "replace_grace", "renew_every")
JOB_KEYS = (
    "schedule",
    "timezone",
    "every",
    "policy",
    "reason",
    *DURATION_KEYS,
    "max_pending",
    "shards",
    "allow_unpartitioned",
    "command",
    "tags",
    "failure_threshold",
    "recovery_threshold",
    "maintenance",
    "detach",
    "jitter",
    "catchup",
    "catchup_window",
)
MONITOR_KEYS = ("failure_threshold", "recovery_threshold", "maintenance")
"""Settings only the monitor reads (``check``, ``monitor``, ``audit``)."""
DEFAULTS_KEYS = (*DURATION_KEYS, "max_pending", "timezone", *MONITOR_KEYS)
"""What ``[defaults]`` may set. Not ``policy``: a policy is chosen per job,
with its own reason, or it is the default (skip)."""
TOP_KEYS = ("store", "retention", "keep_runs", "defaults", "jobs", "sinks")

ENV_KEYS: Mapping[str, str] = {
    "ttl": "CRONWARDEN_TTL",
    "grace": "CRONWARDEN_GRACE",
    "max_runtime": "CRONWARDEN_MAX_RUNTIME",
    "replace_grace": "CRONWARDEN_REPLACE_GRACE",
    "max_pending": "CRONWARDEN_MAX_PENDING",
}
"""The settings the environment may override, for every job. Deliberately
not the policy, the shard or anything else in ``CRONWARDEN_*`` (cronwarden
itself gives children CRONWARDEN_JOB, CRONWARDEN_SHARD, …)."""

# -- problems -----------------------------------------------------------------


class Problem(NamedTuple):
    """One thing wrong, where it is: a file and line, or an environment variable."""

    where: str
    line: int | None
    message: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.message}" if self.line else f"{self.where}: {self.message}"


class ConfigError(UsageError):
    """The config (file or environment) has problems; all of them are listed."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            text = str(self.problems[0])
        else:
            text = f"{len(self.problems)} problems in the configuration:\n" + "\n".join(
                f"  {p}" for p in self.problems
            )
        super().__init__(text)


# -- settings -----------------------------------------------------------------


class JobSettings(NamedTuple):
    """Everything cronwarden knows about how one job is run, resolved."""

    name: str
    schedule: str | None = None
    """Cron expression (with ``timezone``); exclusive with ``every``."""
    timezone: str | None = None
    every: float | None = None
    """Period in seconds."""
    policy: Policy = Policy.SKIP
    reason: str = ""
    """One sentence: why this policy."""
    ttl: float = DEFAULT_TTL
    grace: float | None = None
    """How late a run may be before the monitor calls the slot missed."""
    max_runtime: float | None = None
    max_pending: int = DEFAULT_MAX_PENDING
    replace_grace: float = DEFAULT_REPLACE_GRACE
    renew_every: float | None = None
    """Heartbeat interval (None: a third of the ttl)."""
    shards: tuple[str, ...] = ()
    allow_unpartitioned: bool = False
    command: tuple[str, ...] = ()
    in_file: bool = False
    """True when the config file has a ``[jobs.NAME]`` table for it."""
    sources: Mapping[str, str] = EMPTY
    """Setting -> where its value came from (``PATH:LINE``, ``$ENV``, ``--flag``);
    settings absent here are built-in defaults."""
    tags: tuple[str, ...] = ()
    """Names sinks route by (``tags = [...]`` in a sink's route)."""
    failure_threshold: int = 1
    """``failing`` is raised after this many bad endings in a row ..."""
    recovery_threshold: int = 1
    """... and resolved after this many successes in a row."""
    maintenance: tuple[Any, ...] = ()
    """Recurring windows (``cronwarden.config.windows.Window``) in which the
    job's findings are recorded but not delivered to alerting sinks."""
    detach: bool = False
    """The scheduler fires it as a ``cronwarden run`` child of its own
    session, which outlives a scheduler restart, instead of in its own
    process."""
    jitter: float = 0.0
    """Up to this many seconds after each fire time, the same for every fire
    of the job: a stable offset made from its name (``Scheduler``)."""
    catchup: str = "latest"
    """Slots missed while no scheduler ran (or between two late ticks):
    ``skip`` none, ``latest`` the last one, ``all`` each of them; only those
    within ``catchup_window``."""
    catchup_window: float | None = None
    """How far back catch-up reaches (None: the scheduler's misfire grace)."""

    def schedule_text(self) -> str | None:
        """The schedule as ``Schedule.parse`` reads it back (what the store keeps)."""
        if self.every is not None:
            return f"every {format_duration(self.every)}"
        if self.schedule is None:
            return None
        return f"CRON_TZ={self.timezone} {self.schedule}" if self.timezone else self.schedule


class Config(NamedTuple):
    """A parsed config file plus the environment."""

    path: str | None
    store: str | None = None
    """Store URL: ``$CRONWARDEN_STORE``, else the file's ``store``."""
    store_source: str | None = None
    jobs: tuple[JobSettings, ...] = ()
    defaults: Mapping[str, Any] = EMPTY
    """The file's ``[defaults]`` and the environment, merged, parsed values."""
    default_sources: Mapping[str, str] = EMPTY
    problems: tuple[Problem, ...] = ()
    """Every problem found; ``load`` raises unless they are in other jobs' tables."""
    job_problems: Mapping[str, tuple[Problem, ...]] = EMPTY
    sinks: Mapping[str, Any] = EMPTY
    """The file's raw ``[sinks]`` table (``cronwarden.sinks.load_sinks`` reads it);
    its problems are in ``problems`` and in ``sink_problems``."""
    sink_problems: tuple[Problem, ...] = ()
    retention: float | None = None
    """The file's ``retention``: seconds of the ledger to keep (the store
    URL's ``retention`` wins)."""
    keep_runs: int | None = None
    """The file's ``keep_runs``: finished runs to keep per job (the URL's wins)."""

    def job(self, name: str) -> JobSettings | None:
        for j in self.jobs:
            if j.name == name:
                return j
        return None


def merge(
    name: str,
    own: Mapping[str, Any],
    own_sources: Mapping[str, str],
    defaults: Mapping[str, Any],
    default_sources: Mapping[str, str],
    *,
    in_file: bool,
) -> JobSettings:
    """Built-in < [defaults] < the job's table < environment (the environment
    is already merged into ``defaults`` with its precedence recorded in
    ``default_sources``)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in JOB_KEYS:
        from_env = default_sources.get(key, "").startswith("$")
        if key in own and not from_env:
            values[key], sources[key] = own[key], own_sources[key]
        elif key in defaults:
            values[key], sources[key] = defaults[key], default_sources[key]
    if "timezone" in values and "schedule" not in values:
        # A default time zone means something only to cron schedules.
        del values["timezone"]
        sources.pop("timezone", None)
    return JobSettings(name=name, in_file=in_file, sources=sources, **values)


def positive(key: str, seconds: float, raw: str) -> float:
    if seconds <= 0:
        raise UsageError(f"{key} must be greater than zero, got {raw!r}")
    return seconds

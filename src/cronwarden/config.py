"""The config file (``cronwarden.toml``) and ``CRONWARDEN_*`` environment
variables, resolved to frozen per-job settings.

Where the file is: ``--config PATH``, else ``$CRONWARDEN_CONFIG``, else
``./cronwarden.toml`` if it exists. No file is fine: every setting has a
default.

Precedence, highest first: command-line flags > environment > the job's table
> ``[defaults]`` > built-in defaults. ``resolve`` is the one place that
applies it; ``cronwarden run`` and ``cronwarden config show`` both use it.

Strict: an unknown key, a wrong type, a duration without a unit, a policy
that is not explained are all problems. ``validate`` collects every problem
of a file in one pass (with line numbers: tomllib gives them for syntax
errors; for the rest the file is scanned for the table or key), so one
``cronwarden config check`` shows everything to fix.

This module is on the path of every ``cronwarden run``, so it holds only the
settings, the environment and the precedence. Reading and checking a file
lives in ``config_file`` (with ``tomllib`` and, for cron schedules,
``cronsim``), imported only when there is a file.
"""

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from cronwarden.durations import format_duration, parse_duration
from cronwarden.errors import UsageError
from cronwarden.events import EMPTY
from cronwarden.policy import Policy

FILE_NAME = "cronwarden.toml"
ENV_CONFIG = "CRONWARDEN_CONFIG"
ENV_STORE = "CRONWARDEN_STORE"
ENV_SCHEDULER_STORE = "CRONWARDEN_SCHEDULER_STORE"
"""How ``cronwarden scheduler`` gives the runs it starts its store: not on
their command line (``ps`` shows arguments to every local user), and taken
out of the environment before the run's command gets it."""

# Built-in defaults. They match ``guard.Options`` (ttl 60s, replace grace 10s,
# max_pending 1); tests/test_config.py checks that they stay equal.
DEFAULT_TTL = 60.0
DEFAULT_REPLACE_GRACE = 10.0
DEFAULT_MAX_PENDING = 1

DURATION_KEYS = ("ttl", "grace", "max_runtime", "replace_grace")
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
)
DEFAULTS_KEYS = (*DURATION_KEYS, "max_pending", "timezone")
"""What ``[defaults]`` may set. Not ``policy``: a policy is chosen per job,
with its own reason, or it is the default (skip)."""
TOP_KEYS = ("store", "defaults", "jobs", "sinks")

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
    shards: tuple[str, ...] = ()
    allow_unpartitioned: bool = False
    command: tuple[str, ...] = ()
    in_file: bool = False
    """True when the config file has a ``[jobs.NAME]`` table for it."""
    sources: Mapping[str, str] = EMPTY
    """Setting -> where its value came from (``PATH:LINE``, ``$ENV``, ``--flag``);
    settings absent here are built-in defaults."""

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

    def job(self, name: str) -> JobSettings | None:
        for j in self.jobs:
            if j.name == name:
                return j
        return None


# -- finding and loading ------------------------------------------------------


def find(flag: str | None, environ: Mapping[str, str] | None = None, cwd: str | None = None) -> str | None:
    """The config file to read, or None. A path that was named (flag or
    environment) must exist; ``./cronwarden.toml`` is used only if it does.
    Costs one ``stat`` when nothing is named."""
    env = os.environ if environ is None else environ
    named = flag or env.get(ENV_CONFIG) or None
    if named is not None:
        where = "--config" if flag else f"${ENV_CONFIG}"
        if not os.path.isfile(named):
            raise UsageError(
                f"{where}: no config file at {named!r}; expected a TOML file like cronwarden.toml"
            )
        return named
    local = os.path.join(cwd or os.curdir, FILE_NAME)
    return local if os.path.isfile(local) else None


def load(path: str | None, *, job: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Parse ``path`` (None: no file, environment only). Raises ``ConfigError``
    for any problem, except that with ``job`` given, problems confined to
    *other* jobs' tables are tolerated: one job's typo must not stop every
    other job on the host (``cronwarden config check`` still reports it)."""
    config = read(path, environ=environ)
    problems = list(config.problems)
    if job is not None:
        # A run tolerates other jobs' problems, and sink problems too: the run
        # must not fail over delivery; the flush after it reports them.
        others = {p for name, ps in config.job_problems.items() if name != job for p in ps}
        others.update(config.sink_problems)
        problems = [p for p in problems if p not in others]
    if problems:
        raise ConfigError(problems)
    return config


def validate(path: str, *, environ: Mapping[str, str] | None = None) -> list[Problem]:
    """Every problem of the file at ``path`` and of the environment, in file order."""
    return list(read(path, environ=environ).problems)


def read(path: str | None, *, environ: Mapping[str, str] | None = None) -> Config:
    """Parse without raising: the problems are in the result."""
    env = os.environ if environ is None else environ
    values, sources, problems = _environment(env)
    if path is not None:
        from cronwarden.config_file import read_file

        return read_file(path, values, sources, problems, env)
    store = env.get(ENV_STORE) or None
    return Config(
        path=None, store=store, store_source=f"${ENV_STORE}" if store else None, defaults=values,
        default_sources=sources, problems=tuple(problems),
    )  # fmt: skip


def resolve(
    job: str,
    config: Config | None,
    flags: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> JobSettings:
    """The settings of ``job``: flags (values that are not None, keyed by
    setting name) > environment > the job's table > ``[defaults]`` > built-in.

    ``every`` and ``schedule`` are one setting (when the job fires): a flag
    giving either replaces both of the file's."""
    if config is None:
        config = load(None, environ=environ)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    base = config.job(job) or merge(job, {}, {}, config.defaults, config.default_sources, in_file=False)
    values: dict[str, Any] = {k: getattr(base, k) for k in JOB_KEYS}
    sources = dict(base.sources)
    if "every" in flags or "schedule" in flags:
        for k in ("every", "schedule", "timezone"):
            values[k] = None
            sources.pop(k, None)
    for key, value in flags.items():
        if key not in JOB_KEYS:
            raise ValueError(f"not a job setting: {key}")
        values[key] = tuple(value) if isinstance(value, list) else value
        sources[key] = "--" + key.replace("_", "-")
    return JobSettings(name=job, in_file=base.in_file, sources=sources, **values)


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


def _environment(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str], list[Problem]]:
    """The ``ENV_KEYS`` settings set in ``env``: values, sources, problems."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[Problem] = []
    for key, name in ENV_KEYS.items():
        text = env.get(name)
        if text is None or text == "":
            continue
        where = f"${name}"
        try:
            if key == "max_pending":
                if not text.strip().isdigit() or int(text) < 1:
                    raise UsageError(f"max_pending must be a whole number of at least 1, got {text!r}")
                values[key] = int(text)
            else:
                values[key] = positive(key, parse_duration(text, what=key), text)
        except UsageError as e:
            problems.append(Problem(where, None, str(e)))
            continue
        sources[key] = where
    return values, sources, problems


def positive(key: str, seconds: float, raw: str) -> float:
    if seconds <= 0:
        raise UsageError(f"{key} must be greater than zero, got {raw!r}")
    return seconds

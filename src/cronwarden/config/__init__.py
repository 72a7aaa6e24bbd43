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

This package is on the path of every ``cronwarden run``: ``settings`` holds
the settings and their defaults, this module the environment and the
precedence. Reading and checking a file lives in ``config.file`` (with
``tomllib`` and, for cron schedules, ``cronsim``), imported only when there
is a file.
"""

import os
from collections.abc import Mapping
from typing import Any

from cronwarden.config.settings import (
    DEFAULT_MAX_PENDING,
    DEFAULT_REPLACE_GRACE,
    DEFAULT_TTL,
    DEFAULTS_KEYS,
    DURATION_KEYS,
    ENV_CONFIG,
    ENV_DASHBOARD_TOKEN,
    ENV_KEYS,
    ENV_SCHEDULER_STORE,
    ENV_STORE,
    FILE_NAME,
    JOB_KEYS,
    NAME,
    TOP_KEYS,
    WITHHELD_FROM_COMMAND,
    Config,
    ConfigError,
    JobSettings,
    Problem,
    check_name,
    merge,
    positive,
)
from cronwarden.durations import parse_duration
from cronwarden.errors import UsageError

__all__ = [
    "DEFAULTS_KEYS",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_REPLACE_GRACE",
    "DEFAULT_TTL",
    "DURATION_KEYS",
    "ENV_CONFIG",
    "ENV_DASHBOARD_TOKEN",
    "ENV_KEYS",
    "ENV_SCHEDULER_STORE",
    "ENV_STORE",
    "FILE_NAME",
    "JOB_KEYS",
    "NAME",
    "TOP_KEYS",
    "WITHHELD_FROM_COMMAND",
    "Config",
    "ConfigError",
    "JobSettings",
    "Problem",
    "check_name",
    "find",
    "load",
    "merge",
    "positive",
    "read",
    "resolve",
    "validate",
]

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
        from cronwarden.config.file import read_file

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

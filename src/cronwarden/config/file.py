"""Reading and checking ``cronwarden.toml``: the part of ``cronwarden.config``
that runs only when there is a file. Kept apart so that ``cronwarden run``
without a config file neither imports tomllib nor compiles this module.

Every problem is collected, none raised: ``config check`` lists them all.
tomllib keeps no positions, so the text is scanned for the line of each
table header and key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from cronwarden.config.settings import (
    DEFAULTS_KEYS,
    DURATION_KEYS,
    ENV_STORE,
    JOB_KEYS,
    NAME,
    TOP_KEYS,
    Config,
    JobSettings,
    Problem,
    merge,
    positive,
)
from cronwarden.durations import format_duration, parse_duration, parse_positive_duration
from cronwarden.errors import UsageError
from cronwarden.policy import Policy

CATCHUP = ("skip", "latest", "all")
"""The values of a job's ``catchup`` (see ``JobSettings.catchup``)."""

POLICY_KEYS: Mapping[str, Policy] = {
    "max_pending": Policy.QUEUE,
    "replace_grace": Policy.REPLACE,
    "shards": Policy.ALLOW,
    "allow_unpartitioned": Policy.ALLOW,
}
"""Job keys that mean something only under one policy: set under another,
they are a leftover or a misunderstanding, and reported."""


def read_file(
    path: str,
    env_values: dict[str, Any],
    env_sources: dict[str, str],
    env_problems: list[Problem],
    env: Mapping[str, str],
) -> Config:
    """The file at ``path`` with the environment already read, as a ``Config``
    carrying every problem of both."""
    reader = _Reader(path, env_problems)
    return reader.build(reader.parse_file(), env_values, env_sources, env)


MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A config file larger than this is refused before it is parsed: a few
thousand jobs fit in far less, and a huge file is a mistake (or an attack)."""


class _Reader:
    """Collects problems while turning TOML data into settings."""

    def __init__(self, path: str, problems: list[Problem]) -> None:
        self.path = path
        self.problems: list[Problem] = list(problems)
        self.job_problems: dict[str, list[Problem]] = {}
        self.lines: dict[tuple[str, ...], int] = {}

    # locations

    def line(self, *key: str) -> int | None:
        """The line of the most specific part of ``key`` found in the file:
        the key itself, else its table's header."""
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None

    def problem(self, key: Sequence[str], message: str, *, job: str | None = None) -> None:
        p = Problem(self.path, self.line(*key), message)
        self.problems.append(p)
        if job is not None:
            self.job_problems.setdefault(job, []).append(p)

    def source(self, *key: str) -> str:
        line = self.line(*key)
        return f"{self.path}:{line}" if line else self.path

    # the file

    def parse_file(self) -> dict[str, Any]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            self.problems.append(Problem(self.path, None, f"cannot read the config file: {e.strerror}"))
            return {}
        if len(raw) > MAX_CONFIG_BYTES:
            too_big = f"the config file is over {MAX_CONFIG_BYTES // 1024} KiB; expected cronwarden.toml"
            self.problems.append(Problem(self.path, None, too_big))
            return {}
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.problems.append(Problem(self.path, None, f"the config file is not UTF-8 text: {e.reason}"))
            return {}
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            message, line = _syntax_error(str(e), text)
            self.problems.append(Problem(self.path, line, f"TOML syntax: {message}"))
            return {}
        except RecursionError:  # tomllib recurses once per level of nesting
            self.problems.append(Problem(self.path, None, "arrays or inline tables nested too deeply "
                                         "to read; expected a cronwarden.toml"))  # fmt: skip
            return {}
        self.lines = _key_lines(text)
        return data

    # building

    def build(
        self,
        data: dict[str, Any],
        env_values: dict[str, Any],
        env_sources: dict[str, str],
        env: Mapping[str, str],
    ) -> Config:
        self.unknown_keys(data, TOP_KEYS, (), "at the top level")
        store, store_source = None, None
        if "store" in data:
            store = self.store(data["store"])
            store_source = self.source("store") if store else None
        if env.get(ENV_STORE):
            store, store_source = env[ENV_STORE], f"${ENV_STORE}"
        retention, keep_runs = self.retention(data)

        defaults: dict[str, Any] = {}
        default_sources: dict[str, str] = {}
        raw_defaults = data.get("defaults", {})
        if not isinstance(raw_defaults, dict):
            self.problem(("defaults",), f"defaults must be a table ([defaults]), got {_kind(raw_defaults)}")
        else:
            self.unknown_keys(raw_defaults, DEFAULTS_KEYS, ("defaults",), "in [defaults]")
            for key in DEFAULTS_KEYS:
                if key in raw_defaults:
                    value = self.value(("defaults", key), key, raw_defaults[key], "[defaults]")
                    if value is not None:
                        defaults[key] = value
                        default_sources[key] = self.source("defaults", key)
        defaults.update(env_values)
        default_sources.update(env_sources)

        jobs: list[JobSettings] = []
        raw_jobs = data.get("jobs", {})
        if not isinstance(raw_jobs, dict):
            self.problem(("jobs",), f"jobs must be tables like [jobs.NAME], got {_kind(raw_jobs)}")
            raw_jobs = {}
        for name, table in raw_jobs.items():
            job = self.job(name, table, defaults, default_sources)
            if job is not None:
                jobs.append(job)

        sinks: dict[str, Any] = {}
        sink_problems: list[Problem] = []
        if "sinks" in data:
            from cronwarden.sinks import sink_problems as find_sink_problems

            before = len(self.problems)
            for sp in find_sink_problems(data, env):
                self.problem(sp.key, sp.message)
            sink_problems = self.problems[before:]
            if isinstance(data["sinks"], dict):
                sinks = data["sinks"]

        self.problems.sort(key=lambda p: (p.where != self.path, p.line or 0))
        return Config(
            path=self.path or None,
            store=store,
            store_source=store_source,
            jobs=tuple(jobs),
            defaults=defaults,
            default_sources=default_sources,
            problems=tuple(self.problems),
            job_problems={k: tuple(v) for k, v in self.job_problems.items()},
            sinks=sinks,
            sink_problems=tuple(sink_problems),
            retention=retention,
            keep_runs=keep_runs,
        )

    def retention(self, data: Mapping[str, Any]) -> tuple[float | None, int | None]:
        """The top-level ``retention`` (a duration) and ``keep_runs`` (runs per job)."""
        age, keep = None, None
        if "retention" in data:
            value = data["retention"]
            try:
                if not isinstance(value, str):
                    raise UsageError(f'must be a duration like "90d" (a string), got {_kind(value)}')
                age = parse_positive_duration(value, what="retention")
            except UsageError as e:
                self.problem(("retention",), f"retention: {e}".replace("retention: retention ", "retention "))
        if "keep_runs" in data:
            value = data["keep_runs"]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
                self.problem(("keep_runs",), f"keep_runs must be a whole number of runs per job from 1 to "
                             f"10^9, like 1000, got {value!r}")  # fmt: skip
            else:
                keep = value
        return age, keep

    def unknown_keys(self, table: Mapping[str, Any], valid: Sequence[str], at: tuple[str, ...], where: str,
                     job: str | None = None) -> None:  # fmt: skip
        for key in table:
            if key in valid:
                continue
            import difflib

            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(valid)}"
            self.problem((*at, key), f"unknown key {key!r} {where}{hint}", job=job)

    def store(self, value: Any) -> str | None:
        from cronwarden.stores import SCHEMES

        if not isinstance(value, str) or "://" not in value:
            self.problem(("store",), "store must be a URL string like \"sqlite:///var/lib/cronwarden.db\", "
                         f"\"postgresql://…\" or \"redis://…\", got {value!r}")  # fmt: skip
            return None
        scheme = value.partition("://")[0].lower()
        if scheme not in SCHEMES:
            self.problem(
                ("store",),
                f"store URL scheme must be one of sqlite, postgresql, redis, redis+sentinel, got {scheme!r}",
            )
            return None
        return value

    def value(self, at: tuple[str, ...], key: str, raw: Any, where: str, job: str | None = None) -> Any:
        """One setting, checked and parsed; None (and a problem) if invalid."""
        try:
            return _parse_value(key, raw)
        except UsageError as e:
            self.problem(at, f"{where} {e}", job=job)
            return None

    def job(
        self, name: str, table: Any, defaults: Mapping[str, Any], default_sources: Mapping[str, str]
    ) -> JobSettings | None:
        at = ("jobs", name)
        where = f"[jobs.{name}]" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f"[jobs.{name!r}]"
        if not NAME.fullmatch(name):
            self.problem(at, f"{where} job name must be 1-128 letters, digits, '_', '.', '@' or '-' "
                         "starting with a letter or digit", job=name)  # fmt: skip
        if not isinstance(table, dict):
            self.problem(at, f"{where} must be a table, got {_kind(table)}", job=name)
            return None
        self.unknown_keys(table, JOB_KEYS, at, f"in {where}", job=name)
        own: dict[str, Any] = {}
        own_sources: dict[str, str] = {}
        for key in JOB_KEYS:
            if key in table:
                value = self.value((*at, key), key, table[key], where, job=name)
                if value is not None:
                    own[key] = value
                    own_sources[key] = self.source(*at, key)
        settings = merge(name, own, own_sources, defaults, default_sources, in_file=True)
        # A policy that did not parse is already reported; rules about the
        # policy would judge the default in its place and mislead.
        policy_known = "policy" not in table or "policy" in own
        self.cross_check(name, where, table, settings, policy_known=policy_known)
        return settings

    def cross_check(
        self, name: str, where: str, table: Mapping[str, Any], job: JobSettings, *, policy_known: bool
    ) -> None:
        """Rules about combinations, judged on the job's merged settings."""
        at = ("jobs", name)

        def bad(key: str | None, message: str) -> None:
            self.problem((*at, key) if key else at, f"{where} {message}", job=name)

        if "schedule" in table and "every" in table:
            bad("every", "has both schedule and every; a job fires either on a cron schedule or every N")
        if "timezone" in table and "schedule" not in table:
            bad("timezone", "timezone applies to a cron schedule; give schedule = \"…\" too "
                "(every = \"…\" periods do not depend on a time zone)")  # fmt: skip
        if job.command and job.schedule is None and job.every is None:
            bad("command", "has a command but no schedule or every: the scheduler would never run it")
        if job.jitter and (job.schedule is not None or job.every is not None):
            from cronwarden.schedule import Schedule

            period = Schedule.parse(job.schedule_text() or "").period()
            if job.jitter >= period:
                bad("jitter", f"jitter must be shorter than the job's period ({format_duration(period)}), "
                    f"got {format_duration(job.jitter)}")  # fmt: skip
        if not policy_known:
            return
        for key, policy in POLICY_KEYS.items():
            if key in table and job.policy is not policy:
                bad(key, f"{key} is for policy {policy.value} only (this job's policy is "
                    f"{job.policy.value}); remove it or set policy = \"{policy.value}\"")  # fmt: skip
        if job.policy is not Policy.SKIP and not job.reason:
            bad("policy", f"policy {job.policy.value} needs a reason: one sentence on why, e.g. "
                f"reason = \"{_EXAMPLE_REASONS[job.policy]}\"")  # fmt: skip
        if job.policy is Policy.ALLOW and not job.shards and not job.allow_unpartitioned:
            bad("policy", "policy allow needs a partition: shards = [\"…\", …] (each run takes one "
                "with --shard), or allow_unpartitioned = true if overlapping runs are safe")  # fmt: skip


_EXAMPLE_REASONS: Mapping[Policy, str] = {
    Policy.SKIP: "one run drains everything pending",
    Policy.ALLOW: "each run handles its own shard of accounts",
    Policy.REPLACE: "the cache should reflect the latest inputs; a partial fill is discarded",
    Policy.QUEUE: "every start stands for new work; one worker drains it",
}


def _parse_value(key: str, raw: Any) -> Any:
    """Check and parse one setting; raise UsageError naming the key."""
    if key in DURATION_KEYS:
        if isinstance(raw, bool) or not isinstance(raw, str):
            unit = " (a bare number has no unit)" if isinstance(raw, int | float) else ""
            raise UsageError(f'{key} must be a duration string like "90s" or "10m", got {raw!r}{unit}')
        return positive(key, parse_duration(raw, what=key), raw)
    if key == "every":
        if not isinstance(raw, str):
            raise UsageError(f'every must be a duration string like "10m", got {raw!r}')
        return positive(key, parse_duration(raw, what="every"), raw)
    if key == "schedule":
        if not isinstance(raw, str) or not raw.strip():
            raise UsageError(f'schedule must be a cron expression string like "*/10 * * * *", got {raw!r}')
        from cronwarden.schedule import Schedule

        Schedule.cron_(raw, None)
        return raw.strip()
    if key == "timezone":
        if not isinstance(raw, str):
            raise UsageError(f'timezone must be an IANA name like "Europe/Berlin", got {raw!r}')
        _check_zone(raw)
        return raw
    if key == "policy":
        if not isinstance(raw, str):
            raise UsageError(f"policy must be one of {', '.join(p.value for p in Policy)}, got {raw!r}")
        try:
            return Policy.parse(raw)
        except UsageError as e:
            import difflib

            close = difflib.get_close_matches(raw.strip().lower(), [p.value for p in Policy], n=1)
            raise UsageError(f"{e}; did you mean {close[0]!r}?" if close else str(e)) from None
    if key == "reason":
        if not isinstance(raw, str) or not raw.strip():
            raise UsageError(f"reason must be one sentence saying why this policy, got {raw!r}")
        if "\n" in raw.strip():
            raise UsageError("reason must be one sentence on one line")
        return raw.strip()
    if key == "max_pending":
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise UsageError(f"max_pending must be a whole number of at least 1, got {raw!r}")
        return raw
    if key in ("jitter", "catchup_window"):
        if isinstance(raw, bool) or not isinstance(raw, str):
            raise UsageError(f'{key} must be a duration string like "30s" or "10m", got {raw!r}')
        return positive(key, parse_duration(raw, what=key), raw)
    if key == "catchup":
        if raw not in CATCHUP:
            raise UsageError(f"catchup must be one of {', '.join(CATCHUP)}, got {raw!r}")
        return raw
    if key == "detach":
        if not isinstance(raw, bool):
            raise UsageError(f"detach must be true or false, got {raw!r}")
        return raw
    if key == "allow_unpartitioned":
        if not isinstance(raw, bool):
            raise UsageError(f"allow_unpartitioned must be true or false, got {raw!r}")
        return raw
    if key == "shards":
        if not isinstance(raw, list) or not raw:
            raise UsageError(f'shards must be a non-empty list of names like ["eu", "us"], got {raw!r}')
        for s in raw:
            if not isinstance(s, str) or not NAME.fullmatch(s):
                raise UsageError(f"shards must be names of letters, digits, '_', '.', '@' or '-', got {s!r}")
        dupes = sorted({s for s in raw if raw.count(s) > 1})
        if dupes:
            raise UsageError(f"shards lists {', '.join(map(repr, dupes))} more than once")
        return tuple(raw)
    if key == "tags":
        if not isinstance(raw, list) or not raw:
            raise UsageError(
                f'tags must be a non-empty list of names like ["payments", "nightly"], got {raw!r}'
            )
        for t in raw:
            if not isinstance(t, str) or not NAME.fullmatch(t):
                raise UsageError(f"tags must be names of letters, digits, '_', '.', '@' or '-', got {t!r}")
        return tuple(dict.fromkeys(raw))
    if key in ("failure_threshold", "recovery_threshold"):
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise UsageError(f"{key} must be a whole number of at least 1 (runs in a row), got {raw!r}")
        return raw
    if key == "maintenance":
        from cronwarden.config.windows import EXAMPLE, Window

        if not isinstance(raw, list) or not all(isinstance(w, str) for w in raw):
            raise UsageError(f"maintenance must be a list of windows like [{EXAMPLE}], got {raw!r}")
        return tuple(Window.parse(w) for w in raw)
    if key == "command":
        if not isinstance(raw, list) or not raw or not all(isinstance(a, str) for a in raw) or not raw[0]:
            raise UsageError("command must be a non-empty list of strings like "
                             f"[\"/opt/bin/job\", \"--full\"], got {raw!r}")  # fmt: skip
        if any("\0" in a for a in raw):
            raise UsageError(f"command arguments cannot hold a NUL character (\\u0000), got {raw!r}")
        return tuple(raw)
    raise AssertionError(key)


def _check_zone(name: str) -> None:
    from cronwarden.schedule import Schedule

    Schedule(text="", tz=name, cron="* * * * *")._zone()


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


_SYNTAX_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_SYNTAX_END = re.compile(r"\s*\(at end of document\)$")


def _syntax_error(message: str, text: str) -> tuple[str, int | None]:
    m = _SYNTAX_AT.search(message)
    if m:
        return f"{message[: m.start()]} (column {m.group(2)})", int(m.group(1))
    m = _SYNTAX_END.search(message)
    if m:
        last = max(1, len(text.splitlines()))
        return f"{message[: m.start()]} at the end of the file", last
    return message, None


# -- locating keys in the text ------------------------------------------------

_HEADER = re.compile(r"^\s*\[\[?([^\[\]]+)\]\]?\s*(?:#.*)?$")
_BARE = r"""(?:"[^"]*"|'[^']*'|[A-Za-z0-9_-]+)"""
_KEY = re.compile(rf"^\s*({_BARE}(?:\s*\.\s*{_BARE})*)\s*=")
_PART = re.compile(r""""([^"]*)"|'([^']*)'|([A-Za-z0-9_-]+)""")


def _dotted(text: str) -> tuple[str, ...]:
    return tuple(a or b or c for a, b, c in _PART.findall(text))


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Line of each table header and key, by full dotted path. tomllib keeps
    no positions, so the text is scanned: good enough to point at the line,
    skipping multi-line strings. The first occurrence wins."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    in_string: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if in_string is not None:
            if line.count(in_string) % 2 == 1:
                in_string = None
            continue
        header = _HEADER.match(line)
        if header:
            table = _dotted(header.group(1))
            lines.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key:
            lines.setdefault((*table, *_dotted(key.group(1))), number)
        for quote in ('"""', "'''"):
            if line.count(quote) % 2 == 1:
                in_string = quote
                break
    return lines

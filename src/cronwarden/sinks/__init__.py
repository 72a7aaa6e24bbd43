"""Sinks from the ``[sinks]`` part of ``cronwarden.toml``.

::

    [sinks]
    flush_timeout = "2s"          # how long `cronwarden run` may spend flushing

    [sinks.ops-hook]
    type = "webhook"              # log | webhook | healthchecks | sentry | apprise
    url = "https://ops.example.com/cronwarden"
    secret_env = "CRONWARDEN_WEBHOOK_SECRET"
    jobs = ["reconcile", "billing-*"]    # routing, every sink type (sinks.route)
    kinds = ["failures", "findings"]

Keys of ``[sinks]`` whose value is a table are sinks; ``flush_timeout`` is the
only other key. Strict: an unknown key, a wrong type, a duration without a
unit, a missing secret are problems, all reported at once. Only the modules
of the sink types in use are imported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cronwarden.durations import parse_duration
from cronwarden.errors import UsageError, mask_password

if TYPE_CHECKING:
    from cronwarden.sinks.base import Sink, SinkOptions
    from cronwarden.sinks.route import Route

TYPES = ("log", "webhook", "healthchecks", "sentry", "apprise")
ROUTE_KEYS = ("jobs", "tags", "kinds", "snoozed")
COMMON_KEYS = ("type", *ROUTE_KEYS, "routes", "max_age", "timeout", "backfill", "concurrency")
TYPE_KEYS: Mapping[str, tuple[str, ...]] = {
    "log": ("path",),
    "webhook": ("url", "secret", "secret_env", "headers"),
    "healthchecks": ("ping_urls", "url", "slugs", "create"),
    "sentry": (
        "dsn",
        "dsn_env",
        "environment",
        "monitors",
        "monitor_config",
        "timezone",
        "failure_issue_threshold",
        "recovery_threshold",
    ),
    "apprise": ("url", "url_env"),
}
SETTINGS = ("flush_timeout",)
DEFAULT_FLUSH_TIMEOUT = 2.0
"""Seconds ``cronwarden run`` may spend delivering after its run ended."""
MAX_CONCURRENCY = 32
LOGGING = frozenset({"log"})
"""Sink types that keep a record rather than alert: their default route takes
snoozed findings too."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_JOB = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}")
_GLOB = re.compile(r"[A-Za-z0-9_.@*?\[\]!-]{1,128}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SLUG = re.compile(r"[a-z0-9_-]{1,100}")


@dataclass(frozen=True)
class SinkProblem:
    """One thing wrong, at a key path like ``("sinks", "ops-hook", "url")``."""

    key: tuple[str, ...]
    message: str


class SinkConfigError(UsageError):
    def __init__(self, problems: Sequence[SinkProblem]) -> None:
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            text = self.problems[0].message
        else:
            text = f"{len(self.problems)} problems in [sinks]:\n" + "\n".join(
                f"  {p.message}" for p in self.problems
            )
        super().__init__(text)


def load_sinks(doc: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list[Sink]:
    """The sinks configured in a parsed ``cronwarden.toml`` (the whole
    document; only its ``sinks`` table is read). Raises ``SinkConfigError``
    listing every problem."""
    sinks, problems = _Reader(os.environ if environ is None else environ, deep=True).read(doc)
    if problems:
        raise SinkConfigError(problems)
    return sinks


def sink_problems(doc: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list[SinkProblem]:
    """Every problem of the ``[sinks]`` part, for a config checker that
    reports all problems of a file with their lines. Cheap enough for the
    start of every ``cronwarden run``: an Apprise URL's shape is checked here,
    whether Apprise can use it when the sinks are loaded (``load_sinks``)."""
    return _Reader(os.environ if environ is None else environ).read(doc)[1]


def flush_timeout(doc: Mapping[str, Any]) -> float:
    """``[sinks] flush_timeout``, or the default when absent or invalid
    (``load_sinks`` reports an invalid one)."""
    table = doc.get("sinks")
    raw = table.get("flush_timeout") if isinstance(table, Mapping) else None
    if isinstance(raw, str):
        try:
            value = parse_duration(raw, what="flush_timeout")
        except UsageError:
            return DEFAULT_FLUSH_TIMEOUT
        if value > 0:
            return value
    return DEFAULT_FLUSH_TIMEOUT


def has_sinks(doc: Mapping[str, Any]) -> bool:
    """True when the document configures at least one sink. Cheap: imports
    nothing, so ``cronwarden run`` can ask before importing the outbox."""
    table = doc.get("sinks")
    return isinstance(table, Mapping) and any(isinstance(v, Mapping) for v in table.values())


class _Reader:
    def __init__(self, environ: Mapping[str, str], *, deep: bool = False) -> None:
        self.environ = environ
        self.deep = deep
        self.problems: list[SinkProblem] = []
        self.job_tags: dict[str, frozenset[str]] = {}

    def problem(self, key: tuple[str, ...], message: str) -> None:
        self.problems.append(SinkProblem(key, message))

    def read(self, doc: Mapping[str, Any]) -> tuple[list[Sink], list[SinkProblem]]:
        self.job_tags = job_tags(doc)
        table = doc.get("sinks", {})
        if not isinstance(table, Mapping):
            self.problem(("sinks",), f"sinks must be tables like [sinks.NAME], got {_kind(table)}")
            return [], self.problems
        sinks: list[Sink] = []
        for name, value in table.items():
            if isinstance(value, Mapping):
                sink = self.sink(name, value)
                if sink is not None:
                    sinks.append(sink)
            elif name == "flush_timeout":
                self.duration(("sinks", name), "[sinks] flush_timeout", value)
            else:
                self.unknown(("sinks",), name, SETTINGS, "in [sinks] (a sink is a table, [sinks.NAME])")
        return sinks, self.problems

    # values

    def unknown(self, at: tuple[str, ...], key: str, valid: Sequence[str], where: str) -> None:
        import difflib

        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f"; expected one of {', '.join(valid)}"
        self.problem((*at, key), f"unknown key {key!r} {where}{hint}")

    def duration(self, at: tuple[str, ...], what: str, raw: Any) -> float | None:
        if not isinstance(raw, str):
            self.problem(at, f'{what} must be a duration string like "5s" or "10m", got {raw!r}')
            return None
        try:
            value = parse_duration(raw, what=what)
        except UsageError as e:
            self.problem(at, str(e))
            return None
        return value

    def text(self, at: tuple[str, ...], what: str, raw: Any) -> str | None:
        if not isinstance(raw, str) or not raw.strip():
            self.problem(at, f"{what} must be a non-empty string, got {raw!r}")
            return None
        return raw

    def url(self, at: tuple[str, ...], what: str, raw: Any) -> str | None:
        text = self.text(at, what, raw)
        if text is None:
            return None
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(text)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 (raises ValueError on a bad port)
        except ValueError:
            ok = False
        if not ok or any(c.isspace() or not c.isprintable() for c in text):
            self.problem(at, f"{what} must be an http:// or https:// URL (no spaces or control characters), "
                         f"got {mask_password(text)!r}")  # fmt: skip
            return None
        if parts.username is not None or parts.password is not None:
            # http.client sends no credentials from a URL: every request
            # would be refused by a receiver that needs them, for ever.
            shown = mask_password(text)
            self.problem(at, f"{what} must not hold a user or password (user:password@host): they are "
                         f"not sent; give them in headers (Authorization), got {shown!r}")  # fmt: skip
            return None
        return text

    def string_table(self, at: tuple[str, ...], what: str, raw: Any) -> dict[str, str] | None:
        if not isinstance(raw, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in raw.items()
        ):
            self.problem(at, f'{what} must be a table of strings, like {{ reconcile = "…" }}, got {raw!r}')
            return None
        return dict(raw)

    def secret(self, at: tuple[str, ...], where: str, table: Mapping[str, Any], key: str) -> str | None:
        """``key`` or ``key_env`` (the name of an environment variable), exactly one."""
        env_key = f"{key}_env"
        if key in table and env_key in table:
            self.problem((*at, env_key), f"{where} has both {key} and {env_key}; give one")
            return None
        if key in table:
            return self.text((*at, key), f"{where} {key}", table[key])
        if env_key not in table:
            self.problem(at, f"{where} needs {key} = \"…\" or {env_key} = \"VARIABLE\" "
                         "(an environment variable holding it)")  # fmt: skip
            return None
        name = table[env_key]
        if not isinstance(name, str) or not _ENV.fullmatch(name):
            self.problem((*at, env_key), f"{where} {env_key} must name an environment variable, got {name!r}")
            return None
        value = self.environ.get(name, "")
        if not value:
            self.problem((*at, env_key), f"{where} {env_key}: ${name} is not set or empty")
            return None
        return value

    # one sink

    def sink(self, name: str, table: Mapping[str, Any]) -> Sink | None:
        at = ("sinks", name)
        where = f"[sinks.{name}]" if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f"[sinks.{name!r}]"
        before = len(self.problems)
        if not _NAME.fullmatch(name):
            self.problem(at, f"{where} sink name must be 1-64 letters, digits, '_', '.', '@' or '-' "
                         "starting with a letter or digit")  # fmt: skip
        kind = table.get("type")
        if kind not in TYPES:
            got = "nothing" if kind is None else repr(kind)
            self.problem((*at, "type"), f"{where} type must be one of {', '.join(TYPES)}, got {got}")
            return None
        valid = (*COMMON_KEYS, *TYPE_KEYS[kind])
        for key in table:
            if key not in valid:
                self.unknown(at, key, valid, f"in {where} (type {kind})")
        options = self.options(at, where, kind, table)
        build: Callable[[tuple[str, ...], str, str, Mapping[str, Any], SinkOptions], Sink | None]
        build = getattr(self, f"build_{kind}")
        sink = build(at, where, name, table, options)
        return sink if len(self.problems) == before else None

    def options(self, at: tuple[str, ...], where: str, kind: str, table: Mapping[str, Any]) -> SinkOptions:
        """The common options; problems are recorded and defaults stand in,
        so the type's own keys are still checked."""
        from cronwarden.sinks.base import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT, SinkOptions

        values: dict[str, float | None] = {}
        for key in ("max_age", "timeout", "backfill"):
            if key in table:
                values[key] = self.duration((*at, key), f"{where} {key}", table[key])
        timeout = values.get("timeout") or DEFAULT_TIMEOUT
        if "timeout" in values and values["timeout"] is not None and not 0 < values["timeout"] <= 60:
            self.problem((*at, "timeout"), f"{where} timeout must be more than 0s and at most 60s")
        if values.get("max_age") is not None and values["max_age"] == 0:
            self.problem((*at, "max_age"), f"{where} max_age must be greater than zero (omit it to keep all)")
        backfill = values.get("backfill")
        concurrency = 1 if kind in ("log", "apprise") else DEFAULT_CONCURRENCY
        if "concurrency" in table:
            raw = table["concurrency"]
            if kind == "log":
                self.problem((*at, "concurrency"), f"{where} concurrency: a log sink writes one batch at a "
                             "time, in ledger order; remove it")  # fmt: skip
            elif isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_CONCURRENCY:
                self.problem((*at, "concurrency"), f"{where} concurrency must be a whole number from 1 to "
                             f"{MAX_CONCURRENCY} (requests in flight at once), got {raw!r}")  # fmt: skip
            else:
                concurrency = raw
        jobs, routes = self.routes(at, where, kind, table)
        return SinkOptions(
            jobs=jobs,
            max_age=values.get("max_age"),
            timeout=timeout,
            backfill=3600.0 if backfill is None else backfill,
            concurrency=concurrency,
            routes=routes,
            job_tags=self.job_tags,
        )

    def routes(
        self, at: tuple[str, ...], where: str, kind: str, table: Mapping[str, Any]
    ) -> tuple[frozenset[str] | None, tuple[Route, ...]]:
        """The sink-level ``jobs`` and the sink's routes: its ``routes``
        tables, or the one its own routing keys make."""
        inline = [k for k in ROUTE_KEYS if k in table]
        if "routes" not in table:
            route = self.route(at, where, kind, table)
            return (None if route.jobs is None else frozenset(route.jobs)), (route,)
        if inline:
            self.problem((*at, inline[0]), f"{where} has routes, so {inline[0]} belongs in each "
                         f"[[sinks.{at[1]}.routes]] table")  # fmt: skip
        raw = table["routes"]
        if not isinstance(raw, list) or not raw or not all(isinstance(r, Mapping) for r in raw):
            self.problem((*at, "routes"), f"{where} routes must be [[sinks.{at[1]}.routes]] tables, "
                         f"got {raw!r}")  # fmt: skip
            return None, ()
        out = []
        for n, sub in enumerate(raw, 1):
            for key in sub:
                if key not in ROUTE_KEYS:
                    self.unknown((*at, "routes"), key, ROUTE_KEYS, f"in {where} route {n}")
            out.append(self.route((*at, "routes"), f"{where} route {n}", kind, sub))
        return None, tuple(out)

    def route(self, at: tuple[str, ...], where: str, kind: str, table: Mapping[str, Any]) -> Route:
        from cronwarden.sinks.route import GROUPS, Route, kinds_named

        jobs = tags = None
        if "jobs" in table:
            raw = self.names((*at, "jobs"), f"{where} jobs", "job names or globs like \"billing-*\"",
                             table["jobs"])  # fmt: skip
            bad = [j for j in raw if not (_JOB.fullmatch(j) or (_GLOB.fullmatch(j) and set("*?[") & set(j)))]
            if bad:
                self.problem((*at, "jobs"), f"{where} jobs: {bad[0]!r} is not a job name or glob")
            jobs = tuple(raw) if raw else None
        if "tags" in table:
            raw = self.names((*at, "tags"), f"{where} tags", "tag names", table["tags"])
            bad = [t for t in raw if not _JOB.fullmatch(t)]
            if bad:
                self.problem((*at, "tags"), f"{where} tags: {bad[0]!r} is not a tag name")
            tags = frozenset(raw) if raw else None
        kinds = GROUPS["alerts"] if kind == "apprise" else None
        if "kinds" in table:
            raw = self.names((*at, "kinds"), f"{where} kinds", "event kinds or groups like \"failures\"",
                             table["kinds"])  # fmt: skip
            try:
                kinds = kinds_named(raw) if raw else kinds
            except ValueError as e:
                import difflib

                valid = [*GROUPS, *sorted(k.value for k in GROUPS["all"])]
                close = difflib.get_close_matches(str(e), valid, n=1, cutoff=0.6)
                groups = ", ".join(GROUPS)
                hint = f"; did you mean {close[0]!r}?" if close else f"; expected a kind or a group: {groups}"
                self.problem((*at, "kinds"), f"{where} kinds: unknown kind {str(e)!r}{hint}")
        snoozed = kind in LOGGING
        if "snoozed" in table:
            snoozed = self.boolean((*at, "snoozed"), f"{where} snoozed", table["snoozed"])
        return Route(jobs=jobs, tags=tags, kinds=kinds, snoozed=snoozed)

    def names(self, at: tuple[str, ...], what: str, of: str, raw: Any) -> list[str]:
        if not isinstance(raw, list) or not raw or not all(isinstance(j, str) for j in raw):
            self.problem(at, f"{what} must be a non-empty list of {of}, got {raw!r}")
            return []
        return list(raw)

    def boolean(self, at: tuple[str, ...], what: str, raw: Any) -> bool:
        if not isinstance(raw, bool):
            self.problem(at, f"{what} must be true or false, got {raw!r}")
            return False
        return raw

    def count(self, at: tuple[str, ...], what: str, raw: Any) -> int | None:
        if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 720:
            self.problem(at, f"{what} must be a whole number from 1 to 720, got {raw!r}")
            return None
        return raw

    def build_log(
        self, at: tuple[str, ...], where: str, name: str, table: Mapping[str, Any], options: SinkOptions
    ) -> Sink | None:
        from cronwarden.sinks.log import LogSink

        path = None
        if "path" in table:
            path = self.text((*at, "path"), f"{where} path", table["path"])
            if path == "-":
                path = None
        return LogSink(name, options, path)

    def build_webhook(
        self, at: tuple[str, ...], where: str, name: str, table: Mapping[str, Any], options: SinkOptions
    ) -> Sink | None:
        if "url" not in table:
            self.problem(at, f'{where} needs url = "https://…" (where to POST events)')
        url = self.url((*at, "url"), f"{where} url", table["url"]) if "url" in table else None
        secret = self.secret(at, where, table, "secret")
        headers = None
        if "headers" in table:
            headers = self.string_table((*at, "headers"), f"{where} headers", table["headers"])
        if url is None or secret is None:
            return None
        from cronwarden.sinks.webhook import WebhookSink

        return WebhookSink(name, options, url=url, secret=secret.encode(), headers=headers)

    def build_healthchecks(
        self, at: tuple[str, ...], where: str, name: str, table: Mapping[str, Any], options: SinkOptions
    ) -> Sink | None:
        ping_urls: dict[str, str] = {}
        if "ping_urls" in table:
            urls = self.string_table((*at, "ping_urls"), f"{where} ping_urls", table["ping_urls"]) or {}
            for job, url in urls.items():
                checked = self.url((*at, "ping_urls", job), f"{where} ping_urls.{job}", url)
                if checked is not None:
                    ping_urls[job] = checked
        template = None
        if "url" in table:
            template = self.url((*at, "url"), f"{where} url", table["url"])
            if template is not None and "{job}" not in template:
                example = '"https://hc-ping.com/PING_KEY/{job}"'
                self.problem((*at, "url"), f"{where} url must contain {{job}} (it is the template for "
                             f"jobs not in ping_urls, by slug), e.g. {example}")  # fmt: skip
        if "ping_urls" not in table and "url" not in table:
            self.problem(at, f"{where} needs ping_urls = {{ JOB = \"https://hc-ping.com/UUID\" }} or "
                         "url = \"https://hc-ping.com/PING_KEY/{job}\"")  # fmt: skip
        slugs: dict[str, str] = {}
        if "slugs" in table:
            slugs = self.string_table((*at, "slugs"), f"{where} slugs", table["slugs"]) or {}
            for job, slug in slugs.items():
                if not _SLUG.fullmatch(slug):
                    self.problem((*at, "slugs", job), f"{where} slugs.{job}: {slug!r} is not a Healthchecks "
                                 "slug (1-100 of a-z, 0-9, '-', '_')")  # fmt: skip
            taken: dict[str, str] = {}
            for job, slug in slugs.items():
                if slug in taken:
                    self.problem((*at, "slugs", job), f"{where} slugs: {taken[slug]} and {job} both ping "
                                 f"slug {slug!r}; each job needs a check of its own")  # fmt: skip
                taken.setdefault(slug, job)
            if "url" not in table:
                self.problem((*at, "slugs"), f"{where} slugs need url = "
                             "\"https://hc-ping.com/PING_KEY/{job}\" (a slug stands for {job})")  # fmt: skip
        create = False
        if "create" in table:
            create = self.boolean((*at, "create"), f"{where} create", table["create"])
            if create and "url" not in table:
                self.problem((*at, "create"), f"{where} create applies to slug URLs: give url = "
                             "\"https://hc-ping.com/PING_KEY/{job}\"")  # fmt: skip
        from cronwarden.sinks.healthchecks import HealthchecksSink

        return HealthchecksSink(name, options, ping_urls=ping_urls, url_template=template, slugs=slugs,
                                create=create)  # fmt: skip

    def build_sentry(
        self, at: tuple[str, ...], where: str, name: str, table: Mapping[str, Any], options: SinkOptions
    ) -> Sink | None:
        dsn = self.secret(at, where, table, "dsn")
        environment = timezone = None
        if "environment" in table:
            environment = self.text((*at, "environment"), f"{where} environment", table["environment"])
        if "timezone" in table:
            timezone = self.text((*at, "timezone"), f"{where} timezone", table["timezone"])
            if timezone is not None:
                try:
                    from zoneinfo import ZoneInfo

                    ZoneInfo(timezone)
                except Exception:
                    self.problem((*at, "timezone"), f"{where} timezone must be an IANA name like "
                                 f"Europe/Berlin, got {timezone!r}")  # fmt: skip
        monitors = None
        if "monitors" in table:
            monitors = self.string_table((*at, "monitors"), f"{where} monitors", table["monitors"])
        upsert = False
        if "monitor_config" in table:
            upsert = self.boolean((*at, "monitor_config"), f"{where} monitor_config", table["monitor_config"])
        thresholds: dict[str, int | None] = {}
        for key in ("failure_issue_threshold", "recovery_threshold"):
            if key in table:
                thresholds[key] = self.count((*at, key), f"{where} {key}", table[key])
                if not upsert:
                    self.problem((*at, key), f"{where} {key} is part of the monitor configuration: "
                                 "give monitor_config = true too")  # fmt: skip
        if "timezone" in table and not upsert:
            self.problem((*at, "timezone"), f"{where} timezone is part of the monitor configuration: "
                         "give monitor_config = true too")  # fmt: skip
        if dsn is None:
            return None
        from cronwarden.sinks.sentry import SentrySink

        try:
            return SentrySink(name, options, dsn=dsn, environment=environment, monitors=monitors,
                              monitor_config=upsert, timezone=timezone, **thresholds)  # fmt: skip
        except UsageError as e:
            self.problem((*at, "dsn"), f"{where} {e}")
            return None

    def build_apprise(
        self, at: tuple[str, ...], where: str, name: str, table: Mapping[str, Any], options: SinkOptions
    ) -> Sink | None:
        url = self.secret(at, where, table, "url")
        if url is None:
            return None
        from cronwarden.sinks.notify import AppriseSink

        try:
            return AppriseSink(name, options, url=url, check=self.deep)
        except UsageError as e:
            self.problem((*at, "url_env" if "url_env" in table else "url"), f"{where} {e}")
            return None


def job_tags(doc: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """Each ``[jobs.NAME]``'s ``tags``, for routes by tag (the config file's
    checker reports a malformed list; here it is only skipped)."""
    jobs = doc.get("jobs")
    out: dict[str, frozenset[str]] = {}
    if isinstance(jobs, Mapping):
        for name, table in jobs.items():
            tags = table.get("tags") if isinstance(table, Mapping) else None
            if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
                out[name] = frozenset(tags)
    return out


def _kind(value: Any) -> str:
    return {str: "a string", int: "a number", float: "a number", bool: "true/false", list: "a list"}.get(
        type(value), type(value).__name__
    )

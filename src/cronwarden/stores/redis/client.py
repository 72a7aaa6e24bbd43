"""The store's Redis clients, made in one place: the URL's settings, the
client every call goes through, and the short-timeout clients ``renew`` uses.

Every client retries a command once more on a *connection* error (a
connection that broke under the call, a server that is not back yet), on a
fresh connection, and never on a timeout (a slow server may still execute
the first try; the caller's time stays bounded). That is safe because every
script is safe to send twice (``RedisStore`` says why for each). Idle
connections are checked by redis-py: the pool replaces one that was closed
while idle when it hands it out, and ``health_check_interval`` sends a
``PING`` first on one idle longer than that, so a connection that died
silently fails on the ``PING``, which is retried, not on a script.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from cronwarden.durations import parse_duration
from cronwarden.errors import StoreUrlError, UsageError
from cronwarden.stores.base import KEEP_ALL, Retention, retention_of

if TYPE_CHECKING:
    import redis

DEFAULT_PREFIX = "cronwarden:"
DEFAULT_RUNS_PER_JOB = 1000
DEFAULT_EVENTS_PER_JOB = 10_000
DEFAULT_TIMEOUT = 3.0
"""Socket and connect timeout: long enough for a loaded server, short enough
that no call hangs and the heartbeat thread gets control back."""
HEALTH_CHECK_INTERVAL = 30
"""Seconds a connection may sit idle before its next use is preceded by a ``PING``."""
RETRIES = 2
"""Tries after the first on a connection error (after a random wait of up
to 100 ms, then up to 200 ms): enough for a connection killed under a call
and a server restarting, few enough to answer a server that is down soon."""

_SSL_CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True)
class Settings:
    """What a ``redis://`` URL says."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(repr=False)
    prefix: str
    runs_per_job: int
    events_per_job: int
    socket_timeout: float
    connect_timeout: float
    tls: dict[str, Any] = field(default_factory=dict)
    retention: Retention = KEEP_ALL

    @classmethod
    def parse(cls, url: str) -> Settings:
        """``redis://[[user]:password@]host[:port][/db][?params]``, or
        ``rediss://`` for TLS. Params: ``prefix``, ``runs_per_job``,
        ``events_per_job``, ``retention``, ``keep_runs``, ``socket_timeout``, ``connect_timeout``
        (durations such as ``3s``), and for TLS ``ssl_ca_certs`` and
        ``ssl_cert_reqs`` (none, optional, required). Raises
        ``StoreUrlError`` naming what is wrong."""
        try:
            parts = urlsplit(url)
            port = parts.port or 6379
        except ValueError as e:
            raise StoreUrlError(url, str(e)) from None
        scheme = parts.scheme.lower()
        if scheme not in ("redis", "rediss"):
            raise StoreUrlError(url, "expected redis:// or rediss://")
        db_text = parts.path.strip("/") or "0"
        if not db_text.isdigit():
            raise StoreUrlError(url, f"the database must be a number like /0, got {parts.path!r}")
        params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        prefix = params.pop("prefix", DEFAULT_PREFIX)
        if not prefix.isprintable():
            raise StoreUrlError(url, "prefix may not contain control characters")
        if not prefix.strip():
            raise StoreUrlError(url, "prefix must not be empty: the store's keys would be bare names like "
                                "'runs' in a shared database; give e.g. prefix=cronwarden:")  # fmt: skip
        if len(prefix) > 256:
            raise StoreUrlError(url, f"prefix must be at most 256 characters, got {len(prefix)}")
        runs = _positive_int(url, params.pop("runs_per_job", None), "runs_per_job", DEFAULT_RUNS_PER_JOB)
        events = _positive_int(
            url, params.pop("events_per_job", None), "events_per_job", DEFAULT_EVENTS_PER_JOB
        )
        socket_timeout = _timeout(url, params.pop("socket_timeout", None), "socket_timeout")
        connect_timeout = _timeout(url, params.pop("connect_timeout", None), "connect_timeout")
        retention = retention_of(url, params)
        tls: dict[str, Any] = {}
        if scheme == "rediss":
            tls["ssl"] = True
            if "ssl_ca_certs" in params:
                tls["ssl_ca_certs"] = params.pop("ssl_ca_certs")
            if "ssl_cert_reqs" in params:
                reqs = params.pop("ssl_cert_reqs").lower()
                if reqs not in _SSL_CERT_REQS:
                    raise StoreUrlError(url, f"ssl_cert_reqs must be one of {', '.join(_SSL_CERT_REQS)}")
                tls["ssl_cert_reqs"] = reqs
        if params:
            raise StoreUrlError(url, f"unknown parameter(s) {', '.join(sorted(params))}")
        return cls(
            host=parts.hostname or "localhost",
            port=port,
            db=int(db_text),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            prefix=prefix,
            runs_per_job=runs,
            events_per_job=events,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            retention=retention,
        )

    def client(self) -> redis.Redis:
        """The client every call of the store goes through."""
        import redis

        return redis.Redis(
            host=self.host,
            port=self.port,
            db=self.db,
            username=self.username,
            password=self.password,
            socket_timeout=self.socket_timeout,
            socket_connect_timeout=self.connect_timeout,
            retry=retry(RETRIES),
            health_check_interval=HEALTH_CHECK_INTERVAL,
            decode_responses=True,
            client_name="cronwarden",
            **self.tls,
        )


def retry(retries: int) -> Any:
    """redis-py's ``Retry`` on connection errors only (see the module docstring)."""
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    return Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), retries, (RedisConnectionError,))


def own_client(client: redis.Redis) -> redis.Redis:
    """A client like ``client`` (its server, credentials, timeouts, TLS) on a
    pool of the store's own, with the store's retry. A caller's client keeps
    its own settings, and redis-py's default retries timeouts too (ten times,
    with backoff): that would send a script again seconds after a server that
    was only slow ran it, and hold the caller for a minute."""
    import redis

    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "retry": retry(RETRIES)}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def renewer(client: redis.Redis, timeout: float) -> redis.Redis:
    """A client like ``client`` on a pool of its own, whose calls give up
    after ``timeout`` (connecting too), with one immediate retry on a broken
    connection and no ``PING`` before a call: a renew is its own health check,
    and its time must stay within ``timeout`` (twice that on a connection
    broken mid-call)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    connect = kwargs.get("socket_connect_timeout")
    kwargs.update(
        socket_timeout=timeout,
        socket_connect_timeout=timeout if connect is None else min(connect, timeout),
        retry=Retry(NoBackoff(), 1, (RedisConnectionError,)),
        health_check_interval=0,
    )
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def _positive_int(url: str, text: str | None, name: str, default: int) -> int:
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise StoreUrlError(url, f"{name} must be a whole number of at least 1, got {text!r}")
    return int(text)


def _timeout(url: str, text: str | None, name: str) -> float:
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = parse_duration(text, what=name)
    except UsageError as e:
        raise StoreUrlError(url, str(e)) from None
    if seconds <= 0:
        raise StoreUrlError(url, f"{name} must be greater than zero, got {text!r}")
    return seconds

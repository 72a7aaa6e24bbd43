"""The store's Redis clients, made in one place: the URL's settings, the
client every call goes through, and the short-timeout clients ``renew`` uses.

A ``redis+sentinel://`` URL gives a client from redis-py's
``redis.sentinel.Sentinel.master_for``: its pool asks the sentinels for the
current master when it opens a connection, and drops its connections when a
failover has moved the master (a connection that finds itself on a demoted
master fails as a connection error, which is retried on a fresh one).

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
SENTINEL_PORT = 26379
SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_WAIT_TIMEOUT = 1.0
"""How long a grant waits for ``wait_replicas`` replicas by default."""


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
    sentinels: tuple[tuple[str, int], ...] = ()
    """``redis+sentinel://`` only: the sentinels to ask, and the master's name."""
    service: str = ""
    wait_replicas: int = 0
    """Replicas that must acknowledge a grant before ``acquire`` returns it (``WAIT``); 0: none."""
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT

    @classmethod
    def parse(cls, url: str) -> Settings:
        """``redis://[[user]:password@]host[:port][/db][?params]``,
        ``rediss://`` for TLS, or ``redis+sentinel://`` (``_parse_sentinel``).
        Params: ``prefix``, ``runs_per_job``, ``events_per_job``,
        ``retention``, ``keep_runs``, ``socket_timeout``, ``connect_timeout``
        (durations such as ``3s``), ``wait_replicas`` and ``wait_timeout``,
        and for TLS ``ssl_ca_certs`` and ``ssl_cert_reqs`` (none, optional,
        required). Raises ``StoreUrlError`` naming what is wrong."""
        scheme = url.partition("://")[0].lower()
        if scheme == SENTINEL_SCHEME:
            return cls._parse_sentinel(url)
        try:
            parts = urlsplit(url)
            port = parts.port or 6379
        except ValueError as e:
            raise StoreUrlError(url, str(e)) from None
        if scheme not in ("redis", "rediss"):
            raise StoreUrlError(url, "expected redis://, rediss:// or redis+sentinel://")
        db_text = parts.path.strip("/") or "0"
        if not db_text.isdigit():
            raise StoreUrlError(url, f"the database must be a number like /0, got {parts.path!r}")
        params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        return cls._with_params(
            url,
            params,
            host=parts.hostname or "localhost",
            port=port,
            db=int(db_text),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            tls=scheme == "rediss",
        )

    @classmethod
    def _parse_sentinel(cls, url: str) -> Settings:
        """``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/master[?params]``:
        the sentinels (port 26379 unless given) and the name they know the
        master by. The credentials are the master's (and its replicas');
        the sentinels are asked without. Params as for ``redis://``, plus
        ``db`` (default 0)."""
        rest = url.partition("://")[2]
        netloc, slash, tail = rest.partition("/")
        path, _, query = tail.partition("?")
        if "?" in netloc:
            netloc, _, query = netloc.partition("?")
            slash = ""
        userinfo, at, hosts = netloc.rpartition("@")
        username = password = None
        if at:
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) if user else None
            password = unquote(secret) if colon else None
        sentinels = []
        for item in hosts.split(","):
            host, port = _host_port(url, item.strip())
            sentinels.append((host, port))
        service = unquote(path.strip("/")) if slash else ""
        if not service:
            raise StoreUrlError(url, "name the master the sentinels monitor, as in "
                                "redis+sentinel://host:26379,host2:26379/mymaster")  # fmt: skip
        if "/" in service or not service.isprintable():
            raise StoreUrlError(url, f"the master name must be one name like /mymaster, got {path!r}")
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        db_text = params.pop("db", "0")
        if not db_text.isdigit():
            raise StoreUrlError(url, f"db must be a database number like 0, got {db_text!r}")
        return cls._with_params(
            url,
            params,
            host=sentinels[0][0],
            port=sentinels[0][1],
            db=int(db_text),
            username=username,
            password=password,
            tls=False,
            sentinels=tuple(sentinels),
            service=service,
        )

    @classmethod
    def _with_params(cls, url: str, params: dict[str, str], *, tls: bool, **where: Any) -> Settings:
        """The settings of ``where`` (the server or sentinels) with the URL's
        parameters read; any left over is an error."""
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
        wait_replicas = _count(url, params.pop("wait_replicas", None), "wait_replicas")
        wait_timeout = DEFAULT_WAIT_TIMEOUT
        if "wait_timeout" in params:
            wait_timeout = _timeout(url, params.pop("wait_timeout"), "wait_timeout")
        ssl: dict[str, Any] = {}
        if tls:
            ssl["ssl"] = True
            if "ssl_ca_certs" in params:
                ssl["ssl_ca_certs"] = params.pop("ssl_ca_certs")
            if "ssl_cert_reqs" in params:
                reqs = params.pop("ssl_cert_reqs").lower()
                if reqs not in _SSL_CERT_REQS:
                    raise StoreUrlError(url, f"ssl_cert_reqs must be one of {', '.join(_SSL_CERT_REQS)}")
                ssl["ssl_cert_reqs"] = reqs
        if params:
            raise StoreUrlError(url, f"unknown parameter(s) {', '.join(sorted(params))}")
        if wait_replicas and wait_timeout >= socket_timeout:
            raise StoreUrlError(url, f"wait_timeout ({wait_timeout:g}s) must be shorter than "
                                f"socket_timeout ({socket_timeout:g}s): a wait that runs out "
                                "would time out the call")  # fmt: skip
        return cls(
            **where,
            prefix=prefix,
            runs_per_job=runs,
            events_per_job=events,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            tls=ssl,
            retention=retention,
            wait_replicas=wait_replicas,
            wait_timeout=wait_timeout,
        )

    @property
    def address(self) -> str:
        """Where the store is, as its messages name it."""
        if self.sentinels:
            listed = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
            return f"master {self.service!r} of sentinels {listed}"
        return f"{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        """The client every call of the store goes through."""
        import redis

        kwargs: dict[str, Any] = dict(
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
        if self.sentinels:
            from redis.backoff import NoBackoff
            from redis.retry import Retry
            from redis.sentinel import Sentinel

            # The sentinels are asked with the same timeouts, without the
            # master's credentials, and each once: the next sentinel in the
            # list is the retry (redis-py's default would retry each with
            # backoff, for seconds per sentinel).
            asked = {
                "socket_timeout": self.socket_timeout,
                "socket_connect_timeout": self.connect_timeout,
                "retry": Retry(NoBackoff(), 0),
            }
            # redis.sentinel has no type annotations in older redis-py versions (unused-ignore
            # for the newer, annotated ones); master_for returns a redis.Redis.
            sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=asked)  # type: ignore[no-untyped-call, unused-ignore]
            master: redis.Redis = sentinel.master_for(self.service, **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
            return master
        return redis.Redis(host=self.host, port=self.port, **kwargs)


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
    return _like(client, retry=retry(RETRIES))


def renewer(client: redis.Redis, timeout: float) -> redis.Redis:
    """A client like ``client`` on a pool of its own, whose calls give up
    after ``timeout`` (connecting too), with one immediate retry on a broken
    connection and no ``PING`` before a call: a renew is its own health check,
    and its time must stay within ``timeout`` (twice that on a connection
    broken mid-call)."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    connect = client.connection_pool.connection_kwargs.get("socket_connect_timeout")
    return _like(
        client,
        socket_timeout=timeout,
        socket_connect_timeout=timeout if connect is None else min(connect, timeout),
        retry=Retry(NoBackoff(), 1, (RedisConnectionError,)),
        health_check_interval=0,
    )


def _like(client: redis.Redis, **changes: Any) -> redis.Redis:
    """A client on a new pool like ``client``'s, with ``changes`` to its
    connection settings. A Sentinel pool is made again as one, on the same
    sentinels and master name, so the new client follows failovers too."""
    import redis
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, **changes}
    if isinstance(pool, SentinelConnectionPool):
        kwargs.pop("connection_pool", None)  # the old pool's own back-reference; the new one sets its own
        return redis.Redis(
            connection_pool=SentinelConnectionPool(  # type: ignore[no-untyped-call]  # (not annotated)
                pool.service_name,
                pool.sentinel_manager,
                connection_class=pool.connection_class,
                is_master=pool.is_master,
                check_connection=pool.check_connection,
                **kwargs,
            )
        )
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def where(client: redis.Redis) -> tuple[str, str]:
    """How messages name ``client``'s server, and a URL for it without
    credentials (``RedisStore.url`` when the caller gave a client)."""
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        listed = ",".join(
            f"{s.connection_pool.connection_kwargs.get('host', 'localhost')}:"
            f"{s.connection_pool.connection_kwargs.get('port', SENTINEL_PORT)}"
            for s in pool.sentinel_manager.sentinels
        )
        return (
            f"master {pool.service_name!r} of sentinels {listed}",
            f"{SENTINEL_SCHEME}://{listed}/{pool.service_name}?db={kwargs.get('db', 0)}",
        )
    address = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return address, f"redis://{address}/{kwargs.get('db', 0)}"


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


def _count(url: str, text: str | None, name: str) -> int:
    if text is None:
        return 0
    if not text.isdigit():
        raise StoreUrlError(url, f"{name} must be a whole number (0 or more), got {text!r}")
    return int(text)


def _host_port(url: str, item: str) -> tuple[str, int]:
    """One ``host[:port]`` of a sentinel list; ``[v6]:port`` too."""
    if not item:
        raise StoreUrlError(url, "list the sentinels as host:port,host:port (one was empty)")
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        port_text = rest.removeprefix(":") if bracket and rest.startswith(":") else ""
        if not bracket or (rest and not rest.startswith(":")):
            raise StoreUrlError(url, f"a sentinel must be host:port, got {item!r}")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise StoreUrlError(url, f"a sentinel must be host:port, got {item!r}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise StoreUrlError(url, f"a sentinel's port must be a number from 1 to 65535, got {item!r}")
    return host, int(port_text)

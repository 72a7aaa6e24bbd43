"""Stores by URL. Each backend's driver is imported only when its scheme is
used, so the cron wrapper never pays for a backend it does not use."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import MissingDriver, StoreUrlError

if TYPE_CHECKING:
    from cronwarden.stores.base import Store

SCHEMES = ("sqlite", "postgresql", "postgres", "redis", "rediss", "redis+sentinel")


def default_store_url() -> str:
    """``sqlite:///`` under the user's state directory (XDG_STATE_HOME)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return f"sqlite:///{os.path.join(base, 'cronwarden', 'cronwarden.db')}"


def resolve_url(flag: str | None = None, configured: str | None = None) -> str:
    """The store to use, written once: ``--store`` > ``$CRONWARDEN_STORE`` >
    the config file's ``store`` > the embedded default."""
    return flag or os.environ.get("CRONWARDEN_STORE") or configured or default_store_url()


def check_url(url: str) -> None:
    """Raise ``StoreUrlError`` (or ``MissingDriver``) if ``url`` is not a
    store cronwarden can open: the scheme, and every option of the URL, read
    exactly as ``open_store`` reads them, connecting to nothing. ``config
    check`` calls it, so that it refuses what ``run`` and ``scheduler``
    refuse."""
    _store_class(url).parse_url(url)


def open_store(url: str, *, clock: Clock = SYSTEM_CLOCK, read_only: bool = False) -> Store:
    """The store ``url`` names (``check_url`` says what a URL may hold).
    ``read_only``: for a command that only reads (``status``, ``history``,
    ``audit``): a SQLite file cronwarden cannot write, on a read-only
    filesystem say, is opened read-only, with no migration."""
    cls = _store_class(url)
    if read_only and cls.__name__ == "SqliteStore":
        from cronwarden.stores.sqlite import SqliteStore

        return SqliteStore.from_url(url, clock=clock, read_only=True)
    return cls.from_url(url, clock=clock)


def _store_class(url: str) -> type[Store]:
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        raise StoreUrlError(url, "expected sqlite:///PATH, postgresql://… or redis://…")
    scheme = scheme.lower()
    if scheme == "sqlite":
        from cronwarden.stores.sqlite import SqliteStore

        return SqliteStore
    if scheme in ("postgresql", "postgres"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise MissingDriver("postgresql", "psycopg", "postgres") from None
        from cronwarden.stores.postgres import PostgresStore

        return PostgresStore
    if scheme in ("redis", "rediss", "redis+sentinel"):
        try:
            import redis  # noqa: F401
        except ImportError:
            raise MissingDriver("redis", "redis", "redis") from None
        from cronwarden.stores.redis import RedisStore

        return RedisStore
    raise StoreUrlError(
        url, f"unknown scheme {scheme!r}; expected one of sqlite, postgresql, redis, redis+sentinel"
    )

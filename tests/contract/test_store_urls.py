"""Opening a store: a bad URL is a usage error with a one-line message; a
corrupt SQLite file is a store error naming the file; an unreachable server
is ``StoreUnavailable``, reported quickly (a cron wrapper must not hang)."""

from __future__ import annotations

import time

import pytest

from cronwarden.errors import StoreError, StoreUnavailable, StoreUrlError, UsageError
from cronwarden.stores import open_store

from . import granted, start

UNREACHABLE = {
    "postgres": "postgresql://postgres@127.0.0.1:1/test?schema=cw_unreachable",
    "redis": "redis://127.0.0.1:1/0?prefix=cw_unreachable:",
}


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text, f"not one line: {text!r}"
    return text


@pytest.mark.parametrize("url", ["ftp://example.com/store", "mysql://db/cron", "sqlite3:///tmp/x.db"])
def test_unknown_scheme_is_a_store_url_error(url: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)

    assert isinstance(caught.value, UsageError)
    assert url in _one_line(caught.value)


@pytest.mark.parametrize("url", ["/var/lib/cronwarden.db", "", "://nothing"])
def test_url_without_a_scheme_is_a_store_url_error(url: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)

    _one_line(caught.value)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://?synchronous=full"])
def test_sqlite_url_without_a_path_is_a_store_url_error(url: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(url)

    _one_line(caught.value)


def test_unknown_query_parameter_is_a_store_url_error_naming_it(store_url: str) -> None:
    bad = store_url + ("&" if "?" in store_url else "?") + "bogus_option=1"

    with pytest.raises(StoreUrlError) as caught:
        open_store(bad).close()

    assert "bogus_option" in _one_line(caught.value)


def test_sqlite_bad_parameter_value_is_a_store_url_error(tmp_path) -> None:
    with pytest.raises(StoreUrlError) as caught:
        open_store(f"sqlite:///{tmp_path / 'x.db'}?synchronous=sometimes")

    assert "sometimes" in _one_line(caught.value)


def test_corrupt_sqlite_file_is_a_store_error_naming_the_file(tmp_path) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not an sqlite database\x00\xff" * 512)

    with pytest.raises(StoreError) as caught:
        open_store(f"sqlite:///{path}").close()

    assert not isinstance(caught.value, StoreUnavailable), "a corrupt file is not a transient failure"
    assert str(path) in _one_line(caught.value)


@pytest.mark.parametrize(
    "backend_name",
    [pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("redis", marks=pytest.mark.redis)],
)
def test_unreachable_server_is_store_unavailable_within_10s(backend_probe, backend_name: str) -> None:
    backend_probe.require_module(backend_name)
    began = time.monotonic()

    # Opening may connect lazily: the error may come from the first call.
    with pytest.raises(StoreUnavailable) as caught:
        store = open_store(UNREACHABLE[backend_name])
        try:
            granted(store.acquire(start()))
        finally:
            store.close()

    assert time.monotonic() - began < 10
    _one_line(caught.value)

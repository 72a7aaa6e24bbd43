"""Reading command lines: duration flags, the store flag, a command's
``FLAGS`` table (given to argparse, or read by ``parse_plain`` without it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from cronwarden.errors import UsageError

if TYPE_CHECKING:
    import argparse


def duration(what: str, *, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a positive duration flag (or zero, also
    written ``0``, with ``allow_zero``)."""

    def parse(text: str) -> float:
        from cronwarden.durations import parse_duration, parse_positive_duration

        if allow_zero:
            return 0.0 if text.strip() == "0" else parse_duration(text, what=what)
        return parse_positive_duration(text, what=what)

    parse.__name__ = what
    return parse


STORE_FLAG: dict[str, Any] = {
    "metavar": "URL",
    "help": "sqlite:///PATH (default: $CRONWARDEN_STORE or ~/.local/state/cronwarden/cronwarden.db), "
    "postgresql://…, redis://… or redis+sentinel://…",
}


def add_store_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", **STORE_FLAG)


def store_url(args: Any, configured: str | None = None) -> str:
    """``--store`` > ``$CRONWARDEN_STORE`` > the config file's ``store``
    (``--config``, ``$CRONWARDEN_CONFIG`` or ``./cronwarden.toml``) > default."""
    from cronwarden.stores import resolve_url

    flag = getattr(args, "store", None)
    if configured is None and not flag and not os.environ.get("CRONWARDEN_STORE"):
        from cronwarden.config import find, read

        path = find(getattr(args, "config", None))
        if path is not None:
            configured = read(path).store
    return resolve_url(flag, configured)


def existing_store_url(args: Any, configured: str | None = None) -> str:
    """``store_url`` for a command that only reads the ledger: a SQLite file
    that does not exist is said, not created (opening a SQLite store creates
    it, and a mistyped path would read as an empty ledger)."""
    url = store_url(args, configured)
    if url.startswith("sqlite:"):
        from cronwarden.stores.sqlite import path_of

        path = path_of(url)
        if not os.path.exists(path):
            raise UsageError(f"no ledger at {path}: nothing has been recorded there (a first cronwarden run "
                             "creates it); give the --store your jobs write to")  # fmt: skip
    return url


def add_flags(p: argparse.ArgumentParser, flags: Mapping[str, Mapping[str, Any]]) -> None:
    """Give argparse a command's ``FLAGS`` table (see ``parse_plain``)."""
    groups: dict[str, Any] = {}
    for name, spec in flags.items():
        kwargs = dict(spec)
        group = kwargs.pop("group", None)
        target = p if group is None else groups.setdefault(group, p.add_mutually_exclusive_group())
        target.add_argument(name, **kwargs)


def parse_plain(flags: Mapping[str, Mapping[str, Any]], argv: Sequence[str]) -> SimpleNamespace | None:
    """``argv`` read with a command's ``FLAGS`` table (argparse keywords by
    option) without argparse, when it is plain: each option spelled in full,
    given at most once, as ``--flag VALUE`` or ``--flag=VALUE``, then ``--``
    and the command, kept in ``command`` with its ``--``. Anything else (help,
    an abbreviation, a value that starts with ``-``, a missing, unknown or
    conflicting flag, a bad choice) returns None, and argparse parses it and
    words the error: the result is always what argparse would give.

    Why: importing argparse and building ``run``'s parser is ~16M
    instructions, ~7% of a ``cronwarden run`` on every cron tick."""
    if "--" not in argv:
        return None
    end = list(argv).index("--")
    given: dict[str, str | bool] = {}
    words = iter(argv[:end])
    for arg in words:
        name, eq, value = arg.partition("=")
        spec = flags.get(name)
        if spec is None or name in given:
            return None
        if spec.get("action") == "store_true":
            if eq:
                return None
            given[name] = True
            continue
        if not eq:
            value = next(words, "-")  # no value: argparse says so
        if value.startswith("-") or value not in spec.get("choices", (value,)):
            return None
        given[name] = value
    groups = [flags[n]["group"] for n in given if "group" in flags[n]]
    if len(groups) != len(set(groups)) or any(s.get("required") and n not in given for n, s in flags.items()):
        return None
    ns = SimpleNamespace(command=list(argv[end:]))
    # Flags not given first: two spellings of one setting share a ``dest``
    # (--timezone, --tz), and the one given must win.
    for name, spec in sorted(flags.items(), key=lambda item: item[0] in given):
        convert = spec.get("type")
        result: Any
        if name not in given:
            result = spec.get("default", False if spec.get("action") == "store_true" else None)
        elif convert is not None:
            try:
                result = convert(given[name])
            except (ValueError, TypeError):
                return None  # argparse's "invalid int value: …"
        else:
            result = given[name]
        setattr(ns, spec.get("dest", name[2:].replace("-", "_")), result)
    return ns


def retention(store: Any, config: Any, *, max_age: float | None = None, keep_runs: int | None = None) -> Any:
    """What to keep, written once: flags > the store URL's ``retention`` and
    ``keep_runs`` > the config file's (``Config.retention``, ``keep_runs``)."""
    from cronwarden.stores.base import Retention

    url = store.retention
    return Retention(
        max_age if max_age is not None else url.max_age if url.max_age is not None else config.retention,
        keep_runs
        if keep_runs is not None
        else url.keep_runs
        if url.keep_runs is not None
        else config.keep_runs,
    )

"""The fenced Redis writes (see ``cronwarden.fence``): one Lua script per
write, each starting with ``check.lua``; the resource's fence is the key
``cronwarden_fence:<resource>``. On Redis Cluster the fence and the key must
hash to one slot: give them a hash tag (a resource ``{totals}`` and a key
``{totals}:sum``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from cronwarden.errors import Fenced
from cronwarden.fence import check_resource, check_token

HERE = Path(__file__).parent
PREFIX = "cronwarden_fence:"


def fence_key(resource: str) -> str:
    return PREFIX + resource


@cache
def _text(name: str) -> str:
    from cronwarden.errors import StoreError

    try:
        return (HERE / "check.lua").read_text() + "\n" + (HERE / f"{name}.lua").read_text()
    except OSError as e:
        why = f"cannot read {name}.lua: {e.strerror}; is cronwarden installed with its package data?"
        raise StoreError(why) from None


_scripts: dict[str, Any] = {}


def _script(client: Any, name: str) -> Any:
    """redis-py's ``Script`` (EVALSHA, loading the script on NOSCRIPT), one
    per script per process; called with the caller's client."""
    found = _scripts.get(name)
    if found is None:
        found = _scripts[name] = client.register_script(_text(name))
    return found


def call(client: Any, name: str, resource: str, key: str, token: int | str, args: list[Any]) -> Any:
    """Run script ``name`` on ``key`` behind ``resource``'s fence; its reply's
    second element, or raise ``Fenced``."""
    check_resource(resource)
    number = check_token(token)
    reply = _script(client, name)(keys=[fence_key(resource), key], args=[str(number), *args], client=client)
    if int(reply[0]) != 1:
        raise Fenced(resource, number, int(reply[1]))
    return reply[1] if len(reply) > 1 else None


def fence(client: Any, resource: str, token: int) -> None:
    reply = _script(client, "fence")(keys=[fence_key(resource)], args=[str(token)], client=client)
    if int(reply[0]) != 1:
        raise Fenced(resource, token, int(reply[1]))

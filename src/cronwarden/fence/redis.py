"""The fenced Redis writes (see ``cronwarden.fence``): one Lua script per
write, each starting with ``check.lua``. A resource's fence is the key
``<resource>:cronwarden_fence``: beside the data it guards, so a key prefix
(an ACL's key pattern, a namespace) covers both. On Redis Cluster the fence
and the key must hash to one slot: give them a hash tag (a key
``{totals}:sum`` with the resource ``{totals}``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from cronwarden.errors import Fenced

HERE = Path(__file__).parent
SUFFIX = ":cronwarden_fence"


def fence_key(resource: str) -> str:
    return resource + SUFFIX


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


def call(client: Any, name: str, resource: str, key: str, token: int, args: list[Any]) -> Any:
    """Run script ``name`` on ``key`` behind ``resource``'s fence (both
    checked by the caller); its reply's second element, or raise ``Fenced``."""
    reply = _script(client, name)(keys=[fence_key(resource), key], args=[str(token), *args], client=client)
    if int(reply[0]) != 1:
        raise Fenced(resource, token, int(reply[1]))
    return reply[1] if len(reply) > 1 else None


def fence(client: Any, resource: str, token: int) -> None:
    reply = _script(client, "fence")(keys=[fence_key(resource)], args=[str(token)], client=client)
    if int(reply[0]) != 1:
        raise Fenced(resource, token, int(reply[1]))

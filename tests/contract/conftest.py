"""The contract suite runs on every backend, and once more on PostgreSQL
through a PgBouncer in transaction mode (``pgbouncer``): a private one the
session starts on its own port in front of the shared server, stopped by
its pid at the end. The store's URL then says ``pooler=transaction``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.conftest import POSTGRES_URL, BackendProbe, unavailable
from tests.pgbouncer import PgBouncer, pgbouncer, why_not


@pytest.fixture(scope="session")
def bouncer(backend_probe: BackendProbe) -> Iterator[PgBouncer]:
    why = backend_probe.why_not("postgres") or why_not()
    if why is not None:
        unavailable(why)
    with pgbouncer(POSTGRES_URL) as running:
        yield running


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("pgbouncer", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest, backend_probe: BackendProbe) -> str:
    name: str = request.param
    why = backend_probe.why_not("postgres" if name == "pgbouncer" else name)
    if why is not None:
        unavailable(why)
    return name

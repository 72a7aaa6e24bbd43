"""A FastAPI service with a guarded background task, however many replicas
run it against one store.

    export CRONWARDEN_STORE=postgresql://cronwarden@db.internal/ops   # shared by every replica
    uvicorn app:app --port 8000

``POST /reindex`` answers at once (202) and reindexes in the background:
only one replica reindexes at a time, the others record the request
``skipped``. A loop started with the app refreshes a cache every
``REFRESH_EVERY`` seconds, once across all replicas. Both are coroutines
guarded in the event loop: the store is called from a worker thread, and if
a run's lease is lost its task is cancelled before another replica could
take it over. Shutting the service down cancels the loop: its run in
progress is recorded ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator

from fastapi import BackgroundTasks, FastAPI

from cronwarden import Warden

WORK = float(os.environ.get("REINDEX_SECONDS", "5"))
REFRESH_EVERY = float(os.environ.get("REFRESH_EVERY", "60"))

warden = Warden()  # $CRONWARDEN_STORE


@warden.job("reindex", ttl="1m", policy="skip", reason="a second reindex would only redo the first")
async def reindex() -> None:
    started = time.time()
    await asyncio.sleep(WORK)  # the real work: awaits, so the service keeps answering
    print(f"pid {os.getpid()} reindexed search {started:.3f}-{time.time():.3f}", flush=True)


@warden.job("refresh-cache", ttl="1m", every=f"{REFRESH_EVERY:g}s")
async def refresh_cache() -> None:
    await asyncio.sleep(0.1)


async def refresh_forever() -> None:
    while True:
        await refresh_cache()  # returns None at once where another replica holds it
        await asyncio.sleep(REFRESH_EVERY)


@contextlib.asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    loop = asyncio.create_task(refresh_forever())
    try:
        yield
    finally:
        loop.cancel()  # a refresh in progress is recorded interrupted
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        warden.close()


app = FastAPI(lifespan=lifespan)


@app.post("/reindex", status_code=202)
async def start_reindex(background: BackgroundTasks) -> dict[str, str]:
    background.add_task(reindex)  # a coroutine function: run in the event loop, guarded
    return {"status": "accepted"}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}

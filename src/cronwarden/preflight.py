"""The checks a configuration passes before anything runs, written once.

``cronwarden run`` and ``cronwarden scheduler`` call these as they start,
the stores read their URLs with ``cronwarden.stores.check_url``'s reading,
and ``cronwarden config check`` calls the same functions (``problems``), so
that it says ok exactly when they would start, with the same message when
they would not.
"""

from __future__ import annotations

from collections.abc import Mapping

from cronwarden.config import Config, JobSettings, Problem, merge
from cronwarden.errors import UsageError
from cronwarden.guard import Options, this_host

MIN_TTL = 1.0
"""The shortest ttl: a lease renewed every ttl/3 needs room for a round
trip to the store and a late wake-up on a busy host, or it is always lost."""


def job_options(settings: JobSettings, *, shard: str | None = None, slot: float | None = None) -> Options:
    """The guard's options for a job as its resolved ``settings`` say
    (with ``shard`` and ``slot`` for this run), checked: a ``UsageError``
    naming the setting, and for the ttl where its value came from."""
    if settings.ttl < MIN_TTL:
        source = settings.sources.get("ttl", "built-in default")
        raise UsageError(f"ttl must be at least 1s (it is renewed every ttl/3, each renewal a round trip to "
                         f"the store), got {settings.ttl:g}s from {source}")  # fmt: skip
    return Options(
        ttl=settings.ttl, policy=settings.policy, shard=shard, renew_every=settings.renew_every,
        max_runtime=settings.max_runtime, max_pending=settings.max_pending,
        replace_grace=settings.replace_grace, allow_unpartitioned=settings.allow_unpartitioned, slot=slot,
        # What the job declares, so the guard's declaration is the one the store keeps.
        every=settings.every, schedule=settings.schedule, timezone=settings.timezone or None,
        reason=settings.reason, grace=settings.grace,
    )  # fmt: skip


def problems(config: Config, environ: Mapping[str, str] | None = None) -> list[Problem]:
    """What ``run`` or ``scheduler`` would refuse in ``config`` beyond the
    problems the file reader found (``config.problems``): the store URL, the
    host name, and each job's settings as the guard checks them (a job whose
    table already has a problem is left to that problem)."""
    from cronwarden.stores import check_url

    found: list[Problem] = []
    if config.store:
        try:
            check_url(config.store)
        except UsageError as e:
            found.append(Problem(config.store_source or "store", None, str(e)))
    try:
        this_host(environ)
    except UsageError as e:
        found.append(Problem("$CRONWARDEN_HOST", None, str(e)))
    where = config.path or "the environment"
    defaults = merge("", {}, {}, config.defaults, config.default_sources, in_file=False)
    common = _problem(defaults)
    if common is not None:
        found.append(Problem(where, None, f"the defaults (a job that sets no value of its own): {common}"))
    for job in config.jobs:
        if job.name in config.job_problems:
            continue
        said = _problem(job)
        if said is not None and said != common:
            found.append(Problem(where, None, f"[jobs.{job.name}] {said}"))
    return found


def _problem(settings: JobSettings) -> str | None:
    """What ``job_options`` says of ``settings``, if anything. A job with
    shards is checked as a run of its first shard would be."""
    try:
        job_options(settings, shard=settings.shards[0] if settings.shards else None)
    except UsageError as e:
        return str(e)
    return None

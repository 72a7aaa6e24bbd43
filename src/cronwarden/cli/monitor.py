"""``cronwarden monitor`` and ``ack``: the monitor's loop (findings recorded
when raised and when resolved, the outbox delivered, optionally the
dashboard served), and resolving a finding by hand."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from cronwarden.cli.window import add_window_flags, open_monitor, open_store_of
from cronwarden.clock import SYSTEM_CLOCK, Clock
from cronwarden.errors import StoreUnavailable, UsageError
from cronwarden.monitor.views import dur

if TYPE_CHECKING:
    from cronwarden.monitor import Monitor
    from cronwarden.stores.base import Store

OUTBOX_BUDGET = 10.0
"""Seconds one pass may spend delivering the outbox to sinks."""


def configure_monitor(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import duration

    p.description = (
        "Evaluate every job in a loop: record findings when they are raised and when they resolve, "
        "record abandoned runs, and deliver the outbox to the configured sinks."
    )
    p.add_argument("--interval", type=duration("--interval"), default=30.0, metavar="DURATION",
                   help="time between passes (default 30s)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    from cronwarden.cli.dashboard import address, refresh

    p.add_argument("--listen", type=address, metavar="HOST:PORT",
                   help="also serve the dashboard, its JSON API and /metrics here (see cronwarden "
                   "dashboard --help), from this process")  # fmt: skip
    from cronwarden.cli.dashboard import add_token_flag

    add_token_flag(p)
    p.add_argument("--refresh", type=refresh, metavar="DURATION",
                   help="with --listen: how often the pages reload (default 30s; 0: never)")  # fmt: skip
    add_window_flags(p)


def outbox_flusher(
    store: Store, args: Any, clock: Clock, budget: float = OUTBOX_BUDGET
) -> Callable[[], int] | None:
    """A function that delivers the sinks' outboxes (``cronwarden.sinks.load_sinks``
    and ``cronwarden.outbox.flush_sinks``), or None when no config file
    configures a sink. Sinks are loaded once, so a bad sink table stops
    ``monitor`` at startup, not in the loop. Each call spends at most
    ``budget`` seconds; a failing sink is reported in one line and its events
    stay in the outbox."""
    import tomllib

    from cronwarden import outbox
    from cronwarden import sinks as sinks_module
    from cronwarden.config import find

    path = find(getattr(args, "config", None))
    if path is None:
        return None

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"{path}: cannot read the config file: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: TOML syntax: {e}") from None
    if not sinks_module.has_sinks(doc):
        return None
    sinks = sinks_module.load_sinks(doc)

    def flush() -> int:
        results = outbox.flush_sinks(store, sinks, deadline=clock.monotonic() + budget, clock=clock)
        for r in results:
            if r.error is not None and not r.backing_off:
                print(f"cronwarden: sink {r.sink}: {r.error}; its events stay in the outbox",
                      file=sys.stderr, flush=True)  # fmt: skip
            if r.rejected:
                print(f"cronwarden: sink {r.sink} refused {r.rejected} event(s) for good ({r.rejection}); "
                      "set aside: cronwarden flush --retry-rejected",
                      file=sys.stderr, flush=True)  # fmt: skip
        return sum(int(r.delivered) for r in results)

    return flush


def watch(
    monitor: Monitor,
    *,
    interval: float,
    once: bool = False,
    passes: int | None = None,
    flush: Callable[[], int] | None = None,
    prune: Callable[[], object] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The monitor loop: a pass, findings printed, the outbox flushed, then
    sleep ``interval`` on the monitor's clock (a ``FakeClock`` in tests).
    An unreachable store is reported and retried at the next pass."""
    out, err = out or sys.stdout, err or sys.stderr
    clock = monitor.clock
    n = 0
    while True:
        began = clock.monotonic()
        try:
            result = monitor.evaluate()
            for e in (*result.raised, *result.resolved):
                state = e.data.get("state", "")
                who = f" run {e.run_id}" if e.run_id else ""
                print(f"{_stamp(e.at)} {state} {e.job} {e.kind.value}{who}: {e.data.get('summary', '')}",
                      file=out, flush=True)  # fmt: skip
            if flush is not None:
                flush()
            if prune is not None:
                prune()
        except StoreUnavailable as e:
            print(f"cronwarden: {e}; retrying in {dur(interval)}", file=err, flush=True)
            if once:
                return e.exit_code
        n += 1
        if once or (passes is not None and n >= passes):
            return 0
        clock.sleep(max(0.0, interval - (clock.monotonic() - began)))


PRUNE_TIME = 0.5
"""Seconds of retention steps a monitoring pass may spend (each step is
bounded: ``Store.prune``); a backlog is worked off over the next passes."""


def pruner(store: Any, args: Any, clock: Clock) -> Callable[[], object] | None:
    """Retention steps for each pass, if the store URL or the config says
    what to keep."""
    from cronwarden.cli.args import retention
    from cronwarden.config import find, read

    keep = retention(store, read(find(getattr(args, "config", None))))
    if not keep.active:
        return None

    def prune() -> None:
        give_up = clock.monotonic() + PRUNE_TIME
        while not store.prune(keep, clock.wall()).done and clock.monotonic() < give_up:
            pass

    return prune


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


class _Stop(BaseException):
    """SIGTERM: the loop ends, the dashboard stops, the stores close. Not an
    ``Exception`` (as SIGINT's ``KeyboardInterrupt`` is not): raised in the
    middle of a flush, it must not be taken for a sink's failure; the outbox
    abandons what is in flight and lets it by, recording nothing."""


def main_monitor(args: Any, *, clock: Clock = SYSTEM_CLOCK) -> int:
    if args.listen and args.once:
        raise UsageError("--listen serves while the monitor loops: drop --once")
    if args.refresh is not None and not args.listen:
        raise UsageError("--refresh is how often the dashboard's pages reload: give --listen too")

    def stop(signum: int, frame: Any) -> None:
        raise _Stop

    store = open_store_of(args, clock)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        monitor = open_monitor(args, store, clock)
        out = open("/dev/null", "w") if args.quiet else sys.stdout  # noqa: SIM115
        try:
            flush = outbox_flusher(store, args, clock)
            with _dashboard(args, clock):
                return watch(monitor, interval=args.interval, once=args.once, out=out, flush=flush,
                             prune=pruner(store, args, clock))  # fmt: skip
        finally:
            if args.quiet:
                out.close()
    except _Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()


@contextlib.contextmanager
def _dashboard(args: Any, clock: Clock) -> Iterator[None]:
    """With ``--listen``: the dashboard served from a thread while the loop
    runs, on a store of its own (the loop's is used by one thread)."""
    if not args.listen:
        yield
        return
    from cronwarden.cli.dashboard import open_dashboard, request_log, token_of
    from cronwarden.web import bind, url_of

    dashboard = open_dashboard(args, clock)
    try:
        host, port = args.listen
        server = bind(dashboard, host, port, log=request_log(args), token=token_of(args))
        print(f"cronwarden monitor: dashboard on {url_of(server)}", file=sys.stderr, flush=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                  name="cronwarden-dashboard", daemon=True)  # fmt: skip
        thread.start()
        try:
            yield
        finally:
            server.shutdown()
            server.server_close()
    finally:
        dashboard.close()


def configure_ack(p: argparse.ArgumentParser) -> None:
    from cronwarden.cli.args import add_store_flag

    p.description = (
        "Resolve a raised finding by hand: mostly a stuck run that was abandoned (its host died "
        "mid-work), which stays raised, however many runs succeed after it, until someone has looked. "
        "A finding whose condition still holds for a job (slow, missed, ...) is raised again at the "
        "next pass."
    )
    p.add_argument("--job", required=True, help="job name")
    p.add_argument("--run-id", metavar="ID", help="the run the finding is about (stuck, overlap)")
    p.add_argument("--rule", default="stuck", help="the finding's rule (default stuck)")
    p.add_argument("--by", default="", help="who looked (recorded with the acknowledgment)")
    add_store_flag(p)


def main_ack(args: Any, *, clock: Clock = SYSTEM_CLOCK, out: TextIO | None = None) -> int:
    from cronwarden.config.settings import check_name
    from cronwarden.monitor import FINDING_KINDS, PER_RUN, Monitor

    out = out or sys.stdout
    check_name(args.job, "job name")
    rules = {k.value: k for k in FINDING_KINDS}
    rule = rules.get(args.rule)
    if rule is None:
        raise UsageError(f"--rule must be one of {', '.join(rules)}, got {args.rule!r}")
    if rule in PER_RUN and not args.run_id:
        raise UsageError(f"ack: a {rule.value} finding is about one run; give --run-id")
    store = open_store_of(args, clock)
    try:
        monitor = Monitor(store, clock=clock)
        state = monitor.states(args.job).get((rule, args.run_id if rule in PER_RUN else None))
        if state is None or state.data.get("state", "raised") != "raised":
            what = f"{rule.value} finding for {args.job}" + (f" run {args.run_id}" if args.run_id else "")
            raise UsageError(f"ack: no raised {what}")
        monitor.acknowledge(args.job, rule, args.run_id, by=args.by)
    finally:
        store.close()
    print(
        f"acknowledged {rule.value} of {args.job}" + (f" run {args.run_id}" if args.run_id else ""), file=out
    )
    return 0

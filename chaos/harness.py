"""Drives one round of chaos: N worker slots launching real ``cronwarden run``
processes on one job (like cron ticks on N hosts), faults injected into the
current holder or the store, then the checkers on the recorded history.

A round has one store, one fault kind and one fencing mode; the short mode
(``tests/chaos``) and the long mode (``bench/chaos.py``) are sequences of
rounds. Every round gets a fresh job, ledger namespace and referee, so its
history is complete and small enough to check in full.

Times: the harness, the referee and the children all read CLOCK_MONOTONIC
(shared by every process on the host); ledger timestamps are wall-clock and
are compared only with the harness's own wall-clock readings.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos import checkers
from chaos.checkers import Distribution
from chaos.faults import KILLS, PAUSES, Backend, Fault, Injection, parent_of, signal_group, unique
from chaos.referee import Referee
from cronwarden.events import Event, EventKind, Outcome, RunRecord
from cronwarden.lease import belief, renew_interval
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery, Store

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
ALL_EVENTS = 10_000_000

EXIT_LEASE_LOST = 3
EXIT_STORE = 75


@dataclass
class RoundConfig:
    fault: Fault
    fenced: bool = True
    ttl: float = 1.0
    faults: int = 2
    """Injections in the round (0 for Fault.NONE)."""
    min_cycles: int = 4
    """Guarded runs (``started``) the round makes at least."""
    slots: int = 2
    """Worker loops, each launching one ``cronwarden run`` at a time."""
    tick: float = 0.15
    """Pause between a slot's launches: the cron tick."""
    long_share: float = 0.5
    """Share of launches that do long work (faults target these)."""
    long_work: float = 1.5
    """Length of a long run's work, in ttls (read–sleep–write steps of ttl/4)."""
    gap: tuple[int, int] = (1, 2)
    """Clean guarded runs between recovering from a fault and the next fault."""
    timeout: float = 90.0
    seed: int | None = None


@dataclass
class Launch:
    slot: int
    long: bool
    pid: int
    launched: float
    launched_wall: float
    ended: float | None = None
    returncode: int | None = None
    stderr: str = ""


@dataclass
class RoundResult:
    store: str
    config: RoundConfig
    job: str
    wall: float = 0.0
    cycles: int = 0
    """Guarded runs started in the round."""
    attempts: int = 0
    injections: list[Injection] = field(default_factory=list)
    violations: dict[str, list[str]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    exits: Counter[int] = field(default_factory=Counter)
    takeover: Distribution = field(default_factory=Distribution)
    takeover_bound: float = 0.0
    takeover_over_bound: list[str] = field(default_factory=list)
    margin: Distribution = field(default_factory=Distribution)
    orphan: Distribution = field(default_factory=Distribution)
    """kill -9 of a supervisor → its child's death (PDEATHSIG), seconds."""
    writes: int = 0
    rejected: int = 0
    late_rejected: int = 0
    """Operations of a frozen-then-resumed holder that the referee refused."""
    stopped_for_lease_loss: int = 0
    """Runs, not frozen by the harness, whose supervisor stopped them for a lost lease."""
    lease_kept: int = 0
    lease_lost: int = 0
    """For PAUSE_SHORT: injections after which the paused run kept / lost its lease."""
    lost_within_budget: int = 0
    """PAUSE_SHORT injections that lost the lease although the pause ended before
    the supervisor's stop threshold (last renewal + 0.9×ttl − kill grace)."""
    control_hits: int = 0
    """Unfenced pause injections whose frozen run shows up in an (a)/(b)/(c) violation."""
    expectations: list[str] = field(default_factory=list)
    """Behaviour the fault should have produced and did not (not a safety violation)."""
    tracebacks: list[str] = field(default_factory=list)
    """The stderr of every ``cronwarden run`` that printed a traceback (never expected)."""
    errors: list[str] = field(default_factory=list)

    @property
    def safety_violations(self) -> int:
        return sum(len(v) for k, v in self.violations.items() if k in "abcdgh")

    def found(self, *letters: str) -> int:
        return sum(len(self.violations.get(x, [])) for x in letters)


class Round:
    def __init__(self, backend: Backend, config: RoundConfig) -> None:
        self.backend = backend
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.job = unique(f"chaos_{config.fault.value}")
        self.namespace = self.job.lower()
        self.url = backend.url(self.namespace)
        self.result = RoundResult(store=backend.name, config=config, job=self.job)
        self.launches: dict[int, Launch] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.log: list[dict[str, Any]] = []
        self.watch: list[tuple[float, str, int, float]] = []
        self.referee: Referee | None = None
        self.watch_store: Store | None = None

    # -- workers -------------------------------------------------------------

    def work(self, long: bool) -> tuple[int, float]:
        """(steps, seconds between each read and its write) of one run's work."""
        step = self.cfg.ttl / 4
        return (max(1, round(self.cfg.long_work * self.cfg.ttl / step)), step) if long else (1, 0.01)

    def worker(self, long: bool) -> list[str]:
        """The command a guarded run runs."""
        steps, sleep = self.work(long)
        assert self.referee is not None
        worker = [sys.executable, "-S", WORKER, "--port", str(self.referee.port), "--steps", str(steps),
                  "--sleep", f"{sleep:.3f}"]  # fmt: skip
        if not self.cfg.fenced:
            worker.append("--no-fencing")
        return worker

    def command(self, long: bool) -> list[str]:
        ttl = self.cfg.ttl
        return [sys.executable, "-m", "cronwarden", "run", "--job", self.job, "--ttl", f"{int(ttl * 1000)}ms",
                "--store", self.url, "--quiet", "--", *self.worker(long)]  # fmt: skip

    def launch(self, slot: int, long: bool) -> Launch:
        proc = subprocess.Popen(self.command(long), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        record = Launch(slot=slot, long=long, pid=proc.pid, launched=time.monotonic(),
                        launched_wall=time.time())  # fmt: skip
        with self.lock:
            self.launches[proc.pid] = record
        _, err = proc.communicate()
        record.stderr = err.decode(errors="replace")[-2000:]
        record.returncode = proc.returncode
        record.ended = time.monotonic()
        return record

    def slot_loop(self, slot: int) -> None:
        while not self.stop.is_set():
            try:
                self.launch(slot, self.rng.random() < self.cfg.long_share)
            except Exception as e:  # pragma: no cover - a harness bug, reported in the result
                self.result.errors.append(f"slot {slot}: {e!r}")
                return
            self.stop.wait(self.cfg.tick)

    # -- observing -----------------------------------------------------------

    def watcher(self, store: Store) -> None:
        """Read the lease as the store sees it, every 50 ms: the lower bound
        of each holder's expiry used by checker (f)."""
        while not self.stop.is_set():
            self.observe(store)
            self.stop.wait(0.05)

    def observe(self, store: Store) -> None:
        """One reading of the lease. ``sent + expires_in`` is no later than
        the expiry the store had at that moment (it computed ``expires_in``
        after we sent). The harness also reads just before each fault, so a
        renewal made since the watcher's last reading is not missed."""
        sent = time.monotonic()
        try:
            info = store.lease(self.job)
        except Exception:
            return
        if info is not None and info.owner is not None and info.expires_in is not None:
            with self.lock:
                self.watch.append((sent, info.owner, info.token, info.expires_in))

    def refresh(self) -> list[dict[str, Any]]:
        assert self.referee is not None
        self.log.extend(self.referee.since(len(self.log)))
        return self.log

    def wait(self, what: str, predicate: Any, timeout: float, every: float = 0.02) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(every)
        self.result.errors.append(f"timed out after {timeout:g}s waiting for {what}")
        return False

    @staticmethod
    def wait_quietly(predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def good_runs_since(self, t: float) -> set[str]:
        """Runs that started work after monotonic ``t`` and wrote successfully."""
        self.refresh()
        hello = {e["run"] for e in self.log if e["op"] == "hello" and e["t"] > t}
        return {e["run"] for e in self.log if e["op"] == "write" and e["ok"] and e["run"] in hello}

    # -- faults --------------------------------------------------------------

    def pick_target(self) -> tuple[str, int, int] | None:
        """A long-working run now: (run id, its command's process group,
        supervisor pid). The worker may be the supervisor's child or a
        grandchild (under a keeper process that leads the group)."""
        assert self.referee is not None
        for conn in self.referee.who():
            with self.lock:
                launch = next((self.launches[p] for p in ancestors(conn["pid"]) if p in self.launches), None)
            if launch is None or not launch.long or launch.returncode is not None:
                continue
            try:
                group = os.getpgid(conn["pid"])
            except ProcessLookupError:
                continue
            if group != launch.pid:
                return conn["run"], group, launch.pid
        return None

    def inject(self) -> Injection | None:
        fault = self.cfg.fault
        ttl = self.cfg.ttl
        target = None
        deadline = time.monotonic() + 30
        while target is None and time.monotonic() < deadline:
            target = self.pick_target()
            if target is None:
                time.sleep(0.02)
        if target is None:
            self.result.errors.append("no long run to target for 30s")
            return None
        run, child, sup = target
        self.phase(run)
        if not _alive(child) or sup not in ancestors(child):
            return None  # finished meanwhile; pick another
        watch = self.watch_store
        assert watch is not None
        self.observe(watch)
        inj = Injection(fault=fault, at=time.monotonic(), wall=time.time(), target_run=run, supervisor=sup,
                        child=child)  # fmt: skip
        if fault is Fault.KILL_SUPERVISOR:
            os.kill(sup, signal.SIGKILL)
        elif fault is Fault.KILL_CHILD:
            signal_group(child, signal.SIGKILL)
        elif fault is Fault.PAUSE_SHORT:
            signal_group(sup, signal.SIGSTOP)
            signal_group(child, signal.SIGSTOP)
            time.sleep(0.5 * ttl)
            self._resume(inj)
        elif fault in PAUSES:
            signal_group(sup, signal.SIGSTOP)
            if fault is Fault.PAUSE_LONG:
                signal_group(child, signal.SIGSTOP)
            self._hold_until_taken_over(inj)
            self._resume(inj)
        elif fault is Fault.CONN_KILL:
            inj.note = f"{self.backend.conn_kill()} connections killed"
            inj.resumed = time.monotonic()
        elif fault is Fault.STORE_RESTART:
            self.backend.restart(self.rng.uniform(0, 1.5 * ttl))
            inj.resumed = time.monotonic()
            inj.note = f"down {inj.resumed - inj.at:.2f}s"
        elif fault is Fault.STORE_PAUSE:
            self.backend.pause(1.5 * ttl, self.namespace, before_resume=lambda: self.observe(watch))
            inj.resumed = time.monotonic()
        return inj

    def phase(self, run: str) -> None:
        """Wait for the moment to strike ``run``: a random phase relative to
        the heartbeat's renewals."""
        time.sleep(self.rng.uniform(0, renew_interval(self.cfg.ttl)))

    def _hold_until_taken_over(self, inj: Injection) -> None:
        """Keep the holder frozen for 2×ttl, and on to 3×ttl until another run
        has acted on the referee (and, when only the supervisor is frozen,
        until the target's still-running child has acted after it). That
        makes the hazard happen in every injection rather than by luck."""
        ttl = self.cfg.ttl
        start = inj.at
        while True:
            now = time.monotonic()
            if now - start >= 3 * ttl:
                break
            if now - start >= 2 * ttl:
                log = self.refresh()
                other = [e for e in log if e["t"] > start and e.get("run") not in (None, inj.target_run)
                         and e["op"] in ("read", "write") and e["ok"]]  # fmt: skip
                if other:
                    inj.took_over = other[0]["run"]
                    if inj.fault is Fault.PAUSE_LONG:
                        break
                    after = [e for e in log if e["t"] > other[0]["t"] and e.get("run") == inj.target_run
                             and e["op"] in ("read", "write")]  # fmt: skip
                    if after or not _alive(inj.child):
                        break
            time.sleep(0.02)

    def _resume(self, inj: Injection) -> None:
        """The command first, the supervisor after: the worst order of a thaw
        (after a whole machine or cgroup is frozen, the order is arbitrary).
        After a long pause the supervisor is resumed only once the command
        has taken its next step (or after a second), so that step happens
        before the supervisor can look at its clock, in every injection."""
        assert inj.child is not None and inj.supervisor is not None
        thawed = time.monotonic()
        signal_group(inj.child, signal.SIGCONT)
        if inj.fault is Fault.PAUSE_LONG:
            self.wait_quietly(lambda: self.stepped(inj.target_run, thawed), 1.0)
        else:
            time.sleep(0.05)
        signal_group(inj.supervisor, signal.SIGCONT)
        inj.resumed = time.monotonic()

    def stepped(self, run: str | None, since: float) -> bool:
        """Whether ``run`` has taken its next step since monotonic ``since``."""
        return any(e.get("run") == run and e["t"] > since for e in self.refresh()[-50:])

    # -- the round -----------------------------------------------------------

    def run(self) -> RoundResult:
        t0 = time.monotonic()
        self.referee = Referee()
        watch_store = self.watch_store = open_store(self.backend.watch_url(self.namespace))
        threads = [threading.Thread(target=self.watcher, args=(watch_store,), daemon=True)]
        threads += [threading.Thread(target=self.slot_loop, args=(i,), daemon=True)
                    for i in range(self.cfg.slots)]  # fmt: skip
        for t in threads:
            t.start()
        try:
            self._drive()
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=self.cfg.ttl * 4 + 30)
            self._reap()
            try:
                self._close_round(watch_store)
                self._check(watch_store)
            finally:
                watch_store.close()
                self.referee.stop()
        self.result.wall = time.monotonic() - t0
        return self.result

    def _drive(self) -> None:
        cfg = self.cfg
        deadline = time.monotonic() + cfg.timeout
        n = 0 if cfg.fault is Fault.NONE else cfg.faults
        since = time.monotonic()
        for _ in range(n):
            # Clean cycles first: the previous fault is over and runs work again.
            want = self.rng.randint(*cfg.gap)
            self.wait("clean runs between faults", lambda s=since, w=want: len(self.good_runs_since(s)) >= w,
                      max(5.0, deadline - time.monotonic()))  # fmt: skip
            if time.monotonic() > deadline:
                break
            inj = None
            for _attempt in range(5):
                inj = self.inject()
                if inj is not None:
                    break
            if inj is None:
                self.result.errors.append(f"could not inject {cfg.fault}")
                continue
            self.result.injections.append(inj)
            since = inj.resumed or inj.at
        self.wait("the minimum cycles", lambda: len(self._hellos()) >= cfg.min_cycles,
                  max(5.0, deadline - time.monotonic()))  # fmt: skip

    def _hellos(self) -> set[str]:
        self.refresh()
        return {e["run"] for e in self.log if e["op"] == "hello"}

    def _reap(self) -> None:
        """No process of this round outlives it (only ours, by pid)."""
        with self.lock:
            left = [x for x in self.launches.values() if x.returncode is None]
        for x in left:
            signal_group(x.pid, signal.SIGCONT)
            signal_group(x.pid, signal.SIGKILL)
            self.result.errors.append(f"supervisor {x.pid} still running at the end of the round")

    def _close_round(self, store: Store) -> None:
        """A last start after the lease is free or expired, so a holder that was
        killed gets its ``abandoned`` record (found only by a later start)."""
        ttl = self.cfg.ttl

        def free() -> bool:
            try:
                info = store.lease(self.job)
            except Exception:
                return False
            if info is None or info.owner is None:
                return True
            return info.expires_in is not None and info.expires_in <= 0

        self.wait("the lease to be free at the end", free, ttl * 3 + 10, every=0.05)
        last = self.launch(-1, False)
        if last.returncode != 0:
            self.result.errors.append(f"closing run exited {last.returncode}: {last.stderr.strip()[-300:]}")

    # -- checking ------------------------------------------------------------

    def _check(self, store: Store) -> None:
        r = self.result
        assert self.referee is not None
        dump = self.referee.dump()
        log, head = dump["log"], dump["head"]
        events = store.events(EventQuery(job=self.job, limit=ALL_EVENTS, newest_first=False))
        started = [e for e in events if e.kind is EventKind.STARTED]
        runs = {e.run_id: store.run(e.run_id) for e in started if e.run_id}
        tokens = checkers.run_tokens(events)
        r.cycles = len(started)
        r.attempts = len(self.launches)
        r.violations = {
            **self._safety(log, head, tokens),
            "d": checkers.check_d_one_terminal(events, runs, log),
            "g": checkers.check_g_grant_order(events),
            "h": [],
        }
        for rec in runs.values():
            if rec is not None and rec.outcome is not None:
                r.outcomes[rec.outcome.value] += 1
        for launch in self.launches.values():
            if launch.returncode is not None:
                r.exits[launch.returncode] += 1
            if "Traceback" in launch.stderr:
                r.tracebacks.append(f"exit {launch.returncode}: {launch.stderr.strip()[-1500:]}")
        writes = [e for e in log if e["op"] == "write"]
        r.writes = sum(1 for e in writes if e["ok"])
        r.rejected = sum(1 for e in log if e["op"] in ("read", "write") and not e["ok"])
        self._measure(log, events, runs)

    def _safety(self, log: list[dict[str, Any]], head: str, tokens: dict[str, int]) -> dict[str, list[str]]:
        """Checkers (a)–(c) on the resource the workers wrote: the referee's document."""
        return {
            "a": checkers.check_a_token_order(log, tokens),
            "b": checkers.check_b_no_interleaving(log),
            "c": checkers.check_c_acknowledged_present(log, head),
        }

    def _measure(
        self, log: list[dict[str, Any]], events: list[Event], runs: dict[str, RunRecord | None]
    ) -> None:
        r, ttl = self.result, self.cfg.ttl
        h = History(log=log, runs=runs, launches={x.pid: x for x in self.launches.values()},
                    started=sorted((e for e in events if e.kind is EventKind.STARTED), key=lambda e: e.at),
                    closes={e["run"]: e["t"] for e in log if e["op"] == "close"})  # fmt: skip
        start_pids = {rec.pid for rec in runs.values() if rec is not None}
        skips = [x.ended - x.launched for x in self.launches.values()
                 if x.pid not in start_pids and x.ended is not None and x.returncode == 0]  # fmt: skip
        # "One poll": a slot's tick plus one refused attempt (p99 of this round).
        r.takeover_bound = ttl + renew_interval(ttl) + self.cfg.tick + (checkers.percentile(skips, 99) or 0.5)
        for inj in r.injections:
            self._takeover(inj, h)
            if inj.fault is Fault.KILL_SUPERVISOR:
                self._after_kill_supervisor(inj, h)
            elif inj.fault is Fault.KILL_CHILD:
                self._after_kill_child(inj, h)
            elif inj.fault is Fault.PAUSE_SHORT:
                self._after_short_pause(inj, h)
            elif inj.fault in PAUSES:
                self._after_long_pause(inj, h)
        self._stop_margins(h)

    def _takeover(self, inj: Injection, h: History) -> None:
        """(e) after a kill: the first start of another run, from the kill."""
        r = self.result
        nxt = next((e for e in h.started if e.at > inj.wall and e.run_id != inj.target_run), None)
        if inj.fault not in KILLS or nxt is None:
            return
        took = nxt.at - inj.wall
        r.takeover.add(took)
        if took > r.takeover_bound:
            r.takeover_over_bound.append(f"{inj.fault} at {inj.wall:.3f}: next start {took:.2f}s later")

    def _after_kill_supervisor(self, inj: Injection, h: History) -> None:
        """G5: the child dies with its supervisor; the run is found abandoned."""
        r = self.result
        died = h.closes.get(inj.target_run or "")
        if died is None or died - inj.at > 1.0:
            late = "?" if died is None else f"{died - inj.at:.2f}s"
            r.violations["h"].append(
                f"(h) the child of killed supervisor {inj.supervisor} outlived it by {late}"
            )
        else:
            r.orphan.add(max(0.0, died - inj.at))
        outcome = h.outcome(inj)
        if outcome is not Outcome.ABANDONED:
            r.expectations.append(f"kill -9 of {inj.target_run}'s supervisor: recorded {outcome}, "
                                  "expected abandoned")  # fmt: skip

    def _after_kill_child(self, inj: Injection, h: History) -> None:
        outcome, code = h.outcome(inj), h.exit(inj)
        if outcome is not Outcome.FAILED or code != 128 + signal.SIGKILL:
            self.result.expectations.append(f"kill -9 of {inj.target_run}'s child: recorded {outcome}, "
                                            f"exit {code}, expected failed and 137")  # fmt: skip

    def _after_short_pause(self, inj: Injection, h: History) -> None:
        """A 0.5×ttl pause should not cost the lease. When it does, say whether
        the pause ended before the holder's belief did (last renewal +
        belief(ttl)), the supervisor's deadline for a renewal that is only
        late: after it, stopping is the design; before it (by 0.1×ttl, the
        time for the thawed heartbeat to renew), it is a bug. The watcher's
        last reading before the pause dates the last renewal no later than it
        happened, so "within" is certain."""
        r, ttl = self.result, self.cfg.ttl
        outcome = h.outcome(inj)
        if outcome is Outcome.SUCCEEDED:
            r.lease_kept += 1
            return
        r.lease_lost += 1
        stop_after = belief(ttl) / ttl
        renewed = self._last_renewal(inj.target_run, inj.at)
        if renewed is None or inj.resumed is None:
            r.expectations.append(f"0.5×ttl pause of {inj.target_run}: recorded {outcome} (no renewal seen)")
            return
        ended = (inj.resumed - renewed) / ttl
        within = ended + 0.1 < stop_after
        r.lost_within_budget += within
        r.expectations.append(
            f"0.5×ttl pause of {inj.target_run}: recorded {outcome}, exit {h.exit(inj)}; the pause ended "
            f"{ended:.2f}×ttl after the last renewal, {'within' if within else 'past'} the belief's end "
            f"{stop_after:.2f}×ttl"
        )

    def _after_long_pause(self, inj: Injection, h: History) -> None:
        """The frozen holder must lose the lease; whatever it does after the
        thaw must be refused by the referee (or, without fencing, show up as a
        violation: the positive control)."""
        r = self.result
        if inj.took_over is None:
            r.expectations.append(f"{inj.fault} of {inj.target_run}: nobody took over while it was frozen")
        else:
            after = self._first_op(h.log, inj.took_over)
            late = [e for e in h.log if e.get("run") == inj.target_run and e["op"] in ("read", "write")
                    and e["t"] > after]  # fmt: skip
            r.late_rejected += sum(1 for e in late if not e["ok"])
            if self.cfg.fenced and late and all(e["ok"] for e in late):
                r.expectations.append(f"{inj.fault}: late operations of {inj.target_run} were accepted")
        if not self.cfg.fenced and any(inj.target_run in v for k in "abc" for v in r.violations[k]):
            r.control_hits += 1
        outcome, code = h.outcome(inj), h.exit(inj)
        if code != EXIT_LEASE_LOST or outcome not in (Outcome.LEASE_LOST, Outcome.ABANDONED):
            r.expectations.append(f"{inj.fault} of {inj.target_run}: recorded {outcome}, exit {code}, "
                                  "expected lease_lost or abandoned, and 3")  # fmt: skip

    def _stop_margins(self, h: History) -> None:
        """(f) Every holder that lost its lease while not frozen itself: the
        end of its work (the child's connection closing at the referee)
        against the lease's expiry in the store (the watcher's readings give
        a lower bound, so the margin measured is a lower bound too)."""
        r = self.result
        frozen = {i.target_run for i in r.injections if i.fault in PAUSES}
        expiry: dict[str, float] = {}
        for sent, owner, _token, expires_in in self.watch:
            expiry[owner] = max(expiry.get(owner, -math.inf), sent + expires_in)
        for run_id, rec in h.runs.items():
            if rec is None or run_id in frozen or not self._stopped_for_lease_loss(rec, h):
                continue
            r.stopped_for_lease_loss += 1
            died, exp = h.closes.get(run_id), expiry.get(run_id)
            if died is None or exp is None:
                continue
            r.margin.add(exp - died)
            if exp < died:
                r.violations["h"].append(f"(f) run {run_id} worked {died - exp:.3f}s past its lease's expiry")

    @staticmethod
    def _stopped_for_lease_loss(rec: RunRecord, h: History) -> bool:
        """Its supervisor stopped the command because the lease was gone.
        Recorded ``lease_lost``, or ``abandoned`` with the supervisor alive
        to the end (exit 3, or 75 when it could not record): after a frozen
        store thaws, the holder's own record and the next run's acquire,
        both held up in it, race; when the acquire wins, it records the
        holder abandoned (its lease had expired) and the holder's record
        finds the run already ended."""
        if rec.outcome is Outcome.LEASE_LOST:
            return True
        launch = h.launches.get(rec.pid) if rec.pid is not None else None
        return (rec.outcome is Outcome.ABANDONED and launch is not None
                and launch.returncode in (EXIT_LEASE_LOST, EXIT_STORE))  # fmt: skip

    def _last_renewal(self, run: str | None, before: float) -> float | None:
        """Monotonic time of the run's last renewal (or grant) seen by the
        watcher before ``before``, dated no later than it happened."""
        ttl = self.cfg.ttl
        seen = [sent + expires_in - ttl for sent, owner, _t, expires_in in self.watch
                if owner == run and sent < before]  # fmt: skip
        return max(seen, default=None)

    @staticmethod
    def _first_op(log: list[dict[str, Any]], run: str) -> float:
        return next((e["t"] for e in log if e.get("run") == run and e["op"] in ("read", "write")), 0.0)


@dataclass
class History:
    """What one round recorded, indexed for the measurements."""

    log: list[dict[str, Any]]
    runs: dict[str, RunRecord | None]
    launches: dict[int, Launch]
    started: list[Event]
    closes: dict[str, float]

    def outcome(self, inj: Injection) -> Outcome | None:
        rec = self.runs.get(inj.target_run or "")
        return None if rec is None else rec.outcome

    def exit(self, inj: Injection) -> int | None:
        launch = self.launches.get(inj.supervisor or 0)
        return None if launch is None else launch.returncode


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent, grandparent, … up to init."""
    out = []
    while (parent := parent_of(pid)) not in (None, 0, 1):
        assert parent is not None
        out.append(parent)
        pid = parent
    return out


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def run_round(backend: Backend, config: RoundConfig) -> RoundResult:
    return Round(backend, config).run()


# -- the table -------------------------------------------------------------------

COLUMNS = ("store", "fault", "fence", "cycles", "faults", "a", "b", "c", "d", "g", "h", "takeover p50/p99 s",
           "margin p50/min ×ttl", "outcomes")  # fmt: skip


def table(results: list[RoundResult]) -> str:
    """One line per (store, fault, fencing), summed over rounds."""
    groups: dict[tuple[str, str, bool], list[RoundResult]] = {}
    for r in results:
        groups.setdefault((r.store, r.config.fault.value, r.config.fenced), []).append(r)
    rows = [COLUMNS]
    for (store, fault, fenced), rs in groups.items():
        take, margin = Distribution(), Distribution()
        outcomes: Counter[str] = Counter()
        for r in rs:
            take.extend(r.takeover)
            margin.values.extend(m / r.config.ttl for m in r.margin.values)
            outcomes.update(r.outcomes)
        p50, p99 = take.p(50), take.p(99)
        m50 = margin.p(50)
        rows.append((
            store, fault, "on" if fenced else "OFF", str(sum(r.cycles for r in rs)),
            str(sum(len(r.injections) for r in rs)),
            *(str(sum(len(r.violations.get(k, [])) for r in rs)) for k in "abcdgh"),
            "-" if p50 is None or p99 is None else f"{p50:.2f}/{p99:.2f}",
            "-" if m50 is None else f"{m50:.2f}/{min(margin.values):.2f}",
            " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)

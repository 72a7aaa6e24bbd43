"""``cronwarden run --job x --store URL -- true`` end to end, a real process
each time, against a minimal Python process that imports the same driver and
does one lease acquire+release on the same kind of store.

Targets (issues 2 and 3), measured in the same run:

- SQLite: at most 1.5x a process that imports sqlite3 and runs the bare lease
  row (``INSERT … ON CONFLICT … RETURNING``, then the release ``UPDATE``) on a
  file with the store's settings (WAL, synchronous=FULL).
- Redis: at most 1.3x a process that imports redis-py and does ``SET NX PX``
  + a Lua compare-and-delete.
- PostgreSQL: at most 1.3x a process that imports psycopg, connects, and
  runs the bare lease row's ``INSERT … ON CONFLICT`` + ``UPDATE``.

Reference rows: the bare interpreter (``python -c pass``), and the floor
process that also starts ``true`` and waits for it (``cronwarden run`` runs
its command; the floor does not), so the child's share of the gap shows.
Every process is timed from spawn to exit with ``subprocess.run``; the
candidates of a store run in interleaved rounds (``comparison.py``). The
``cronwarden`` console script next to this interpreter is used, not a shim
on PATH (a pyenv shim adds tens of milliseconds of shell).

Bytecode: every process runs with ``PYTHONPYCACHEPREFIX`` set to a cache in
the bench's temporary directory (filled by the warm-up runs) and without
``PYTHONDONTWRITEBYTECODE``, as an installed wheel runs (pip compiles it at
install). An editable install under ``PYTHONDONTWRITEBYTECODE=1`` (this
sandbox sets it) compiles every cronwarden module from source on every tick;
a reference row measures that, with the environment as given.

Then ``python -X importtime -m cronwarden run …`` for each store: the
modules with the largest self and cumulative import times (median over
runs), so a regression in the wrapper's import graph is visible.

    python bench/run_startup.py                      # sqlite, redis, postgres: 1-2 minutes
    python bench/run_startup.py --quick              # a few seconds
    python bench/run_startup.py --store sqlite       # one backend
"""

from __future__ import annotations

import argparse
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

from comparison import Candidate, children_cpu, interleave, print_footer, print_header, print_table, rows
from postgres_lease import POSTGRES_URL, floor_sql
from redis_lease import COMPARE_AND_DELETE, REDIS_URL
from sqlite_guard import FLOOR_ACQUIRE, FLOOR_RELEASE, FLOOR_TABLE, TTL

TARGETS = {"sqlite": 1.5, "redis": 1.3, "postgres": 1.3}

# The floors: each imports its driver and does one acquire+release, nothing
# else. ``--spawn-true`` also starts ``true`` and waits for it.
SPAWN = """
if len(sys.argv) > {n} and sys.argv[{n}] == "--spawn-true":
    os.waitpid(os.posix_spawn(sys.argv[{m}], ["true"], os.environ), 0)
"""
SQLITE_FLOOR = f"""import os, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5.0)
db.execute("PRAGMA busy_timeout = 5000")
db.execute("PRAGMA journal_mode = WAL")
db.execute("PRAGMA synchronous = FULL")
owner = os.urandom(16).hex()
now = time.clock_gettime(time.CLOCK_BOOTTIME)
if db.execute({FLOOR_ACQUIRE!r}, ("floor", owner, now, {TTL!r})).fetchone() is None:
    sys.exit(1)
db.execute({FLOOR_RELEASE!r}, ("floor", owner))
db.close()
{SPAWN.format(n=2, m=3)}"""
REDIS_FLOOR = f"""import os, sys
import redis
client = redis.Redis.from_url(sys.argv[1])
owner = os.urandom(16).hex()
if not client.set(sys.argv[2], owner, nx=True, px={int(TTL * 1000)}):
    sys.exit(1)
client.register_script({COMPARE_AND_DELETE!r})(keys=[sys.argv[2]], args=[owner])
client.close()
{SPAWN.format(n=3, m=4)}"""
POSTGRES_FLOOR = """import os, sys
import psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    owner = os.urandom(16).hex()
    if conn.execute({acquire!r}, ("floor", owner, {ttl!r})).fetchone() is None:
        sys.exit(1)
    conn.execute({release!r}, ("floor", owner))
{spawn}"""


@dataclass
class Backend:
    name: str
    store_url: str
    floor: list[str]
    """argv of the floor process (before ``--spawn-true``)."""
    cleanup: list[str]


def sqlite_backend(workdir: str) -> Backend:
    import sqlite3

    floor_db = os.path.join(workdir, "floor.db")
    db = sqlite3.connect(floor_db, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(FLOOR_TABLE)
    db.close()
    script = os.path.join(workdir, "sqlite_floor.py")
    with open(script, "w") as f:
        f.write(SQLITE_FLOOR)
    return Backend("sqlite", f"sqlite:///{os.path.join(workdir, 'store.db')}", [script, floor_db], [])


def redis_backend(workdir: str, tag: str) -> Backend:
    prefix = f"cw-bench-startup-{tag}:"
    script = os.path.join(workdir, "redis_floor.py")
    with open(script, "w") as f:
        f.write(REDIS_FLOOR)
    sep = "&" if "?" in REDIS_URL else "?"
    return Backend(
        "redis", f"{REDIS_URL}{sep}prefix={prefix}", [script, REDIS_URL, f"{prefix}floor"], [prefix]
    )


def postgres_backend(workdir: str, tag: str) -> Backend:
    import psycopg

    schema, floor_schema = f"cw_bench_startup_{tag}", f"cw_bench_startup_{tag}_floor"
    table, acquire, release = floor_sql(f'"{floor_schema}"')
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{floor_schema}"')
        conn.execute(table)
    script = os.path.join(workdir, "postgres_floor.py")
    with open(script, "w") as f:
        f.write(
            POSTGRES_FLOOR.format(acquire=acquire, release=release, ttl=TTL, spawn=SPAWN.format(n=2, m=3))
        )
    sep = "&" if "?" in POSTGRES_URL else "?"
    return Backend(
        "postgres", f"{POSTGRES_URL}{sep}schema={schema}", [script, POSTGRES_URL], [schema, floor_schema]
    )


def remove_fixtures(backend: Backend) -> None:
    if backend.name == "redis":
        from redis_lease import cleanup

        for prefix in backend.cleanup:
            cleanup(prefix)
    elif backend.name == "postgres":
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for schema in backend.cleanup:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def process(argv: list[str], env: dict[str, str], cwd: str) -> None:
    done = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)  # fmt: skip
    if done.returncode != 0:
        again = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {again.stderr.strip()[-2000:]}")


def console_script() -> str:
    script = os.path.join(os.path.dirname(sys.executable), "cronwarden")
    if os.path.exists(script):
        return script
    found = shutil.which("cronwarden")
    if found is None:
        raise SystemExit("no cronwarden console script: pip install -e . first")
    return found


def cached(env: dict[str, str], workdir: str) -> dict[str, str]:
    """``env`` with a bytecode cache, as an installed package has."""
    out = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    return out


def without_site(env: dict[str, str]) -> dict[str, str]:
    """``env`` for ``python -S``: site-packages and cronwarden's source on
    PYTHONPATH, so nothing a ``.pth`` file imports is loaded."""
    import cronwarden

    src = os.path.dirname(os.path.dirname(cronwarden.__file__))
    paths = [src, *site.getsitepackages()]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def compare(backend: Backend, cronwarden: str, env: dict[str, str], workdir: str, quick: bool,
            budget: float, interpreter: bool, clean: bool) -> None:  # fmt: skip
    started = time.monotonic()
    true = shutil.which("true") or "/bin/true"
    with_cache = cached(env, workdir)
    py = [sys.executable]
    if clean:
        py.append("-S")
        with_cache = without_site(with_cache)
        # the console script's own code, run by ``python -S`` instead of its shebang
        cronwarden_argv = [*py, cronwarden]
    else:
        cronwarden_argv = [cronwarden]

    def run(argv: list[str], env: dict[str, str] = with_cache) -> Candidate:
        name = " ".join(os.path.basename(a) if a.startswith(workdir) else a for a in argv)
        return Candidate(name, lambda: process(argv, env, workdir), cpu_clock=children_cpu)

    floor = run([*py, *backend.floor])
    floor.name = f"floor: python + {backend.name} driver, one acquire+release"
    child = run([*py, *backend.floor, "--spawn-true", true])
    child.name, child.note = "floor + start `true` and wait", "reference: cronwarden runs its command"
    wrapper_argv = [*cronwarden_argv, "run", "--job", "x", "--store", backend.store_url, "--", "true"]
    wrapper = run(wrapper_argv)
    wrapper.name, wrapper.target = (
        f"cronwarden run --job x --store {backend.name}://… -- true",
        TARGETS[backend.name],
    )
    # A job that declares itself (a schedule): the run also reads the job's
    # saved settings, and writes them only after an edit.
    declared = run([*cronwarden_argv, "run", "--job", "declared", "--every", "10m", "--store",
                    backend.store_url, "--", "true"])  # fmt: skip
    declared.name = f"cronwarden run --job declared --every 10m --store {backend.name}://… -- true"
    declared.note = "reference: a job with a schedule"
    others = [wrapper] if quick else [child, wrapper, declared]
    if env.get("PYTHONDONTWRITEBYTECODE") and not clean and not quick:
        raw = run(wrapper_argv, env)
        raw.name = "the same, PYTHONDONTWRITEBYTECODE=1, no cache"
        raw.note = "reference: this shell's environment"
        others.append(raw)
    if interpreter and not quick:
        bare = run([*py, "-c", "pass"])
        bare.name, bare.note = f"python {'-S ' if clean else ''}-c pass", "reference: the interpreter"
        others.insert(0, bare)
    n = interleave(floor, others, per_block=1, min_rounds=2 if quick else 10, budget=budget, warmup=2)
    how = (
        "python -S, site-packages on PYTHONPATH: no .pth file runs, as on a host without this sandbox's"
        if clean
        else "python as installed here, site and its .pth files included"
    )
    print_table(
        f"{backend.name}: one process, spawn to exit ({how})", rows(floor, others, scale=1e3, unit="ms")
    )
    print_footer(n, started)


def importtime(backend: Backend, env: dict[str, str], workdir: str, runs: int, top: int) -> None:
    """Median self and cumulative import time per module over ``runs``
    processes of ``python -X importtime -m cronwarden run``."""
    argv = [sys.executable, "-S", "-X", "importtime", "-m", "cronwarden", "run", "--job", "x", "--store",
            backend.store_url, "--", "true"]  # fmt: skip
    self_us: dict[str, list[int]] = defaultdict(list)
    cumulative_us: dict[str, list[int]] = defaultdict(list)
    totals = []
    for _ in range(runs):
        done = subprocess.run(argv, env=env, cwd=workdir, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        total = 0
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            own, cumulative, name = line.removeprefix("import time:").split("|", 2)
            self_us[name.strip()].append(int(own))
            cumulative_us[name.strip()].append(int(cumulative))
            total += int(own)
        totals.append(total)
    med = {
        name: (statistics.median(v), statistics.median(cumulative_us[name])) for name, v in self_us.items()
    }
    ours = sum(1 for name in med if name.startswith("cronwarden"))
    print(f"\n{backend.name}: python -S -X importtime -m cronwarden run --store {backend.name}://… -- true "
          f"(median of {runs}): {len(med)} modules ({ours} cronwarden), "
          f"{statistics.median(totals) / 1000:.1f} ms of imports in all")  # fmt: skip
    by_self = sorted(med.items(), key=lambda kv: -kv[1][0])[:top]
    by_cumulative = sorted(med.items(), key=lambda kv: -kv[1][1])[:top]
    width = max(len(name) for name, _ in by_self + by_cumulative)
    print(f"  {'top by self':<{width}}  {'self µs':>8}  {'cumul µs':>9}    {'top by cumulative':<{width}}  "
          f"{'cumul µs':>9}  {'self µs':>8}")  # fmt: skip
    for (a, (a_self, a_cum)), (b, (b_self, b_cum)) in zip(by_self, by_cumulative, strict=True):
        print(f"  {a:<{width}}  {a_self:>8.0f}  {a_cum:>9.0f}    {b:<{width}}  {b_cum:>9.0f}  {b_self:>8.0f}")


def unavailable(name: str) -> str | None:
    if name == "redis":
        from redis_lease import unavailable as why
    elif name == "postgres":
        from postgres_lease import unavailable as why
    else:
        return None
    return why()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few seconds (CI smoke run)")
    ap.add_argument("--store", choices=["sqlite", "redis", "postgres", "all"], default="all")
    ap.add_argument("--budget", type=float, help="seconds of interleaved rounds per store")
    ap.add_argument("--importtime-runs", type=int, help="processes per store for -X importtime (median)")
    ap.add_argument("--top", type=int, default=12, help="modules shown by self and by cumulative time")
    ap.add_argument(
        "--site",
        choices=["as-is", "clean", "both"],
        help="run the processes with site as "
        "installed here, with python -S (no .pth files), or both (default both; --quick: as-is)",
    )
    args = ap.parse_args()
    sites = {"as-is": [False], "clean": [True], "both": [False, True]}[
        args.site or ("as-is" if args.quick else "both")
    ]
    names = ["sqlite", "redis", "postgres"] if args.store == "all" else [args.store]
    budget = args.budget if args.budget is not None else (1.0 if args.quick else 8.0)
    runs = args.importtime_runs or (1 if args.quick else 7)
    cronwarden = console_script()
    workdir = tempfile.mkdtemp(prefix="cw-bench-startup-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env["XDG_STATE_HOME"] = workdir  # no default store, no ./cronwarden.toml (cwd is workdir)
    tag = uuid.uuid4().hex[:10]
    print_header(f"cronwarden run end to end vs a minimal python process ({cronwarden})")
    backends: list[Backend] = []
    try:
        for name in names:
            why = unavailable(name)
            if why:
                print(f"\nskipping {name}: {why}")
                continue
            if name == "sqlite":
                backend = sqlite_backend(workdir)
            elif name == "redis":
                backend = redis_backend(workdir, tag)
            else:
                backend = postgres_backend(workdir, tag)
            backends.append(backend)
            for clean in sites:
                compare(backend, cronwarden, env, workdir, args.quick, budget, name == names[0], clean)
        for backend in backends:
            importtime(backend, without_site(cached(env, workdir)), workdir, runs, args.top)
    finally:
        for backend in backends:
            remove_fixtures(backend)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

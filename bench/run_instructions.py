"""Instructions per cron tick: ``python -m cronwarden run --job x --store URL
-- true`` under ``valgrind --tool=callgrind``, for this tree and for a
baseline git ref, with their ratio against the redesign's budget (≤ 1.10×).

Instruction counts (callgrind's ``Ir``) do not move with what else the
machine is doing, so a 10 % budget can be judged on a shared two-core host
where wall-clock timings of a 0.1 s process cannot. What the count leaves
out is time spent waiting (disk, server, scheduling) and the kernel's own
work: ``run_startup.py`` is the wall-clock view.

What is measured, per variant (store, and with or without a config file):

- **supervisor**: the ``python -m cronwarden run`` process, from exec to
  exit, all its threads (the heartbeat's too): interpreter start-up,
  imports, argument and config parsing, the store's connect, acquire and
  finish, starting and reaping the command. Its ratio is the verdict.
- **keeper**: the supervisor's fork that starts the command and reaps it,
  counted from the fork on (``--zero-before=PyOS_AfterFork_Child``; a
  forked child otherwise inherits its parent's counts). Shown for reference.
- ``true`` is exec'd and not traced (``--trace-children=no``).
- reference row: ``python -c pass`` with the same interpreter and
  environment, the part of a tick that is the interpreter's alone.

Each tree is taken from its own checkout in a temporary directory (``git
archive`` of a ref; for this tree, a copy of the working tree's ``src/``,
uncommitted changes included) and put first on ``PYTHONPATH``; the bench
checks that ``import cronwarden`` resolves there. Every process runs the
real interpreter binary (not a pyenv shim: valgrind would trace the shell),
with ``PYTHONHASHSEED=0``, bytecode compiled once into a cache
(``PYTHONPYCACHEPREFIX``; this sandbox's ``PYTHONDONTWRITEBYTECODE`` and every
other ``PYTHON*``/``CRONWARDEN_*`` variable dropped), in an empty working
directory. Each measured tick is the second on a fresh store (a fresh SQLite
file, PostgreSQL schema or Redis key prefix): an untraced tick first creates
the schema and leaves one run in the ledger, as on a host where the job has
run before. Per variant and tree, one untraced and one traced warm-up tick
come first; then ``--runs`` rounds, each measuring every variant and tree,
the trees' order alternating.

valgrind 3.19 has no ``pidfd_open`` (ENOSYS). A tree whose supervisor has
no fallback for that (the default baseline, ``6a799f1``) dies under
valgrind, so it is measured with the fallback applied: the diff to
``src/cronwarden/supervisor.py`` of the commit that introduced it (found by
``git log -S _exit_descriptor``, or ``--fallback COMMIT``), and the output
says so.

    python bench/run_instructions.py                        # sqlite, 5 rounds: under a minute
    python bench/run_instructions.py --store all --config   # 6 variants: ~7 minutes
    python bench/run_instructions.py --against REF --runs 3 --out DIR

``--out DIR`` keeps the callgrind files (``callgrind_annotate`` reads them) to
find where a difference comes from. Servers: ``$CRONWARDEN_TEST_POSTGRES``
(default ``postgresql://postgres@127.0.0.1:5432/test``) and
``$CRONWARDEN_TEST_REDIS`` (default ``redis://127.0.0.1:6379/0``); schemas
``cw_bench_*`` and key prefixes ``cw-bench-*``, removed at the end. A variant
whose server is missing is skipped, with the reason.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "6a799f1"
"""main before the house redesign."""
BUDGET = 1.10
"""The redesign's budget: current Ir at most this times the baseline's."""
SUPERVISOR = "src/cronwarden/supervisor.py"
FALLBACK_MARK = "_exit_descriptor"
"""A name the pidfd fallback added to ``supervisor.py``; ``git log -S`` finds
the commit that added it."""
POSTGRES_URL = os.environ.get("CRONWARDEN_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CRONWARDEN_TEST_REDIS", "redis://127.0.0.1:6379/0")
STORES = ("sqlite", "redis", "postgres")
JOB = "x"
CONFIG = f"""\
# A job as a crontab line would name it: schedule, policy and its reason.
[jobs.{JOB}]
schedule = "*/10 * * * *"
policy = "skip"
reason = "one run works through everything pending; a second would repeat it"
ttl = "10m"
"""
TRACED_TIMEOUT = 600


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class Tree:
    """One side of the comparison: a checkout and how it was made."""

    side: str
    """"baseline" or "current"."""
    what: str
    src: Path
    """Put first on ``PYTHONPATH``."""
    patched: str = ""
    """The commit whose supervisor.py diff was applied, if any."""


def fallback_commit(given: str | None) -> str:
    if given:
        return git("rev-parse", "--verify", f"{given}^{{commit}}")
    found = git("log", "--reverse", "--format=%H", "-S", FALLBACK_MARK, "--", SUPERVISOR).split()
    if not found:
        sys.exit(f"run_instructions: no commit adds {FALLBACK_MARK} to {SUPERVISOR}; give --fallback COMMIT")
    return found[0]


def has_commit(commit: str, ref: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", commit, ref], cwd=ROOT).returncode == 0


def apply_fallback(tree: Tree, commit: str) -> None:
    """Apply ``commit``'s change to supervisor.py (and nothing else) to the
    checkout: a tree without it cannot run under valgrind."""
    patch = git("diff", f"{commit}^", commit, "--", SUPERVISOR) + "\n"
    checkout = tree.src.parent
    # Its own repository, so git apply patches paths relative to it even when
    # the temporary directory lies inside another repository.
    git("init", "-q", cwd=checkout)
    done = subprocess.run(["git", "apply", "-"], cwd=checkout, input=patch, text=True, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"run_instructions: the pidfd fallback ({commit[:7]}) does not apply to {tree.what}: "
                 f"{done.stderr.strip()}")  # fmt: skip
    tree.patched = commit


def checkout_ref(ref: str, dest: Path, side: str) -> Tree:
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return Tree(side, f"{ref} ({commit[:7]}, git archive)", dest / "src")


def checkout_working_tree(dest: Path) -> Tree:
    """A copy of the working tree's ``src/``: tracked and untracked files that
    git does not ignore, as they are on disk."""
    listed = git("ls-files", "-co", "--exclude-standard", "-z", "src").split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    head = git("rev-parse", "--short", "HEAD")
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--", "src") else ""
    return Tree("current", f"working tree {ROOT} (HEAD {head}{dirty})", dest / "src")


def real_interpreter(given: str) -> str:
    """The interpreter binary itself: valgrind on a pyenv shim (a shell
    script) would measure bash."""
    path = shutil.which(given) or given
    with open(path, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return path
    resolved = subprocess.run([path, "-c", "import sys; print(sys.executable)"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    with open(resolved, "rb") as f:
        if f.read(4) != b"\x7fELF":
            sys.exit(f"run_instructions: {given} resolves to {resolved}, which is not an ELF binary")
    return resolved


@dataclass(frozen=True)
class Variant:
    store: str
    config: bool

    @property
    def name(self) -> str:
        return self.store + (" + config" if self.config else "")


class Stores:
    """Fresh store URLs, one per tick pair, and their removal."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.schemas: list[str] = []
        self.prefixes: list[str] = []

    def why_not(self, store: str) -> str | None:
        try:
            if store == "postgres":
                import psycopg

                with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
                    conn.execute("SELECT 1")
            elif store == "redis":
                import redis

                client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
                try:
                    client.ping()
                finally:
                    client.close()
        except Exception as e:
            return f"{store}: server not reachable ({type(e).__name__}: {str(e).strip()[:120]})"
        return None

    def fresh(self, store: str) -> str:
        unique = uuid.uuid4().hex[:12]
        if store == "sqlite":
            return f"sqlite:///{self.tmp / f'{unique}.db'}"
        if store == "postgres":
            self.schemas.append(f"cw_bench_{unique}")
            return f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={self.schemas[-1]}"
        self.prefixes.append(f"cw-bench-{unique}:")
        return f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={self.prefixes[-1]}"

    def remove(self) -> None:
        if self.schemas:
            import psycopg
            from psycopg import sql

            with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
                for schema in self.schemas:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        if self.prefixes:
            import redis

            client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
            try:
                for prefix in self.prefixes:
                    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                    for i in range(0, len(keys), 500):
                        client.delete(*keys[i : i + 500])
            finally:
                client.close()


@dataclass
class Counts:
    supervisor: list[int] = field(default_factory=list)
    keeper: list[int] = field(default_factory=list)


class Bench:
    def __init__(self, python: str, tmp: Path, out: Path | None) -> None:
        self.python = python
        self.tmp = tmp
        self.out = out
        self.cwd = tmp / "cwd"
        self.cwd.mkdir()
        self.config = tmp / "cronwarden.toml"
        self.config.write_text(CONFIG)
        self.stores = Stores(tmp)
        self.pycache = tmp / "pycache"
        self._count = 0

    def env(self, tree: Tree | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CRONWARDEN_"))}
        env.update(PYTHONHASHSEED="0", PYTHONPYCACHEPREFIX=str(self.pycache))
        if tree is not None:
            env["PYTHONPATH"] = str(tree.src)
        return env

    def tick(self, variant: Variant, url: str) -> list[str]:
        config = ["--config", str(self.config)] if variant.config else []
        return ["-m", "cronwarden", "run", *config, "--job", JOB, "--store", url, "--", "true"]

    def check_import(self, tree: Tree) -> None:
        where = subprocess.run([self.python, "-c", "import cronwarden; print(cronwarden.__file__)"],
                               env=self.env(tree), cwd=self.cwd, capture_output=True, text=True)  # fmt: skip
        if not where.stdout.strip().startswith(str(tree.src)):
            sys.exit(f"run_instructions: {tree.side}'s import cronwarden resolves to "
                     f"{where.stdout.strip() or where.stderr.strip()}, not {tree.src}")  # fmt: skip

    def untraced(self, tree: Tree, variant: Variant, url: str) -> None:
        done = subprocess.run([self.python, *self.tick(variant, url)], env=self.env(tree), cwd=self.cwd,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"run_instructions: {tree.side} {variant.name}: untraced tick exited "
                     f"{done.returncode}:\n{done.stderr[-2000:]}")  # fmt: skip

    def traced(self, tree: Tree | None, args: list[str], what: str) -> tuple[int, int | None]:
        """Run ``python ARGS`` under callgrind: the Ir of that process and of
        the one it forked (the keeper), if any."""
        self._count += 1
        dest = (self.out or self.tmp / "callgrind") / f"{self._count:03d}-{re.sub(r'[^a-z0-9]+', '-', what)}"
        dest.mkdir(parents=True)
        cmd = ["valgrind", "--tool=callgrind", "--zero-before=PyOS_AfterFork_Child",
               f"--callgrind-out-file={dest}/callgrind.out.%p", f"--log-file={dest}/valgrind.%p.log",
               self.python, *args]  # fmt: skip
        proc = subprocess.Popen(cmd, env=self.env(tree), cwd=self.cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        _, err = proc.communicate(timeout=TRACED_TIMEOUT)
        if proc.returncode != 0 or "Traceback" in err:
            logs = "".join(p.read_text() for p in dest.glob("valgrind.*.log"))
            sys.exit(f"run_instructions: {what} under callgrind exited {proc.returncode}:\n{err[-2000:]}\n"
                     f"{logs[-2000:]}")  # fmt: skip
        # valgrind runs the program in its own process: the pid Popen started.
        counts = {int(p.name.rsplit(".", 1)[1]): ir(p) for p in dest.glob("callgrind.out.*")}
        parents = {int(m[1]): int(m[2]) for p in dest.glob("valgrind.*.log")
                   if (m := re.search(r"==(\d+)== Parent PID: (\d+)", p.read_text()))}  # fmt: skip
        keepers = [pid for pid in counts if parents.get(pid) == proc.pid]
        if len(keepers) > 1 or len(counts) > 1 + len(keepers):
            sys.exit(f"run_instructions: {what}: unexpected traced processes {counts} (parents {parents})")
        if self.out is None:
            shutil.rmtree(dest)
        return counts[proc.pid], counts[keepers[0]] if keepers else None

    def measure(self, tree: Tree, variant: Variant, counts: Counts | None) -> None:
        """One tick: an untraced tick on a fresh store, then the traced one."""
        url = self.stores.fresh(variant.store)
        self.untraced(tree, variant, url)
        supervisor, keeper = self.traced(tree, self.tick(variant, url), f"{tree.side} {variant.name}")
        if keeper is None:
            sys.exit(f"run_instructions: {tree.side} {variant.name}: no keeper process was traced")
        if counts is not None:
            counts.supervisor.append(supervisor)
            counts.keeper.append(keeper)


def ir(path: Path) -> int:
    """The total Ir of a callgrind output file."""
    found = re.search(r"^(?:totals|summary): (\d+)", path.read_text(), re.M)
    if found is None:
        sys.exit(f"run_instructions: no totals in {path}")
    return int(found[1])


def spread(values: list[int]) -> float:
    """(max − min) / median: how far apart the runs of one tree are."""
    return (max(values) - min(values)) / statistics.median(values)


def n(value: float) -> str:
    return f"{value:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--against", default=BASELINE, metavar="REF", help=f"baseline git ref (default {BASELINE})"
    )
    p.add_argument("--current", metavar="REF", help="measure this ref instead of the working tree")
    p.add_argument("--store", default="sqlite", choices=[*STORES, "all"])
    p.add_argument(
        "--config",
        action="store_true",
        help="also each store with a cronwarden.toml (a job with schedule, policy and reason)",
    )
    p.add_argument("--runs", type=int, default=5, help="measured ticks per variant and tree (default 5)")
    p.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    p.add_argument(
        "--fallback",
        metavar="COMMIT",
        help=f"the commit whose {SUPERVISOR} diff is the pidfd fallback (default: git log -S)",
    )
    p.add_argument("--out", type=Path, help="keep the callgrind files here")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("run_instructions: valgrind is not installed")
    if args.runs < 1:
        sys.exit("run_instructions: --runs must be at least 1")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"run_instructions: --out {args.out} is not empty")
    python = real_interpreter(args.python)
    stores = STORES if args.store == "all" else (args.store,)
    fallback = fallback_commit(args.fallback)

    with tempfile.TemporaryDirectory(prefix="cw-bench-ir-") as tmp_name:
        tmp = Path(tmp_name)
        bench = Bench(python, tmp, args.out)
        baseline = checkout_ref(args.against, tmp / "trees" / "b", "baseline")
        if args.current:
            current = checkout_ref(args.current, tmp / "trees" / "c", "current")
        else:
            current = checkout_working_tree(tmp / "trees" / "c")
        for tree, ref in ((baseline, args.against), (current, args.current or "HEAD")):
            if not has_commit(fallback, ref):
                apply_fallback(tree, fallback)
            bench.check_import(tree)
        variants = []
        for store in stores:
            why = bench.stores.why_not(store)
            if why is not None:
                print(f"skipped: {why}")
                continue
            variants += [Variant(store, False), *([Variant(store, True)] if args.config else [])]
        if not variants:
            return
        try:
            run(bench, baseline, current, variants, args.runs)
        finally:
            bench.stores.remove()


def run(bench: Bench, baseline: Tree, current: Tree, variants: list[Variant], runs: int) -> None:
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}, bench at {git('rev-parse', '--short', 'HEAD')}")
    print(f"cron tick: python -m cronwarden run [--config cronwarden.toml] --job {JOB} --store URL -- true")
    print(f"interpreter: {bench.python}; {version} --tool=callgrind; PYTHONHASHSEED=0, bytecode cached")
    for tree in (baseline, current):
        note = (f"; with the pidfd fallback of {tree.patched[:7]} applied to {SUPERVISOR} "
                "(valgrind has no pidfd_open; without it the run dies)") if tree.patched else ""  # fmt: skip
        print(f"{tree.side}: {tree.what}{note}")
    print(
        f"{runs} measured ticks per variant and tree, after one untraced and one traced warm-up; "
        "each on a fresh store after an untraced first tick"
    )
    print()
    counts = {(t.side, v): Counts() for t in (baseline, current) for v in variants}
    for variant in variants:
        for tree in (baseline, current):
            bench.untraced(tree, variant, bench.stores.fresh(variant.store))  # compiles the bytecode
            bench.measure(tree, variant, None)
    bare: list[int] = []
    for i in range(runs):
        for variant in variants:
            for tree in (baseline, current) if i % 2 == 0 else (current, baseline):
                bench.measure(tree, variant, counts[tree.side, variant])
        bare.append(bench.traced(None, ["-c", "pass"], "python -c pass")[0])

    print("per process, median Ir of the runs (spread: (max - min) / median)")
    print(f"{'variant':<20} {'tree':<9} {'supervisor Ir':>15} {'spread':>8} {'keeper Ir':>12} {'spread':>8}")
    for variant in variants:
        for tree in (baseline, current):
            c = counts[tree.side, variant]
            print(f"{variant.name:<20} {tree.side:<9} {n(statistics.median(c.supervisor)):>15} "
                  f"{spread(c.supervisor):>8.4%} {n(statistics.median(c.keeper)):>12} "
                  f"{spread(c.keeper):>8.4%}")  # fmt: skip
    print(f"{'python -c pass':<20} {'-':<9} {n(statistics.median(bare)):>15} {spread(bare):>8.4%}")
    print()
    print("supervisor (the cronwarden run process, the per-tick cost); keeper for reference")
    print(f"{'variant':<20} {'baseline Ir':>15} {'current Ir':>15} {'ratio':>8} {'keeper ratio':>13} "
          f"{'own ratio':>10}  verdict (≤ {BUDGET:.2f})")  # fmt: skip
    base_bare = statistics.median(bare)
    for variant in variants:
        before = statistics.median(counts["baseline", variant].supervisor)
        after = statistics.median(counts["current", variant].supervisor)
        keeper = statistics.median(counts["current", variant].keeper) / statistics.median(
            counts["baseline", variant].keeper
        )
        own = (after - base_bare) / (before - base_bare)
        ratio = after / before
        verdict = "met" if ratio <= BUDGET else "NOT met"
        print(f"{variant.name:<20} {n(before):>15} {n(after):>15} {ratio:>8.4f} {keeper:>13.4f} "
              f"{own:>10.4f}  {verdict}")  # fmt: skip
    print()
    print(
        "keeper: the fork that starts and reaps the command, counted from the fork. own ratio: "
        "(Ir - python -c pass) after / before, cronwarden's share without the interpreter's start-up."
    )


if __name__ == "__main__":
    main()

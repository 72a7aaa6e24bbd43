"""Runs a document's code blocks, in document order, against a temporary store.

One ``DocSession`` per document: a fresh directory that is the working
directory, ``HOME`` and the parent of ``XDG_STATE_HOME`` of every block, with
``CRONWARDEN_STORE`` a SQLite file in it, so a later block sees an earlier
one's files and ledger and nothing touches the user's own state. A block
that names ``{postgres}`` or ``{redis}`` (or is SQL) gets a PostgreSQL schema
or Redis key prefix of the document's own, removed by ``close``.

Every process a block starts gets a process group of its own, which is
killed when the block is done, so nothing a block left running outlives it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.docs.blocks import Block, Document

DEFAULT_TIMEOUT = 30.0
"""Seconds a block (or, in a cron or runs-for block, each line) may take."""
STOP_TIMEOUT = 15.0
"""Seconds a runs-for daemon may take to exit after SIGTERM."""
CRON_PATH = "/usr/bin:/bin"
"""cron's own PATH (a cron line names cronwarden by its absolute path)."""
CRONWARDEN_PATH = "/usr/local/bin/cronwarden"
"""Where a cron example says cronwarden is: replaced by the one under test."""
_CRON_SPECIALS = {"@reboot", "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_CRON_ENV = re.compile(r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.*)$")


@dataclass
class Outcome:
    ok: bool
    message: str = ""
    unavailable: str | None = None
    """Why the block could not run here: a server it needs is absent."""


class Unavailable(Exception):
    """A server the block needs is absent."""


class BlockError(Exception):
    """The block's annotations do not fit its text."""


@dataclass
class Servers:
    """Where the test servers are, and a probe saying why one is absent."""

    postgres: str
    redis: str
    why_not: Callable[[str], str | None]


def with_param(url: str, name: str, value: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


def cronwarden_command() -> Path:
    """The ``cronwarden`` of the environment under test: beside its python
    (a virtualenv), else in its scripts directory (a system install)."""
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (directory / "cronwarden").is_file():
            return directory / "cronwarden"
    found = shutil.which("cronwarden")
    if found is None:
        raise AssertionError(f"no cronwarden command for {sys.executable}: pip install -e '.[dev]'")
    return Path(found)


class DocSession:
    def __init__(self, doc: Document, directory: Path, servers: Servers) -> None:
        self.doc = doc
        self.dir = directory
        self.servers = servers
        unique = uuid.uuid4().hex[:12]
        self.schema = f"cw_doc_{unique}"
        self.prefix = f"cw_doc_{unique}:"
        self._postgres_used = False
        self._redis_used = False
        self._scratch = directory / ".doc-test"
        self._scratch.mkdir(parents=True, exist_ok=True)
        self.results: dict[int, Outcome] = {}
        bin_dir = str(cronwarden_command().parent)
        state = directory / ".local" / "state"
        # The store is where cronwarden looks by default under this HOME, so a
        # cron line (which gets no CRONWARDEN_STORE) writes the same ledger.
        self.store = state / "cronwarden" / "cronwarden.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
        env.update(
            HOME=str(directory),
            XDG_STATE_HOME=str(state),
            CRONWARDEN_STORE=f"sqlite:///{self.store}",
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', CRON_PATH)}",
            PYTHONUSERBASE=site.getuserbase(),  # HOME moved: keep a --user install importable
        )
        self.env = env
        self.cron_env = {  # what cron gives a command, and no more
            "HOME": str(directory),
            "LOGNAME": env.get("LOGNAME", env.get("USER", "")),
            "PATH": CRON_PATH,  # as cron's: a bare `cronwarden` is not found, as under a real cron
            "SHELL": "/bin/sh",
            "PYTHONUSERBASE": env["PYTHONUSERBASE"],
        }

    # -- the document, in order --------------------------------------------

    def run(self, block: Block) -> Outcome:
        """Runs every earlier block not run yet, then this one."""
        failed_before = []
        for earlier in self.doc.blocks:
            if earlier.start == block.start:
                break
            outcome = self._outcome(earlier)
            if not outcome.ok and outcome.unavailable is None:
                failed_before.append(earlier.id)
        outcome = self._outcome(block)
        if not outcome.ok and failed_before:
            why = f"\n(an earlier block of this document failed too: {', '.join(failed_before)})"
            return Outcome(ok=False, message=outcome.message + why, unavailable=outcome.unavailable)
        return outcome

    def _outcome(self, block: Block) -> Outcome:
        if block.start not in self.results:
            self.results[block.start] = self._run(block)
        return self.results[block.start]

    def _run(self, block: Block) -> Outcome:
        if block.problems or block.directives.skip or block.kind is None:
            return Outcome(ok=not block.problems, message="; ".join(block.problems))
        try:
            text, env = self._prepare(block)
            runner = getattr(self, f"_run_{block.kind}")
            outcome: Outcome = runner(block, text, env)
        except Unavailable as e:
            return Outcome(ok=False, unavailable=str(e))
        except BlockError as e:
            return Outcome(ok=False, message=f"{block.id}: {e}")
        return outcome

    def close(self) -> None:
        if self._postgres_used:
            import psycopg
            from psycopg import sql

            with psycopg.connect(self.servers.postgres, connect_timeout=5, autocommit=True) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        if self._redis_used:
            import redis

            client = redis.Redis.from_url(self.servers.redis, socket_connect_timeout=5)
            try:
                keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
                if keys:
                    client.delete(*keys)
            finally:
                client.close()

    # -- substitutions -----------------------------------------------------

    def postgres_url(self) -> str:
        why = self.servers.why_not("postgres")
        if why:
            raise Unavailable(why)
        url = with_param(self.servers.postgres, "schema", self.schema)
        if not self._postgres_used:
            from cronwarden import open_store

            open_store(url).close()  # the store's tables, as a user's first command creates them
            self._postgres_used = True
        return url

    def redis_url(self) -> str:
        why = self.servers.why_not("redis")
        if why:
            raise Unavailable(why)
        self._redis_used = True
        return with_param(self.servers.redis, "prefix", self.prefix)

    def postgres_dsn(self) -> str:
        """The server's URL for a user's own connection (psycopg, psql):
        no store parameters, the document's schema as its search_path."""
        self.postgres_url()
        return with_param(self.servers.postgres, "options", f"-csearch_path%3D{self.schema}")

    def _fill(self, value: str) -> str:
        if "{postgres_dsn}" in value:
            value = value.replace("{postgres_dsn}", self.postgres_dsn())
        if "{redis_dsn}" in value:
            self.redis_url()
            value = value.replace("{redis_dsn}", self.servers.redis)
        if "{prefix}" in value:
            self.redis_url()
            value = value.replace("{prefix}", self.prefix)
        if "{postgres}" in value:
            value = value.replace("{postgres}", self.postgres_url())
        if "{redis}" in value:
            value = value.replace("{redis}", self.redis_url())
        if "{schema}" in value:
            self.postgres_url()
            value = value.replace("{schema}", self.schema)
        return value.replace("{dir}", str(self.dir))

    def _prepare(self, block: Block) -> tuple[str, dict[str, str]]:
        """The block's text after its replacements and stand-ins, and its
        environment."""
        d = block.directives
        text = block.text
        for old, new in d.replace:
            if old not in text:
                raise BlockError(f"replace {old!r}: not in the block")
            text = text.replace(old, self._fill(new))
        for path in d.stand_ins:
            if path not in text:
                raise BlockError(f"stand-in {path!r}: not in the block")
            # An absolute path is made in the directory and replaced; ./NAME is made there as it is.
            stand_in = self.dir / ("stand-ins" + path if path.startswith("/") else path)
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text(f'#!/bin/sh\necho "{path} (a stand-in) ran: $*"\n')
            stand_in.chmod(0o755)
            if path.startswith("/"):
                text = text.replace(path, str(stand_in))
        env = {name: self._fill(value) for name, value in d.env}
        return text, env

    # -- one kind each -----------------------------------------------------

    def _script(self, block: Block, suffix: str, text: str) -> Path:
        path = self._scratch / f"{block.start}-{block.end}{suffix}"
        path.write_text(text)
        return path

    def _write_file(self, block: Block, text: str) -> Outcome:
        assert block.directives.file is not None
        path = self.dir / block.directives.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if text.startswith("#!"):
            path.chmod(0o755)
        return Outcome(ok=True)

    def _run_python(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        if block.directives.file:
            return self._write_file(block, text)
        script = self._script(block, ".py", text)
        return self._expect(block, [sys.executable, str(script)], env)

    def _run_toml(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        name = block.directives.file or "cronwarden.toml"
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return self._expect(block, [str(cronwarden_command()), "config", "check", "--config", name], env)

    def _run_sh(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        d = block.directives
        if d.file:
            return self._write_file(block, text)
        if d.runs_for is None:
            script = self._script(block, ".sh", text)
            return self._expect(block, ["bash", "-e", str(script)], env)
        said: list[str] = []
        for line in logical_lines(text):
            outcome = self._daemon(block, line, env)
            if not outcome.ok:
                return outcome
            said.append(outcome.message)
        return Outcome(ok=True, message="".join(said))

    def _run_cron(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        from cronsim import CronSim, CronSimError

        cron_env = {**self.cron_env, **env}
        text = text.replace(CRONWARDEN_PATH, str(cronwarden_command()))
        said: list[str] = []
        for number, line in enumerate(text.splitlines(), start=block.start + 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            assignment = _CRON_ENV.match(line)
            if assignment:
                cron_env[assignment["name"]] = assignment["value"].strip().strip("\"'")
                continue
            fields = line.split(None, 1 if line.lstrip().startswith("@") else 5)
            if len(fields) < (2 if line.lstrip().startswith("@") else 6):
                return Outcome(ok=False, message=f"{block.doc}:{number}: not a crontab line: {line!r}")
            *when, command = fields
            if when[0].startswith("@"):
                if when[0] not in _CRON_SPECIALS:
                    return Outcome(ok=False, message=f"{block.doc}:{number}: unknown schedule {when[0]!r}")
            else:
                try:
                    next(CronSim(" ".join(when), datetime.now()))
                except (CronSimError, StopIteration) as e:
                    return Outcome(
                        ok=False, message=f"{block.doc}:{number}: bad schedule {' '.join(when)!r}: {e}"
                    )
            if re.search(r"(?<!\\)%", command):
                return Outcome(
                    ok=False,
                    message=f"{block.doc}:{number}: cron turns an unescaped % into a newline: write \\%",
                )
            outcome = self._expect(block, ["/bin/sh", "-c", command], {}, base=cron_env, where=number)
            if not outcome.ok:
                return outcome
            said.append(outcome.message)
        return Outcome(ok=True, message="".join(said))

    def _run_console(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        steps = transcript(text)
        if not steps or not steps[0][0]:
            return Outcome(ok=False, message=f"{block.id}: a console block starts with '$ COMMAND'")
        mark = f"__doc_test_{uuid.uuid4().hex}"
        lines = ["exec 2>&1"]
        for command, _ in steps:
            lines.append(command)
            lines.append(f'__s=$?; printf "\\n%s %s\\n" {mark} "$__s"; (exit "$__s")')
        script = self._script(block, ".console.sh", "\n".join(lines) + "\n")
        status, output = self._spawn(["bash", str(script)], {**env, "PYTHONUNBUFFERED": "1"})
        if status is None:
            return Outcome(
                ok=False, message=f"{block.id}: did not end within {self._timeout(block):g}s\n{output}"
            )
        pieces = re.split(rf"\n{mark} (-?\d+)\n", output)
        said, statuses = pieces[0::2], pieces[1::2]
        for k, (command, expected) in enumerate(steps):
            if k >= len(statuses):
                return Outcome(ok=False, message=f"{block.id}: stopped before $ {command}\n{output}")
            actual = said[k]
            if int(statuses[k]) != 0 and not (k + 1 < len(steps) and steps[k + 1][0].strip() == "echo $?"):
                return Outcome(
                    ok=False,
                    message=f"{block.id}: $ {command}\nexited {statuses[k]} (show it with a following "
                    f"'$ echo $?' line)\n{actual}",
                )
            if not output_matches(expected, actual.splitlines()):
                return Outcome(
                    ok=False,
                    message=f"{block.id}: $ {command}\n--- the document shows:\n"
                    + "\n".join(expected)
                    + f"\n--- it printed:\n{actual}",
                )
        return Outcome(ok=True)

    def _run_sql(self, block: Block, text: str, env: dict[str, str]) -> Outcome:
        import psycopg
        from psycopg import sql

        self.postgres_url()
        try:
            with psycopg.connect(self.servers.postgres, connect_timeout=5) as conn:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
                conn.execute(text.encode())
        except psycopg.Error as e:
            return Outcome(ok=False, message=f"{block.id}: {type(e).__name__}: {e}")
        return Outcome(ok=True)

    # -- processes ---------------------------------------------------------

    def _timeout(self, block: Block) -> float:
        return block.directives.timeout or DEFAULT_TIMEOUT

    def _spawn(
        self, argv: list[str], env: dict[str, str], *, base: dict[str, str] | None = None, timeout: float = 0
    ) -> tuple[int | None, str]:
        """Runs ``argv`` in the document's directory, in a process group of
        its own that is killed afterwards; (status or None on timeout, output)."""
        proc = subprocess.Popen(
            argv,
            cwd=self.dir,
            env={**(base or self.env), **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout or DEFAULT_TIMEOUT)
            status: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            output, _ = proc.communicate()
            status = None
        finally:
            _kill_group(proc.pid)
        return status, output

    def _expect(
        self,
        block: Block,
        argv: list[str],
        env: dict[str, str],
        *,
        base: dict[str, str] | None = None,
        where: int | None = None,
    ) -> Outcome:
        status, output = self._spawn(argv, env, base=base, timeout=self._timeout(block))
        place = f"{block.doc}:{where}" if where else block.id
        shown = " ".join(argv[2:] if argv[0] == "/bin/sh" else argv)
        if status is None:
            return Outcome(
                ok=False, message=f"{place}: {shown}: did not end within {self._timeout(block):g}s\n{output}"
            )
        if status != block.directives.exit:
            expected = block.directives.exit
            return Outcome(
                ok=False,
                message=f"{place}: {shown}: exit status {status}, expected {expected}"
                + (" (declare another with <!-- doc-test: exit=N -->)" if expected == 0 else "")
                + f"\n{output}",
            )
        return Outcome(ok=True, message=output)

    def _daemon(self, block: Block, line: str, env: dict[str, str]) -> Outcome:
        """``line`` must still run after runs-for, then exit as declared on SIGTERM."""
        d = block.directives
        assert d.runs_for is not None
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {line}"],
            cwd=self.dir,
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            try:
                output, _ = proc.communicate(timeout=d.runs_for)
            except subprocess.TimeoutExpired:
                pass
            else:
                return Outcome(
                    ok=False,
                    message=f"{block.id}: {line}: exited {proc.returncode} "
                    f"before runs-for={d.runs_for:g}s\n{output}",
                )
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                output, _ = proc.communicate()
                return Outcome(
                    ok=False,
                    message=f"{block.id}: {line}: still running {STOP_TIMEOUT:g}s after SIGTERM\n{output}",
                )
            if proc.returncode != d.exit:
                status = (
                    f"killed by {signal.Signals(-proc.returncode).name}"
                    if proc.returncode < 0
                    else f"exit status {proc.returncode} after SIGTERM"
                )
                return Outcome(
                    ok=False,
                    message=f"{block.id}: {line}: {status}, expected exit status {d.exit}\n{output}",
                )
            return Outcome(ok=True, message=output)
        finally:
            _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def logical_lines(text: str) -> list[str]:
    """Command lines of a shell block: continuations joined, blank and comment lines dropped."""
    lines: list[str] = []
    current = ""
    for line in text.splitlines():
        if current:
            current += " " + line.strip()
        else:
            current = line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current and not current.startswith("#"):
            lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def transcript(text: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the output lines shown after it). Lines
    before the first ``$ `` come back as a step with an empty command."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued:
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
        elif line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            steps.append(("", [line]))
        continued = line.endswith("\\") and (continued or line.startswith("$ "))
    return steps


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line, trailing blanks ignored; ``...`` in a line matches any
    text, a line that is only ``...`` any number of lines."""
    expected = _trim(expected)
    actual = _trim(actual)
    if not expected:
        return not actual
    head = expected[0]
    if head.strip() == "...":
        return any(output_matches(expected[1:], actual[k:]) for k in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".*".join(re.escape(part) for part in head.rstrip().split("..."))
    return re.fullmatch(pattern, actual[0].rstrip()) is not None and output_matches(expected[1:], actual[1:])


def _trim(lines: list[str]) -> list[str]:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]

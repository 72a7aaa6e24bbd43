"""Every example in README.md and docs/**/*.md runs, as written, in a test.

Each fenced code block is a test case named by its lines (``README.md:72-87``).
The blocks of one document run in document order in one temporary directory
(the working directory and ``HOME``), with ``CRONWARDEN_STORE`` a fresh
SQLite file there (cronwarden's default location under that ``HOME``), so a
later block can use an earlier one's files and ledger.

How each language is run:

- ``python``: a script, with this interpreter;
- ``sh`` (``bash``, ``shell``): ``bash -e``; the block must exit 0;
- ``console``: ``$ COMMAND`` lines are run in one bash, and what each prints
  (stdout and stderr) must be the lines shown under it; ``...`` matches any
  text in a line, a line of only ``...`` any lines; a command may fail only
  if the next one is ``$ echo $?``;
- ``toml``: written to ``cronwarden.toml`` (or ``file=``) and checked with
  ``cronwarden config check``;
- ``cron``: each line's command, after the five time fields, runs as cron
  runs it (``/bin/sh -c``, only cron's environment: its short PATH with the
  cronwarden under test first); the schedule must parse and the command hold
  no bare ``%``;
- ``sql``: on the PostgreSQL test server, in a schema of the test's, after a
  cronwarden store has created its tables there;
- ``text``, ``json``, ``diff``: read only, not run. A fence with no language,
  or one not listed, fails: say what it is.

Annotations: HTML comments directly above the fence, ``;`` between
directives::

    <!-- doc-test: skip (output of the command above) -->
    <!-- doc-test: file=bad.toml; exit=2 -->
    <!-- doc-test: runs-for=2s -->            each line a daemon: alive after 2s, exits 0 on SIGTERM
    <!-- doc-test: stand-in /opt/bin/reconcile -->      the path becomes a script that exits 0
    <!-- doc-test: replace OLD => NEW -->      NEW may name {postgres}, {redis}, {schema}, {dir}
    <!-- doc-test: env NAME=VALUE; timeout=60s -->

An unknown directive, a skip without a reason, or an annotation not directly
above a fence fails. The whole convention is in ``tests/docs/README.md``.

The second half of this module tests the runner itself: that an example that
is wrong fails.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import POSTGRES_URL, REDIS_URL, BackendProbe, unavailable
from tests.docs.blocks import Block, Document, parse_document
from tests.docs.runner import DocSession, Servers, cronwarden_command, output_matches, transcript

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))]
PARSED = {doc: parse_document(doc, (ROOT / doc).read_text()) for doc in DOCS}
BLOCKS = [block for doc in DOCS for block in PARSED[doc].blocks if block.tested]


class Sessions:
    """One ``DocSession`` per document, made on first use."""

    def __init__(self, factory: pytest.TempPathFactory, servers: Servers) -> None:
        self.factory = factory
        self.servers = servers
        self.open: dict[str, DocSession] = {}

    def of(self, doc: str) -> DocSession:
        if doc not in self.open:
            directory = self.factory.mktemp(re.sub(r"[^A-Za-z0-9]+", "-", doc))
            self.open[doc] = DocSession(PARSED[doc], directory, self.servers)
        return self.open[doc]


@pytest.fixture(scope="session")
def sessions(tmp_path_factory: pytest.TempPathFactory, backend_probe: BackendProbe) -> Iterator[Sessions]:
    servers = Servers(postgres=POSTGRES_URL, redis=REDIS_URL, why_not=backend_probe.why_not)
    made = Sessions(tmp_path_factory, servers)
    yield made
    for session in made.open.values():
        session.close()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_example_runs_as_written(block: Block, sessions: Sessions) -> None:
    if block.problems:
        pytest.fail(f"{block.id}: " + "; ".join(block.problems), pytrace=False)
    if block.directives.skip:
        pytest.skip(f"{block.id}: {block.directives.skip}")
    outcome = sessions.of(block.doc).run(block)
    if outcome.unavailable:
        unavailable(f"{block.id}: {outcome.unavailable}")
    if not outcome.ok:
        pytest.fail(outcome.message, pytrace=False)


@pytest.mark.parametrize("doc", DOCS)
def test_every_annotation_is_directly_above_a_fence(doc: str) -> None:
    assert PARSED[doc].problems == []


# -- docs speak to users -----------------------------------------------------

INTERNAL = re.compile(
    r"\bG[1-9]\b|\bG[1-9]\s*[–-]\s*G?[1-9]\b|\bthe seeds?\b|\bseed's\b|\bseed incident\b|\bthe brief\b|"
    r"\bdesign brief\b|\bDESIGN(?:\.md| §| G)|\bissue\s*#?\d+|\bsession\s*#?\d+",
    re.IGNORECASE,
)
"""Names a reader cannot look up: the guarantee numbers of the design, the
incident write-ups and the tracker the project was built from."""


@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_nothing_a_user_cannot_look_up(doc: str) -> None:
    found = [
        f"{doc}:{number}: {m.group(0)!r} in: {line.strip()}"
        for number, line in enumerate((ROOT / doc).read_text().splitlines(), start=1)
        for m in INTERNAL.finditer(line)
    ]
    assert found == [], "say it in words:\n" + "\n".join(found)


def _commands() -> list[str]:
    """The commands ``cronwarden --help`` lists."""
    out = subprocess.run([str(cronwarden_command()), "--help"], capture_output=True, text=True).stdout
    listed = out.partition("commands:")[2].split("\n\n")[0]
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def test_help_names_nothing_a_user_cannot_look_up() -> None:
    commands = _commands()
    assert "run" in commands
    found = []
    for argv in [["--help"], *([command, "--help"] for command in commands)]:
        out = subprocess.run([str(cronwarden_command()), *argv], capture_output=True, text=True).stdout
        found += [
            f"cronwarden {' '.join(argv)}: {line.strip()}"
            for line in out.splitlines()
            if INTERNAL.search(line)
        ]
    assert found == [], "say it in words:\n" + "\n".join(found)


# -- the runner itself ---------------------------------------------------------


def _session(tmp_path: Path, markdown: str) -> tuple[Document, DocSession]:
    doc = parse_document("example.md", markdown)
    servers = Servers(
        postgres=POSTGRES_URL, redis=REDIS_URL, why_not=lambda name: f"{name}: not in these tests"
    )
    return doc, DocSession(doc, tmp_path, servers)


def _outcomes(tmp_path: Path, markdown: str) -> list[tuple[bool, str]]:
    doc, session = _session(tmp_path, markdown)
    results = []
    for block in doc.blocks:
        outcome = session.run(block)
        results.append((outcome.ok, outcome.message))
    return results


def fence(lang: str, body: str, *notes: str) -> str:
    return "".join(f"<!-- doc-test: {n} -->\n" for n in notes) + f"```{lang}\n{body}```\n\n"


def test_a_python_example_that_raises_fails(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("python", "raise SystemExit('no such thing')\n"))
    assert not ok
    assert "exit status 1, expected 0" in message
    assert "no such thing" in message


def test_a_shell_example_stops_at_its_first_failing_command(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("sh", "false\ntouch reached\n"))
    assert not ok
    assert "exit status 1, expected 0" in message
    assert not (tmp_path / "reached").exists()


def test_a_declared_exit_status_must_be_the_one_seen(tmp_path: Path) -> None:
    results = _outcomes(tmp_path, fence("sh", "exit 3\n", "exit=3") + fence("sh", "true\n", "exit=1"))
    assert [ok for ok, _ in results] == [True, False]
    assert "exit status 0, expected 1" in results[1][1]


def test_a_later_block_sees_an_earlier_blocks_files_and_ledger(tmp_path: Path) -> None:
    markdown = fence("sh", "echo hello > greeting\ncronwarden run --job first -- true\n") + fence(
        "sh", 'test "$(cat greeting)" = hello\ncronwarden history first | grep -q succeeded\n'
    )
    assert [ok for ok, _ in _outcomes(tmp_path, markdown)] == [True, True]
    assert (tmp_path / ".local" / "state" / "cronwarden" / "cronwarden.db").exists()


def test_a_cron_line_gets_crons_environment_and_writes_the_documents_ledger(tmp_path: Path) -> None:
    markdown = fence(
        "cron", "* * * * *  env > cron-env; /usr/local/bin/cronwarden run --job nightly -- true\n"
    ) + fence("sh", "cronwarden history nightly | grep -q succeeded\n")
    assert [ok for ok, _ in _outcomes(tmp_path, markdown)] == [True, True]
    names = {line.split("=", 1)[0] for line in (tmp_path / "cron-env").read_text().splitlines()}
    assert "CRONWARDEN_STORE" not in names
    assert {"HOME", "PATH", "SHELL"} <= names


def test_a_replacement_that_is_not_in_the_block_fails(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("sh", "true\n", "replace /etc/cronwarden.toml => x"))
    assert not ok
    assert "replace '/etc/cronwarden.toml': not in the block" in message


def test_a_toml_example_with_a_mistake_fails_config_check(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("toml", '[jobs.x]\nevery = "10m"\ntll = "2m"\n'))
    assert not ok
    assert "unknown key 'tll'" in message


def test_a_toml_example_is_written_where_its_annotation_says(tmp_path: Path) -> None:
    [(ok, _)] = _outcomes(tmp_path, fence("toml", '[jobs.x]\nevery = "10m"\n', "file=conf/jobs.toml"))
    assert ok
    assert (tmp_path / "conf" / "jobs.toml").read_text() == '[jobs.x]\nevery = "10m"\n'


def test_a_cron_line_runs_its_command_with_crons_path(tmp_path: Path) -> None:
    markdown = fence("cron", "*/10 * * * *  echo $PATH > path-seen\n")
    assert [ok for ok, _ in _outcomes(tmp_path, markdown)] == [True]
    assert (tmp_path / "path-seen").read_text().strip() == "/usr/bin:/bin"


def test_a_cron_line_with_a_bare_cronwarden_fails_as_under_cron(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("cron", "* * * * *  cronwarden run --job x -- true\n"))
    assert not ok
    assert "not found" in message


def test_a_cron_line_with_a_bad_schedule_or_a_bare_percent_fails(tmp_path: Path) -> None:
    markdown = fence("cron", "61 * * * *  true\n") + fence("cron", "0 * * * *  date +%F\n")
    results = _outcomes(tmp_path, markdown)
    assert [ok for ok, _ in results] == [False, False]
    assert "bad schedule '61 * * * *'" in results[0][1]
    assert "unescaped %" in results[1][1]


def test_a_console_example_must_print_what_it_shows(tmp_path: Path) -> None:
    good = "$ echo one; echo two >&2\none\ntwo\n$ sh -c 'exit 4'\n$ echo $?\n4\n"
    wrong = "$ echo three\nfour\n"
    results = _outcomes(tmp_path, fence("console", good) + fence("console", wrong))
    assert [ok for ok, _ in results] == [True, False]
    assert "--- it printed:\nthree" in results[1][1]


def test_a_console_command_may_fail_only_when_its_status_is_shown(tmp_path: Path) -> None:
    [(ok, message)] = _outcomes(tmp_path, fence("console", "$ false\n$ echo done\ndone\n"))
    assert not ok
    assert "exited 1" in message


def test_output_ellipses_match_text_in_a_line_and_whole_lines() -> None:
    assert output_matches(["run ... ended", "...", "last"], ["run 5c1e ended", "a", "b", "last"])
    assert output_matches(["...", "last"], ["last"])
    assert not output_matches(["run ... ended"], ["run 5c1e ended", "extra"])
    assert not output_matches(["a"], ["b"])


def test_console_commands_continue_over_backslashes() -> None:
    assert transcript("$ echo a \\\n  b\na b\n$ true\n") == [("echo a \\\n  b", ["a b"]), ("true", [])]


def test_a_daemon_must_outlive_runs_for_and_exit_cleanly_on_sigterm(tmp_path: Path) -> None:
    clean = "sh -c 'trap \"exit 0\" TERM; while :; do sleep 0.05; done'\n"
    markdown = (
        fence("sh", clean, "runs-for=200ms")
        + fence("sh", "true\n", "runs-for=2s")
        + fence("sh", "sleep 30\n", "runs-for=200ms")
    )
    results = _outcomes(tmp_path, markdown)
    assert [ok for ok, _ in results] == [True, False, False]
    assert "exited 0 before runs-for=2s" in results[1][1]
    assert "killed by SIGTERM, expected exit status 0" in results[2][1]


def test_a_stand_in_replaces_the_path_it_names(tmp_path: Path) -> None:
    markdown = fence("sh", "/opt/bin/reconcile --full > said\n", "stand-in /opt/bin/reconcile")
    assert [ok for ok, _ in _outcomes(tmp_path, markdown)] == [True]
    assert (tmp_path / "said").read_text() == "/opt/bin/reconcile (a stand-in) ran: --full\n"


def test_a_block_needing_an_absent_server_is_unavailable_not_passed(tmp_path: Path) -> None:
    doc, session = _session(tmp_path, fence("sh", "echo STORE\n", "replace STORE => {postgres}"))
    outcome = session.run(doc.blocks[0])
    assert not outcome.ok
    assert outcome.unavailable == "postgres: not in these tests"


def test_server_placeholders_get_a_schema_and_a_prefix_of_their_own_removed_afterwards(
    tmp_path: Path, backend_probe: BackendProbe
) -> None:
    for name in ("postgres", "redis"):
        why = backend_probe.why_not(name)
        if why:
            unavailable(why)
    import psycopg
    import redis

    body = "cronwarden run --store 'PG' --job pg -- true\ncronwarden run --store 'RD' --job rd -- true\n"
    doc = parse_document("example.md", fence("sh", body, "replace PG => {postgres}; replace RD => {redis}"))
    session = DocSession(doc, tmp_path, Servers(POSTGRES_URL, REDIS_URL, backend_probe.why_not))
    client = redis.Redis.from_url(REDIS_URL)
    schema_query = "SELECT count(*) FROM pg_namespace WHERE nspname = %s"
    try:
        outcome = session.run(doc.blocks[0])
        assert outcome.ok, outcome.message
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            assert conn.execute(schema_query, [session.schema]).fetchone() == (1,)
        assert list(client.scan_iter(match=f"{session.prefix}*"))
        session.close()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            assert conn.execute(schema_query, [session.schema]).fetchone() == (0,)
        assert list(client.scan_iter(match=f"{session.prefix}*")) == []
    finally:
        session.close()
        client.close()


def test_unknown_directives_missing_reasons_and_bare_fences_are_problems() -> None:
    doc = parse_document(
        "example.md",
        fence("sh", "true\n", "skpi (typo)")
        + fence("sh", "true\n", "skip ()")
        + fence("", "a diagram\n")
        + fence("yaml", "a: 1\n")
        + fence("console", "$ true\n", "exit=1")
        + fence("sh", "$ cronwarden status\n"),
    )
    problems = [b.problems for b in doc.blocks]
    assert "unknown directive 'skpi'" in problems[0][0]
    assert "skip needs a reason" in problems[1][0]
    assert "names no language" in problems[2][0]
    assert "language 'yaml' is neither runnable" in problems[3][0]
    assert problems[4] == ["exit does not apply to a console block"]
    assert "holds a prompt" in problems[5][0]
    assert all(b.tested for b in doc.blocks)


def test_a_skip_with_a_reason_is_no_problem_and_text_is_not_tested() -> None:
    doc = parse_document(
        "example.md", fence("sh", "rm -rf /\n", "skip (what not to do)") + fence("text", "output\n")
    )
    assert [b.problems for b in doc.blocks] == [[], []]
    assert doc.blocks[0].directives.skip == "what not to do"
    assert [b.tested for b in doc.blocks] == [True, False]


def test_an_annotation_away_from_a_fence_is_a_problem() -> None:
    doc = parse_document(
        "example.md", "<!-- doc-test: skip (x) -->\n\n```sh\ntrue\n```\n<!-- doc-test: exit=1 -->\n"
    )
    assert doc.problems == [
        "example.md:1: annotation is not directly above a fence (line 2 comes between)",
        "example.md:6: annotation is not directly above a fence (end of file)",
    ]
    assert doc.blocks[0].directives.skip is None


def test_a_misspelt_annotation_and_an_open_fence_are_problems() -> None:
    doc = parse_document("example.md", "<!-- doctest: skip (x) -->\n```sh\ntrue\n")
    assert doc.problems == [
        "example.md:1: malformed annotation; expected <!-- doc-test: DIRECTIVE; … -->",
        "example.md:2: fence is never closed",
    ]


def test_an_indented_fence_in_a_list_is_a_block_with_its_indent_removed() -> None:
    doc = parse_document("example.md", "- step:\n\n  ```sh\n  echo hi\n  ```\n")
    assert [(b.start, b.end, b.lang, b.text) for b in doc.blocks] == [(3, 5, "sh", "echo hi\n")]

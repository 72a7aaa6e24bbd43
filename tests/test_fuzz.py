"""Fuzzing as a habit: property-based targets (hypothesis) for the config
reader and the command-line parser, bounded in time for CI. Whatever the
input, the answer is problems or a ``UsageError`` (one line, exit 2), never
another exception: no traceback reaches an operator."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronwarden import cli
from cronwarden.cli import run
from cronwarden.cli.args import parse_plain
from cronwarden.config import read
from cronwarden.errors import CronwardenError

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

KEYS = ["store", "retention", "keep_runs", "defaults", "jobs", "sinks", "ttl", "every", "schedule", "policy",
        "reason", "grace", "max_runtime", "shards", "command", "timezone", "max_pending"]  # fmt: skip
VALUES = st.one_of(
    st.text(max_size=20).map(lambda t: '"' + t.replace("\\", "\\\\").replace('"', '\\"') + '"'),
    st.integers(-(2**70), 2**70).map(str), st.floats(allow_nan=True).map(str), st.sampled_from(
        ["true", "[]", "{}", '"90d"', '"0s"', '"1e30s"', '"redis://:pw@h/0?prefix="', '["a", 1]', "[[[[1]]]]"]
    ),
)  # fmt: skip
LINE = st.one_of(
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from(KEYS), VALUES),
    st.sampled_from(["[defaults]", "[jobs.a]", '[jobs."b c"]', "[sinks.hook]", "[[jobs]]", "[jobs.a.b]"]),
    st.text(max_size=30),
)


@FUZZ
@given(lines=st.lists(LINE, max_size=12))
def test_the_config_reader_answers_problems_never_an_exception(tmp_path: Path, lines: list[str]) -> None:
    path = tmp_path / "cronwarden.toml"
    path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    read(str(path), environ={})  # raises nothing: every problem is in the result


WORDS = st.one_of(
    st.sampled_from([*run.FLAGS, "--", "-h", "--ttl=1ms", "--slot=1e30", "--job=x", "true", "=", "-"]),
    st.text(max_size=12),
)


@FUZZ
@given(argv=st.lists(WORDS, max_size=10))
def test_the_run_command_line_is_read_or_refused_in_one_line(argv: list[str]) -> None:
    try:
        parse_plain(run.FLAGS, argv)
        cli.command_parser("run").parse_args(argv)
    except CronwardenError:
        pass
    except SystemExit as e:  # --help prints and exits 0
        assert e.code == 0


OTHER_WORDS = ["--store", "--token", "--retention", "--keep-runs", "--dry-run", "check", "show", "--listen",
               "0.0.0.0:1", "1"]  # fmt: skip


@pytest.mark.parametrize("command", ["prune", "config", "status", "dashboard", "monitor"])
@FUZZ
@given(argv=st.lists(st.one_of(st.sampled_from(OTHER_WORDS), st.text(max_size=10)), max_size=6))
def test_other_command_lines_are_read_or_refused_in_one_line(command: str, argv: list[str]) -> None:
    try:
        cli.command_parser(command).parse_args(argv)
    except CronwardenError:
        pass
    except SystemExit as e:
        assert e.code == 0

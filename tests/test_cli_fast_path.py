"""The per-tick shortcut of ``cronwarden run``: its plain command lines are
read without argparse (``cli.args.parse_plain``), which must be invisible:
the same parsed flags, errors, exit statuses and ledger. And a finished
run's process ends as every Python process does (``cli.console``), with its
exit hooks run and its output flushed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronwarden import cli
from cronwarden.cli import run
from cronwarden.cli.args import parse_plain
from cronwarden.errors import UsageError
from cronwarden.events import EventKind, Outcome
from cronwarden.stores import open_store
from cronwarden.stores.base import EventQuery


def by_argparse(argv: list[str]) -> dict[str, Any] | str:
    """What argparse makes of ``argv``: the flags, or its error."""
    try:
        return vars(cli.command_parser("run").parse_args(argv))
    except UsageError as e:
        return f"error: {e}"


def plain(argv: list[str]) -> dict[str, Any] | None:
    ns = parse_plain(run.FLAGS, argv)
    return None if ns is None else vars(ns)


CMD = ["--", "./job.sh", "--full", "-x"]


@pytest.mark.parametrize(
    "line",
    [
        "--job x",
        "--job=x --store=sqlite:////tmp/a.db",
        "--job x --ttl 2m --every 10m --policy queue --max-pending 3",
        "--job x --schedule */5_*_*_*_* --tz UTC --grace 30s",
        "--job x --policy allow --allow-unpartitioned --reason idempotent --quiet",
        "--job x --skip-exit-code 75 --on-store-error run --renew-every 5s",
        "--job x --replace-grace 3s --max-runtime 1h --shard eu --config c.toml",
        "--job= --reason a_=_b",
    ],
)
def test_a_plain_command_line_reads_as_argparse_reads_it(line: str) -> None:
    """``line``: flags split on spaces, ``_`` a space inside a value."""
    for argv in ([w.replace("_", " ") for w in line.split()] + tail for tail in (CMD, ["--"])):
        assert plain(argv) == by_argparse(argv)
        assert plain(argv) is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--job", "x", "-h", *CMD],
        ["--jo", "x", *CMD],  # an abbreviation argparse accepts
        ["--job", "x", "--job", "y", *CMD],  # repeated: argparse converts each
        ["--job", "x", "--every", "1m", "--schedule", "* * * * *", *CMD],  # mutually exclusive
        ["--every", "1m", *CMD],  # --job missing
        ["--job", "x", "--policy", "sometimes", *CMD],  # not a choice
        ["--job", "x", "--max-pending", "many", *CMD],  # int() refuses it
        ["--job", "x", "--max-pending", "-1", *CMD],  # a value that starts with -
        ["--job", "x", "--quiet=yes", *CMD],
        ["--job", "x", "./job.sh"],  # no --
        ["--job", "x", "--ttl"],  # a flag with no value
        ["--job", "x", "--unknown", "1", *CMD],
    ],
)
def test_anything_else_is_left_to_argparse(argv: list[str]) -> None:
    assert plain(argv) is None


def test_a_bad_value_raises_the_same_one_line_error() -> None:
    argv = ["--job", "x", "--ttl", "forever", *CMD]
    with pytest.raises(UsageError) as fast:
        parse_plain(run.FLAGS, argv)
    assert f"error: {fast.value}" == by_argparse(argv)


VALUES = ["x", "2m", "0", "-1", "abc", "skip", "queue", "run", "* * *", "=", ""]
TOKENS = st.sampled_from([*run.FLAGS, "--", "-h", "--jo", *VALUES])
ASSIGNED = st.builds("{}={}".format, st.sampled_from(list(run.FLAGS)), TOKENS)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(TOKENS, ASSIGNED), max_size=10))
def test_parse_plain_never_disagrees_with_argparse(argv: list[str]) -> None:
    try:
        fast = plain(argv)
    except UsageError as e:  # a bad value, as argparse's type would say it
        assert by_argparse(argv) == f"error: {e}"
        return
    if fast is not None:
        assert fast == by_argparse(argv)


def test_every_flag_of_run_is_in_its_table() -> None:
    """configure adds exactly FLAGS (plus the command), so parse_plain sees
    every option argparse knows."""
    parser = cli.command_parser("run")
    options = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    assert options == set(run.FLAGS)
    assert isinstance(parse_plain(run.FLAGS, ["--job", "x", "--"]), SimpleNamespace)


# -- the process ends normally ---------------------------------------------

ATEXIT_PROBE = """import atexit, os
atexit.register(lambda: open(os.environ["PROBE"], "w").write("teardown ran"))
"""


def run_console(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``python -m cronwarden ARGS`` with an atexit hook installed by a
    sitecustomize: the process and whether its teardown ran."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(ATEXIT_PROBE)
    probe = tmp_path / "probe"
    probe.unlink(missing_ok=True)
    env = {**os.environ, "PROBE": str(probe), "PYTHONPATH": os.pathsep.join([str(site), *sys.path[1:]])}
    p = subprocess.run([sys.executable, "-m", "cronwarden", *args], env=env, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    return p, probe.exists()


def test_a_finished_run_exits_with_the_commands_status_and_a_normal_teardown(
    tmp_path: Path, store_url: str
) -> None:
    """On every store: the exit hooks run, the output is flushed, and the
    ledger has the run's end."""
    url = store_url
    p, teardown = run_console(tmp_path, "run", "--job", "fast", "--store", url, "--",
                              "sh", "-c", "echo out; echo err >&2; exit 7")  # fmt: skip
    assert (p.returncode, p.stdout, p.stderr) == (7, "out\n", "err\n")
    assert teardown
    with open_store(url) as store:
        (r,) = store.runs("fast")
        assert (r.outcome, r.exit_code) == (Outcome.FAILED, 7)
        kinds = [e.kind for e in store.events(EventQuery(job="fast"))]
    assert sorted(kinds) == sorted([EventKind.STARTED, EventKind.FAILED])  # newest first


def test_a_skip_is_flushed_and_the_process_tears_down(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    argv = [sys.executable, "-m", "cronwarden", "run", "--job", "fast", "--store", url]
    holder = subprocess.Popen(
        [*argv, "--", "sh", "-c", "echo held; exec sleep 30"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        p, teardown = run_console(tmp_path, "run", "--job", "fast", "--skip-exit-code", "9", "--store", url,
                                  "--", "true")  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 9
    assert "skipped" in p.stderr and teardown


def test_other_commands_and_runs_with_sinks_tear_down_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cw.db'}"
    open_store(url).close()  # status reads a ledger that exists; it creates none
    p, teardown = run_console(tmp_path, "status", "--store", url)
    assert p.returncode == 0 and teardown
    config = tmp_path / "cronwarden.toml"
    config.write_text(f'store = "{url}"\n[sinks.file]\ntype = "log"\npath = "{tmp_path / "events.log"}"\n')
    p, teardown = run_console(tmp_path, "run", "--job", "fast", "--config", str(config), "--", "true")
    assert p.returncode == 0, p.stderr
    assert teardown
    assert '"kind":"succeeded"' in (tmp_path / "events.log").read_text().replace(" ", "")

"""The config file and its precedence: ``cronwarden config check/show`` and
``cronwarden run --config`` as real processes; the resolution rules through
``cronwarden.config`` directly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.contract import assert_one_terminal_per_start, ledger

from cronwarden.config import (
    DEFAULT_MAX_PENDING,
    DEFAULT_REPLACE_GRACE,
    DEFAULT_TTL,
    ConfigError,
    find,
    load,
    resolve,
    validate,
)
from cronwarden.errors import UsageError
from cronwarden.events import EventKind
from cronwarden.guard import Options
from cronwarden.policy import Policy
from cronwarden.schedule import Schedule
from cronwarden.stores import open_store

CLI = [sys.executable, "-m", "cronwarden"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    env.update(extra)
    return env


def cronwarden(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, env=env or clean_env(), capture_output=True, text=True,
                          timeout=30)  # fmt: skip


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    return path


FIVE_MISTAKES = """
    store = "sqlite:///tmp/x.db"

    [defaults]
    tll = "2m"

    [jobs.reconcile]
    schedule = "*/10 * * * *"
    ttl = 90

    [jobs.cache]
    every = "5m"
    policy = "replace"

    [jobs.report]
    schedule = "61 * * * *"

    [jobs.sync]
    every = "1m"
    policy = "alow"
"""


# -- config check ------------------------------------------------------------


def test_check_reports_five_different_mistakes_at_once_with_their_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "cronwarden.toml", FIVE_MISTAKES)

    done = cronwarden("config", "check", "--config", str(path), cwd=tmp_path)

    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert len(lines) == 5, done.stdout
    expected = [
        (4, "unknown key 'tll' in [defaults]; did you mean 'ttl'?"),
        (8, "[jobs.reconcile] ttl must be a duration string"),
        (12, "[jobs.cache] policy replace needs a reason"),
        (15, "[jobs.report] schedule must be a cron expression"),
        (19, "[jobs.sync] policy must be one of skip, allow, replace, queue, got 'alow'; did you mean"),
    ]
    for line, (number, text) in zip(lines, expected, strict=True):
        assert line.startswith(f"{path}:{number}: {text}"), line
    assert done.stderr.strip() == f"cronwarden: 5 problems in {path}"
    assert "Traceback" not in done.stderr


def test_check_reports_a_syntax_error_at_the_parsers_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "cronwarden.toml",
        """
        [jobs.a]
        every = "5m"
        ttl =
    """,
    )

    done = cronwarden("config", "check", "--config", str(path), cwd=tmp_path)

    assert done.returncode == 2
    assert done.stdout.startswith(f"{path}:3: TOML syntax: Invalid value"), done.stdout


def test_check_of_a_good_file_prints_one_summary_line_and_exits_0(tmp_path: Path) -> None:
    write(
        tmp_path / "cronwarden.toml",
        """
        store = "sqlite:///var/lib/cronwarden/cronwarden.db"

        [defaults]
        ttl = "2m"
        timezone = "Europe/Berlin"

        [jobs.reconcile]
        schedule = "*/10 * * * *"
        reason = "one run drains every unreconciled row"
        max_runtime = "30m"

        [jobs.sync]
        every = "5m"
        policy = "allow"
        reason = "each shard is a separate set of accounts"
        shards = ["eu", "us"]

        [jobs.ingest]
        every = "1m"
        policy = "queue"
        reason = "each start means new files landed; one worker drains them"
        max_pending = 2
        command = ["/opt/bin/ingest", "--all"]
    """,
    )

    done = cronwarden("config", "check", cwd=tmp_path)  # found as ./cronwarden.toml

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "./cronwarden.toml: ok: 3 jobs (reconcile, sync, ingest), store sqlite:///var/lib/cronwarden/cronwarden.db"
    ]


def test_check_judges_policy_specific_keys_and_combinations(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.a]
        schedule = "0 * * * *"
        every = "1h"
        max_pending = 3
        timezone = "Mars/Olympus"

        [jobs.b]
        every = "1h"
        policy = "allow"
        reason = "why not"
        timezone = "UTC"
        command = []

        [jobs.c]
        command = ["/bin/true"]
        shards = ["x", "x"]
    """,
    )

    problems = validate(str(path), environ={})

    found = [(p.line, p.message.split(" ")[0], key) for p in problems for key in KEYS if key in p.message]
    assert found == [
        (3, "[jobs.a]", "both schedule and every"),
        (4, "[jobs.a]", "max_pending is for policy queue only"),
        (5, "[jobs.a]", "time zone must be an IANA name"),
        (9, "[jobs.b]", "policy allow needs a partition"),
        (11, "[jobs.b]", "timezone applies to a cron schedule"),
        (12, "[jobs.b]", "command must be a non-empty list"),
        (15, "[jobs.c]", "no schedule or every"),
        (16, "[jobs.c]", "'x' more than once"),
        (16, "[jobs.c]", "shards is for policy allow only"),
    ]
    assert len(problems) == 9


KEYS = (
    "both schedule and every",
    "max_pending is for policy queue only",
    "time zone must be an IANA name",
    "policy allow needs a partition",
    "timezone applies to a cron schedule",
    "command must be a non-empty list",
    "no schedule or every",
    "'x' more than once",
    "shards is for policy allow only",
)


def test_check_without_a_file_says_where_it_looked(tmp_path: Path) -> None:
    done = cronwarden("config", "check", cwd=tmp_path)

    assert done.returncode == 2
    assert "no config file found" in done.stderr and "CRONWARDEN_CONFIG" in done.stderr


def test_config_environment_variable_names_the_file_and_must_exist(tmp_path: Path) -> None:
    done = cronwarden(
        "config", "check", cwd=tmp_path, env=clean_env(CRONWARDEN_CONFIG=str(tmp_path / "no.toml"))
    )

    assert done.returncode == 2
    assert done.stderr.startswith("cronwarden: $CRONWARDEN_CONFIG: no config file at")


def test_check_reports_bad_environment_values_too(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[jobs.a]\nevery = "1m"\n')

    done = cronwarden("config", "check", "--config", str(path), cwd=tmp_path,
                      env=clean_env(CRONWARDEN_TTL="ten", CRONWARDEN_MAX_PENDING="0"))  # fmt: skip

    assert done.returncode == 2
    assert done.stdout.splitlines() == [
        "$CRONWARDEN_TTL: ttl must be a duration like 90s, 10m or 1h30m, got 'ten'",
        "$CRONWARDEN_MAX_PENDING: max_pending must be a whole number of at least 1, got '0'",
    ]


# -- config show -------------------------------------------------------------


def test_show_gives_each_setting_and_where_it_came_from(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [defaults]
        ttl = "2m"

        [jobs.cache]
        every = "5m"
        policy = "replace"
        reason = "latest inputs win"
        replace_grace = "20s"
    """,
    )

    done = cronwarden("config", "show", "--json", "--config", str(path), cwd=tmp_path,
                      env=clean_env(CRONWARDEN_GRACE="1m"))  # fmt: skip

    assert done.returncode == 0, done.stderr
    (job,) = json.loads(done.stdout)["jobs"]
    settings = {k: job["settings"][k] for k in ("every", "policy", "ttl", "grace", "replace_grace")}
    assert settings == {
        "every": 300.0,
        "policy": "replace",
        "ttl": 120.0,
        "grace": 60.0,
        "replace_grace": 20.0,
    }
    assert job["sources"]["ttl"] == f"{path}:2"
    assert job["sources"]["every"] == f"{path}:5"
    assert job["sources"]["grace"] == "$CRONWARDEN_GRACE"
    assert job["sources"]["max_pending"] == "default"
    text = cronwarden("config", "show", "--config", str(path), cwd=tmp_path).stdout
    assert "replace_grace  20s" in text and f"{path}:8" in text


# -- resolution --------------------------------------------------------------


def test_built_in_defaults_are_the_guards_defaults() -> None:
    o = Options()
    assert (o.ttl, o.replace_grace, o.max_pending) == (
        DEFAULT_TTL,
        DEFAULT_REPLACE_GRACE,
        DEFAULT_MAX_PENDING,
    )


def test_precedence_is_flags_then_environment_then_job_table_then_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [defaults]
        ttl = "2m"
        grace = "5m"
        max_runtime = "1h"

        [jobs.a]
        ttl = "3m"
        grace = "6m"
    """,
    )
    config = load(str(path), environ={"CRONWARDEN_GRACE": "7m"})

    a = resolve("a", config, {"ttl": None})
    flagged = resolve("a", config, {"ttl": 30.0})
    other = resolve("b", config)

    assert (a.ttl, a.grace, a.max_runtime, a.max_pending) == (180.0, 420.0, 3600.0, 1)
    assert (a.sources["ttl"], a.sources["grace"], a.sources["max_runtime"]) == (
        f"{path}:7",
        "$CRONWARDEN_GRACE",
        f"{path}:4",
    )
    assert (flagged.ttl, flagged.sources["ttl"]) == (30.0, "--ttl")
    assert (other.ttl, other.in_file, a.in_file) == (120.0, False, True)


def test_a_schedule_flag_replaces_the_files_schedule_and_its_time_zone(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.a]
        schedule = "0 2 * * *"
        timezone = "Europe/Berlin"
    """,
    )
    config = load(str(path), environ={})

    assert resolve("a", config).schedule_text() == "CRON_TZ=Europe/Berlin 0 2 * * *"
    assert resolve("a", config, {"every": 600.0}).schedule_text() == "every 10m"
    assert Schedule.parse("CRON_TZ=Europe/Berlin 0 2 * * *").tz == "Europe/Berlin"


def test_loading_for_one_job_tolerates_mistakes_in_other_jobs_tables(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.good]
        every = "1m"

        [jobs.bad]
        ttl = "soon"
    """,
    )

    assert load(str(path), job="good", environ={}).job("good") is not None
    with pytest.raises(ConfigError, match=r"c.toml:5: \[jobs.bad\] ttl must be a duration"):
        load(str(path), job="bad", environ={})
    with pytest.raises(ConfigError):
        load(str(path), environ={})


def test_find_prefers_the_flag_then_the_environment_then_the_current_directory(tmp_path: Path) -> None:
    local = write(tmp_path / "cronwarden.toml", "")
    named = write(tmp_path / "other.toml", "")

    assert find(None, {}, cwd=str(tmp_path)) == str(local)
    assert find(None, {"CRONWARDEN_CONFIG": str(named)}, cwd=str(tmp_path)) == str(named)
    assert find(str(local), {"CRONWARDEN_CONFIG": str(named)}, cwd=str(tmp_path)) == str(local)
    assert find(None, {}, cwd=str(tmp_path / "nowhere")) is None
    with pytest.raises(UsageError, match="--config: no config file at"):
        find(str(tmp_path / "missing.toml"), {})


def test_policy_is_not_a_default_key(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[defaults]\npolicy = "queue"\n')

    (problem,) = validate(str(path), environ={})

    assert problem.line == 2 and "unknown key 'policy' in [defaults]" in problem.message


# -- cronwarden run with a config -------------------------------------------


def test_run_takes_its_settings_from_the_config_with_env_and_flags_above_it(
    store_url: str, tmp_path: Path
) -> None:
    write(
        tmp_path / "cronwarden.toml",
        f"""
        store = "{store_url}"

        [jobs.nightly]
        every = "1h"
        ttl = "7s"
    """,
    )

    def ttl_of_a_run(*flags: str, **env: str) -> float:
        done = cronwarden("run", "--job", "nightly", *flags, "--", "true", cwd=tmp_path, env=clean_env(**env))
        assert done.returncode == 0, done.stderr
        with open_store(store_url) as store:
            return float(ledger(store, kinds=[EventKind.STARTED])[-1].data["ttl"])

    assert ttl_of_a_run() == 7.0  # the job's table (and the file's store)
    assert ttl_of_a_run(CRONWARDEN_TTL="5s") == 5.0
    assert ttl_of_a_run("--ttl", "3s", CRONWARDEN_TTL="5s") == 3.0
    with open_store(store_url) as store:
        slots = [e.data["slot"] for e in ledger(store, kinds=[EventKind.STARTED])]
        assert all(s is not None and s % 3600 == 0 for s in slots)  # `every` gave each run its slot
        assert_one_terminal_per_start(store)


def test_run_records_the_job_in_the_store_only_when_it_changed(store_url: str, tmp_path: Path) -> None:
    def run(*flags: str) -> None:
        done = cronwarden(
            "run", "--store", store_url, "--job", "reconcile", *flags, "--", "true", cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr

    run("--every", "10m", "--policy", "queue", "--reason", "every start is new work", "--grace", "2m")
    with open_store(store_url) as store:
        (first,) = store.jobs()
    run("--every", "10m", "--policy", "queue", "--reason", "every start is new work", "--grace", "2m")
    with open_store(store_url) as store:
        (same,) = store.jobs()
    run(
        "--schedule", "*/5 * * * *", "--tz", "UTC", "--policy", "queue", "--reason", "every start is new work"
    )
    with open_store(store_url) as store:
        (changed,) = store.jobs()
        assert_one_terminal_per_start(store)

    assert (first.schedule, first.period, first.policy, first.reason, first.ttl, first.grace) == (
        "every 10m", 600.0, "queue", "every start is new work", 60.0, 120.0)  # fmt: skip
    assert same.updated_at == first.updated_at  # not written again
    assert (changed.schedule, changed.period, changed.grace) == ("CRON_TZ=UTC */5 * * * *", 300.0, None)
    assert changed.updated_at > first.updated_at


def test_a_configured_job_is_recorded_even_with_every_default(store_url: str, tmp_path: Path) -> None:
    # The config file names it, so audit and the monitor should know it,
    # although nothing in its table differs from the defaults.
    write(tmp_path / "cronwarden.toml", "[jobs.plain]\n")
    for _ in range(2):
        done = cronwarden("run", "--store", store_url, "--job", "plain", "--", "true", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    with open_store(store_url) as store:
        (job,) = store.jobs()
        assert (job.name, job.schedule, job.policy, job.ttl) == ("plain", None, "skip", 60.0)
        assert len(ledger(store, job="plain", kinds=[EventKind.SUCCEEDED])) == 2


def test_a_bare_run_records_no_job_and_reads_no_config(store_url: str, tmp_path: Path) -> None:
    done = cronwarden("run", "--store", store_url, "--job", "bare", "--", "true", cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    with open_store(store_url) as store:
        assert store.jobs() == []


def test_run_without_config_or_schedule_imports_neither_tomllib_nor_cronsim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    for flags in ([], ["--every", "10m"]):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "cronwarden", "run", "--store", url,
                               "--job", "x", *flags, "--", "true"], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        assert "cronwarden.guard" in imported  # the measurement works
        assert not imported & {"tomllib", "cronsim", "cronwarden.config.file", "difflib", "zoneinfo"}, flags


def test_run_refuses_a_shard_not_in_the_jobs_list(store_url: str, tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.sync]
        policy = "allow"
        reason = "each shard is its own accounts"
        shards = ["eu", "us"]
    """,
    )

    wrong = cronwarden("run", "--config", str(path), "--store", store_url, "--job", "sync", "--shard", "ap",
                       "--", "true", cwd=tmp_path)  # fmt: skip
    missing = cronwarden("run", "--config", str(path), "--store", store_url, "--job", "sync", "--", "true",
                         cwd=tmp_path)  # fmt: skip
    right = cronwarden("run", "--config", str(path), "--store", store_url, "--job", "sync", "--shard", "eu",
                       "--", "true", cwd=tmp_path)  # fmt: skip

    assert (wrong.returncode, missing.returncode, right.returncode) == (2, 2, 0), right.stderr
    assert "--shard 'ap' is not one of job sync's shards" in wrong.stderr and "eu, us" in wrong.stderr
    assert "give --shard, one of eu, us" in missing.stderr
    with open_store(store_url) as store:
        assert [e.data["key"] for e in ledger(store, kinds=[EventKind.STARTED])] == ["sync:eu"]
        assert_one_terminal_per_start(store)


def test_run_with_a_broken_table_for_its_job_fails_with_every_problem_and_no_traceback(
    store_url: str, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.a]
        ttl = 60
        policy = "queue"
    """,
    )

    done = cronwarden(
        "run", "--config", str(path), "--store", store_url, "--job", "a", "--", "true", cwd=tmp_path
    )

    assert done.returncode == 2
    assert done.stderr.startswith("cronwarden: 2 problems in the configuration:")
    assert (
        f"{path}:2: [jobs.a] ttl" in done.stderr
        and f"{path}:3: [jobs.a] policy queue needs a reason" in done.stderr
    )
    assert "Traceback" not in done.stderr
    with open_store(store_url) as store:
        assert ledger(store) == []


def test_policy_in_a_job_table_reaches_the_guard(store_url: str, tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.toml",
        """
        [jobs.q]
        policy = "queue"
        reason = "each start is new work"
        max_pending = 2
    """,
    )
    config = load(str(path), environ={})

    job = resolve("q", config)

    assert (job.policy, job.max_pending, job.reason) == (Policy.QUEUE, 2, "each start is new work")


# -- one validator: config check refuses exactly what run and scheduler refuse --

JOB = '[jobs.x]\nevery = "1m"\ncommand = ["true"]\n'
HOSTILE_HOST = "evil\n\x1b[2J"

# (what is wrong, the config file (STORE: a fresh SQLite store), extra environment)
ONE_VALIDATOR = [
    ("postgres schema name", 'store = "postgresql://postgres@127.0.0.1:1/test?schema=bad-name"\n' + JOB, {}),
    ("postgres unknown option", 'store = "postgresql://postgres@127.0.0.1:1/test?colour=blue"\n' + JOB, {}),
    ("redis unknown option", 'store = "redis://127.0.0.1:1/0?prefix=t:&bogus=1"\n' + JOB, {}),
    ("redis empty prefix", 'store = "redis://127.0.0.1:1/0?prefix="\n' + JOB, {}),
    ("sqlite option value", 'store = "STORE?synchronous=sometimes"\n' + JOB, {}),
    ("sqlite retention", 'store = "STORE?retention=soon"\n' + JOB, {}),
    ("sqlite busy timeout", 'store = "STORE?busy_timeout=5"\n' + JOB, {}),
    ("ttl under 1s", 'store = "STORE"\n' + JOB + 'ttl = "500ms"\n', {}),
    ("renewal slower than the ttl", 'store = "STORE"\n' + JOB + 'ttl = "1m"\nrenew_every = "2m"\n', {}),
    ("queue too long", 'store = "STORE"\n' + JOB + 'policy = "queue"\nreason = "each start is work"\n'
     "max_pending = 20000\n", {}),
    ("ttl from the environment", 'store = "STORE"\n' + JOB, {"CRONWARDEN_TTL": "1ms"}),
    ("host name", 'store = "STORE"\n' + JOB, {"CRONWARDEN_HOST": HOSTILE_HOST}),
    ("none", 'store = "STORE"\n' + JOB, {}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "text", "env"), ONE_VALIDATOR, ids=[c[0] for c in ONE_VALIDATOR])
def test_config_check_refuses_exactly_what_run_and_scheduler_refuse_with_their_message(
    tmp_path: Path, case: str, text: str, env: dict[str, str]
) -> None:
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    write(tmp_path / "cronwarden.toml", text.replace("STORE", store))
    environ = clean_env(**env)

    checked = cronwarden("config", "check", cwd=tmp_path, env=environ)
    ran = cronwarden("run", "--job", "x", "--", "true", cwd=tmp_path, env=environ)

    assert "Traceback" not in checked.stderr + ran.stderr
    if case == "none":
        assert (checked.returncode, ran.returncode) == (0, 0), (checked, ran)
        return
    assert checked.returncode == 2, checked
    assert ran.returncode == 2, ran
    said = ran.stderr.strip().removeprefix("cronwarden: ")
    assert len(ran.stderr.strip().splitlines()) == 1 and said in checked.stdout, (said, checked.stdout)
    # The scheduler refuses the same at its start, before it fires anything.
    scheduled = cronwarden("scheduler", "--for", "1s", cwd=tmp_path, env=environ)
    assert scheduled.returncode == 2 and said in scheduled.stderr, scheduled


SINKS = '[sinks.hook]\ntype = "webhook"\nsecret_env = "HOOK_SECRET"\nurl = "{url}"\n'


@pytest.mark.parametrize("url", ["https://user:S3CRETPW@example.com/hook", "https://exa mple.com/hook",
                                 "http://127.0.0.1:99999/hook", "http://127.0.0.1:28901/hook"])  # fmt: skip
def test_config_check_refuses_exactly_the_sinks_flush_and_scheduler_refuse(tmp_path: Path, url: str) -> None:
    store = f"sqlite:///{tmp_path / 'ledger.db'}"
    write(tmp_path / "cronwarden.toml", f'store = "{store}"\n' + JOB + SINKS.format(url=url))
    environ = clean_env(HOOK_SECRET="s")

    checked = cronwarden("config", "check", cwd=tmp_path, env=environ)
    flushed = cronwarden("flush", cwd=tmp_path, env=environ)

    assert "S3CRETPW" not in checked.stdout + checked.stderr + flushed.stdout + flushed.stderr
    if url == "http://127.0.0.1:28901/hook":  # nothing to deliver: no run yet
        assert (checked.returncode, flushed.returncode) == (0, 0), (checked, flushed)
        return
    assert checked.returncode == 2 and flushed.returncode == 2, (checked, flushed)
    said = flushed.stderr.strip().removeprefix("cronwarden: ").partition(": ")[2]
    assert said and said in checked.stdout, (said, checked.stdout)
    scheduled = cronwarden("scheduler", "--for", "1s", cwd=tmp_path, env=environ)
    assert scheduled.returncode == 2 and said in scheduled.stderr, scheduled

"""The SQL the stores read at run time ships in the wheel: built from this
source tree, installed into a fresh virtualenv, the package has every
``.sql`` (and ``.lua``) file and a SQLite store opens from it and runs one
guarded cycle."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "cronwarden"
DATA_SUFFIXES = (".sql", ".lua")

# Not a build problem but no way to get the build backend without a network.
OFFLINE = ("Could not find a version that satisfies", "No matching distribution", "Failed to establish")

CYCLE = """
import sys
import cronwarden
from cronwarden import Run, Warden
from cronwarden.stores import open_store

store = open_store("sqlite:///" + sys.argv[1])
with Warden(store, quiet=True).guard("wheel-check") as run:
    assert isinstance(run, Run)
    token = run.token
[ended] = store.runs("wheel-check")
store.close()
print(cronwarden.__file__)
print(token, ended.outcome)
"""


def data_files() -> list[str]:
    """The package's data files in the source tree, as wheel paths."""
    return sorted(
        str(p.relative_to(PACKAGE.parent))
        for p in PACKAGE.rglob("*")
        if p.suffix in DATA_SUFFIXES and "__pycache__" not in p.parts
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this tree, built from a copy of it (setuptools writes its
    build directory and egg-info next to the sources). Without build
    isolation when setuptools and wheel are installed: nothing to download."""
    src = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(PACKAGE, src / "src" / "cronwarden", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--quiet",
        "--wheel-dir",
        str(out),
        str(src),
    ]
    if importlib.util.find_spec("setuptools") and importlib.util.find_spec("wheel"):
        command.insert(4, "--no-build-isolation")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        if any(sign in done.stderr for sign in OFFLINE):
            pytest.skip(f"cannot build a wheel offline: {done.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"pip wheel failed:\n{done.stderr}")
    [built] = out.glob("cronwarden-*.whl")
    return built


def test_the_wheel_holds_every_sql_and_lua_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        shipped = {name for name in z.namelist() if name.endswith(DATA_SUFFIXES)}

    assert data_files() and sorted(shipped) == data_files()
    assert {
        "cronwarden/stores/queries.sql",
        "cronwarden/stores/sqlite/schema.sql",
        "cronwarden/stores/sqlite/queries.sql",
        "cronwarden/stores/sqlite/migrations/0001_initial.sql",
        "cronwarden/stores/postgres/schema.sql",
        "cronwarden/stores/postgres/functions.sql",
        "cronwarden/stores/postgres/queries.sql",
        "cronwarden/stores/postgres/migrations/0001_initial.sql",
    } <= shipped


def test_the_installed_wheel_opens_a_sqlite_store_and_runs_a_guarded_cycle(
    wheel: Path, tmp_path: Path
) -> None:
    # A bare environment: no site-packages of ours, no pip. A guarded SQLite
    # cycle needs nothing outside the standard library and the wheel.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(python), "-c", CYCLE, str(tmp_path / "store.db")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    where, cycle = done.stdout.splitlines()
    assert Path(where).is_relative_to(env_dir), "imported cronwarden from outside the wheel's install"
    assert cycle == "1 succeeded"

"""``examples/kubernetes/cronjob.yaml``: checked against the Kubernetes
CronJob schema (the ``kubernetes`` client's models), and its container's
command run as a pod runs it: as PID 1 of a PID namespace, then deleted
(SIGTERM to PID 1) and given the pod's grace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.docs.runner import cronwarden_command
from tests.guard.test_interrupted import as_pid_1
from tests.guard.test_run_cli import wait_for

from cronwarden.durations import parse_duration
from cronwarden.events import Outcome
from cronwarden.stores import open_store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "cronjob.yaml"


def manifest() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


def container(doc: dict[str, Any]) -> dict[str, Any]:
    (c,) = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


def test_the_manifest_is_a_valid_cronjob_with_every_field_known() -> None:
    client = pytest.importorskip("kubernetes.client")
    doc = manifest()
    api = client.ApiClient()
    cronjob = api.deserialize(json.dumps(doc), "V1CronJob", "application/json")
    assert isinstance(cronjob, client.V1CronJob)
    # The models drop what they do not know: a misspelt field would be lost.
    assert api.sanitize_for_serialization(cronjob) == doc
    misspelt = json.loads(json.dumps(doc))
    misspelt["spec"]["concurencyPolicy"] = "Forbid"
    read = api.deserialize(json.dumps(misspelt), "V1CronJob", "application/json")
    assert api.sanitize_for_serialization(read) != misspelt


def test_the_manifest_says_what_cronwarden_needs_in_a_pod() -> None:
    doc = manifest()
    spec = doc["spec"]
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    c = container(doc)
    assert spec["concurrencyPolicy"] == "Forbid"
    assert pod["restartPolicy"] == "Never" and spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    # cronwarden is PID 1 itself: an absolute path, no shell in between.
    assert c["command"][0] == "/usr/local/bin/cronwarden" and c["command"][1] == "run"
    assert "args" not in c
    env = {e["name"]: e for e in c["env"]}
    assert env["CRONWARDEN_STORE"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert env["CRONWARDEN_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The pod's grace outlasts cronwarden's kill grace (min(10s, ttl/6))
    # with room to record the end.
    ttl = parse_duration(c["command"][c["command"].index("--ttl") + 1], what="--ttl")
    assert pod["terminationGracePeriodSeconds"] >= min(10.0, ttl / 6) + 5
    # The schedule cronwarden records is the CronJob's.
    assert c["command"][c["command"].index("--schedule") + 1] == spec["schedule"]
    assert c["command"][c["command"].index("--timezone") + 1] == spec["timeZone"]


def test_the_pod_command_as_pid_1_records_interrupted_on_pod_deletion(tmp_path: Path) -> None:
    doc = manifest()
    c = container(doc)
    ready = tmp_path / "ready"
    job = tmp_path / "reconcile"
    job.write_text(f"#!/bin/sh\ntouch {ready}\nwhile :; do sleep 0.05; done\n")
    job.chmod(0o755)
    stand_ins = {"/usr/local/bin/cronwarden": str(cronwarden_command()), "/opt/bin/reconcile": str(job)}
    argv = [stand_ins.get(a, a) for a in c["command"]]
    url = f"sqlite:///{tmp_path}/ops.db"  # the Secret's URL; a shared store in a real cluster
    os.environ["CRONWARDEN_STORE"] = url
    os.environ["CRONWARDEN_HOST"] = "reconcile-28937150-x7k2p"  # what fieldRef metadata.name gives
    try:
        p, init = as_pid_1(*argv[1:])
    finally:
        del os.environ["CRONWARDEN_STORE"], os.environ["CRONWARDEN_HOST"]
    wait_for(ready.exists, what="the command to start")
    deleted = time.monotonic()
    os.kill(init, signal.SIGTERM)  # the kubelet, deleting the pod
    _, err = p.communicate(timeout=60)
    grace = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert time.monotonic() - deleted < grace, "the kubelet would have SIGKILLed cronwarden"
    assert p.returncode == 143, err
    with open_store(url) as store:
        (run,) = store.runs("reconcile")
        assert run.outcome is Outcome.INTERRUPTED and run.host == "reconcile-28937150-x7k2p"
        job_info = store.job("reconcile")
        assert job_info is not None and job_info.schedule is not None and "*/10 * * * *" in job_info.schedule


def test_the_default_sqlite_store_in_a_pod_is_warned_about(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CRONWARDEN_")}
    done = subprocess.run([sys.executable, "-m", "cronwarden", "run", "--job", "podjob", "--", "true"],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "warning: the default SQLite store" in done.stderr and "CRONWARDEN_STORE" in done.stderr
    explicit = subprocess.run(
        [sys.executable, "-m", "cronwarden", "run", "--job", "podjob", "--store", f"sqlite:///{tmp_path}/x.db",
         "--", "true"], env={**clean, **env}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert explicit.returncode == 0 and "warning" not in explicit.stderr
    outside = subprocess.run([sys.executable, "-m", "cronwarden", "run", "--job", "podjob", "--", "true"],
                             env=clean | {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)},
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert outside.returncode == 0 and "warning" not in outside.stderr

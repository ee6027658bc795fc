"""A client left unclosed when its script ends still says goodbye: the daemon frees its session at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from loader.service.client.client import query_status
from tests.helpers import REPO_ROOT, wait_until
from tests.integration.conftest import make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

SILENCE_TIMEOUT_S = 30.0  # what would free the session otherwise; the goodbye must come far sooner


def test_a_client_unclosed_at_interpreter_exit_says_goodbye(tmp_path):
    write_id_files(tmp_path, 2, 100)
    config = make_config(tmp_path, pipeline={"batch_size": 10}, workers={"heartbeat_timeout_s": SILENCE_TIMEOUT_S})
    script = (
        "from loader import Client\n"
        "client = Client({address!r}, timeout_s=10)\n"
        "batches = client.epoch()\n"
        "next(batches)\n"  # mid-epoch, never closed: the script just ends
    )
    with running_daemon(config) as daemon:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        code = script.format(address=daemon.endpoint)
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
        ended = time.monotonic()
        assert wait_until(lambda: not query_status(daemon.endpoint)["clients"], timeout_s=SILENCE_TIMEOUT_S / 3)
        assert time.monotonic() - ended < SILENCE_TIMEOUT_S / 3


_FORK_SCRIPT = """
import os, sys, time
from loader import Client
from loader.errors import ClosedError
client = Client({address!r}, timeout_s=10)
first = [int(i) for b in client.epoch() for i in b["data"]]
pid = os.fork()
if pid == 0:  # the child: one clear error, and an exit that does not wait on the parent's client
    try:
        next(iter(client.epoch()))
        print("child read a batch")
    except ClosedError as exc:
        print("child:", exc)
    sys.stdout.flush()
    sys.exit(0)
started = time.monotonic()
_, status = os.waitpid(pid, 0)
print("child exited", status, "in", round(time.monotonic() - started, 1))
second = [int(i) for b in client.epoch() for i in b["data"]]
print("parent epochs", sorted(first) == sorted(second) == {ids!r})
client.close()
"""


def test_a_forked_copy_of_a_client_says_so_and_the_parent_reads_on(tmp_path):
    ids = write_id_files(tmp_path, 2, 100)
    config = make_config(tmp_path, pipeline={"batch_size": 10})
    with running_daemon(config) as daemon:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        code = _FORK_SCRIPT.format(address=daemon.endpoint, ids=sorted(ids))
        done = subprocess.run([sys.executable, "-c", code], env=env, timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("child: this Client was made in process ") and "forked from it" in lines[0], lines
    assert lines[1].startswith("child exited 0 in "), lines
    assert lines[2] == "parent epochs True", lines

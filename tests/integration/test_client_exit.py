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

"""How long a client takes to notice a daemon killed with SIGKILL mid-epoch.

    python scripts/dead_daemon_notice.py TIMEOUT_S

Starts a daemon in a child process, reads one batch, SIGKILLs the daemon and times the
ServiceUnavailableError. With TIMEOUT_S = 40: 69.9 s before pings stopped waiting for room in a
full send queue (the queue fills after 64 pings, about 32 s), 40.0 s after, 2.3 s since the client
reads its socket's monitor events (a dropped connection whose address refuses reconnecting).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time

import numpy as np


def serve(cfg, q):
    from loader.config import LoaderConfig
    from loader.service.daemon.loop import Daemon

    with Daemon(LoaderConfig.from_dict(cfg)) as d:
        q.put(d.endpoint)
        d.serve()


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # the docstring is the usage; run nothing
        print(__doc__)
        sys.exit(0)
    from loader import Client
    from loader.errors import ServiceUnavailableError

    d = tempfile.mkdtemp()
    np.save(os.path.join(d, "a.npy"), np.arange(200000))
    cfg = {
        "source": {"files": [os.path.join(d, "a.npy")]},
        "pipeline": {"batch_size": 4},
        "workers": {"count": 1},
        "service": {"bind": "tcp://127.0.0.1:*"},
    }
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=serve, args=(cfg, q))
    p.start()
    ep = q.get(timeout=60)
    timeout = float(sys.argv[1])
    with Client(ep, timeout_s=timeout, prefetch=4) as c:
        it = c.epoch()
        next(it)
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        try:
            for _ in it:
                time.sleep(0.01)
        except ServiceUnavailableError as e:
            print(f"timeout_s={timeout}: noticed after {time.monotonic() - t0:.1f}s: {e}")

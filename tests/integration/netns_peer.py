"""A worker and a client on the second "host" of ``test_auth`` (run there by the test; prints one JSON line).

Keys come from the environment (``LOADER_PEER_KEY``, ``LOADER_DAEMON_PUBLIC_KEY``), as a user's would.
"""

from __future__ import annotations

import argparse
import json
import threading

from loader import Client
from loader.errors import ServiceUnavailableError
from workers.main import EXIT_NO_DAEMON, run_worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    stop = threading.Event()
    codes: list[int] = []

    def work() -> None:
        codes.append(run_worker(args.endpoint, stop_event=stop, connect_timeout_s=args.timeout))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    epochs: list[list[int]] = []
    try:
        with Client(args.endpoint, timeout_s=args.timeout) as client:
            for _ in range(args.epochs):
                epochs.append([int(i) for batch in client.epoch() for i in batch["data"]])
        outcome = "served"
    except ServiceUnavailableError:
        outcome = "refused"
    if outcome == "served":
        stop.set()
    worker.join(args.timeout + 10)
    state = "no daemon" if codes == [EXIT_NO_DAEMON] else ("stopped" if codes == [0] else f"codes {codes}")
    print(json.dumps({"worker": state, "client": outcome, "epochs": epochs}))


if __name__ == "__main__":
    main()

"""Fuzzing the daemon's handlers: random and mutated messages of every kind, from every peer role, while a
legitimate client reads exact epochs throughout. The decoder alone is fuzzed in tests/unit/service/test_protocol.py.

Each hypothesis example is one mutation (keys dropped, values replaced by anything msgpack can carry),
applied to a valid message of every kind and sent by each role: a stranger, a client with a session, a
worker that said hello, and anyone on the data endpoint. ``LOADER_FUZZ_EXAMPLES`` sets the number of
examples (default 800: with the 20 kinds and 4 roles, about 64,000 messages, 3,200 per kind).
"""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader import Client
from loader.service import protocol as P
from loader.service import transport
from loader.service.client.client import query_status
from tests.helpers import wait_until
from tests.integration.conftest import collect_ids, make_config, running_daemon, write_id_files
from tests.unit.service.test_protocol import EXAMPLES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE_COUNT = int(os.environ.get("LOADER_FUZZ_EXAMPLES", "800"))
FILES = [120, 90, 200, 60]

BASES: list[tuple[dict[str, Any], list[Any]]] = []
for _message, _columns in EXAMPLES.values():
    _frames = P.encode(_message, _columns or None)
    BASES.append((msgpack.unpackb(_frames[0], strict_map_key=False), _frames[1:]))
KEYS = sorted({key for head, _ in BASES for key in head} - {"k"})

anything = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(),
        st.text(max_size=12),
        st.binary(max_size=12),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)
interesting = st.one_of(anything, st.sampled_from([0, 1, -1, 2**31, 2**62 - 1, 2**62, 10**9, "", "x" * 5000, [], {}]))
mutations = st.tuples(
    st.sets(st.sampled_from(KEYS), max_size=3),  # keys dropped
    st.dictionaries(st.sampled_from(KEYS), interesting, max_size=4),  # keys replaced or added
    st.booleans(),  # keep the extra frames (columns) or not
)


def _mutated(drop: set[str], replace: dict[str, Any], keep_frames: bool) -> list[list[Any]]:
    out = []
    for head, rest in BASES:
        mutated = {k: v for k, v in head.items() if k not in drop}
        mutated.update(replace)
        out.append([msgpack.packb(mutated, use_bin_type=True), *(rest if keep_frames else [])])
    return out


class Reader(threading.Thread):
    """The legitimate client: exact epochs, one after another, until told to stop."""

    def __init__(self, endpoint: str, ids: list[int]) -> None:
        super().__init__(name="legit-client", daemon=True)
        self.endpoint, self.ids = endpoint, collections.Counter(ids)
        self.stop = threading.Event()
        self.epochs: list[bool] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.endpoint, timeout_s=60) as client:
                while not self.stop.is_set() or len(self.epochs) < 2:
                    self.epochs.append(collections.Counter(collect_ids(client.epoch())) == self.ids)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_no_message_from_any_role_stops_the_daemon_or_spoils_an_epoch(tmp_path):
    ids = write_id_files(tmp_path, len(FILES), FILES)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 16, "shuffle_buffer": 32},
        service={"max_workers": 8, "max_clients": 8},
        workers={"progress_timeout_s": 5.0},
    )
    with running_daemon(config) as daemon:
        assert wait_until(lambda: sum(w["connected"] for w in query_status(daemon.endpoint)["workers"]) == 2, 30)
        reader = Reader(daemon.endpoint, ids)
        reader.start()
        stranger = transport.dealer(daemon.endpoint)
        client = transport.dealer(daemon.endpoint)
        worker = transport.dealer(daemon.endpoint)
        data = transport.push(daemon.data_endpoint)
        try:

            @settings(
                max_examples=EXAMPLE_COUNT,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(mutations)
            def fuzz(mutation: tuple[set[str], dict[str, Any], bool]) -> None:
                # (Re)introduce the roles each example: a fuzzed BYE or HELLO may have changed them.
                client.send(P.encode(P.ClientHello(prefetch=2)))
                worker.send(P.encode(P.Hello(pid=1)))
                for frames in _mutated(*mutation):
                    for peer in (stranger, client, worker, data):
                        peer.send(frames)
                for peer in (stranger, client, worker):  # drop the answers: only the daemon's survival counts
                    while peer.recv(0) is not None:
                        pass

            fuzz()
        finally:
            for channel in (stranger, client, worker, data):
                channel.close()
        reader.stop.set()
        reader.join(120)
        assert reader.error is None, reader.error
        assert reader.epochs and all(reader.epochs), reader.epochs
        status = query_status(daemon.endpoint)
        assert status["rejected_messages"] > EXAMPLE_COUNT * len(BASES)  # most of what was sent was refused
        with Client(daemon.endpoint, timeout_s=30) as after:
            assert collections.Counter(collect_ids(after.epoch())) == collections.Counter(ids)

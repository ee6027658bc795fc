"""CURVE authentication: admitted peers read exact epochs, others get nothing and change nothing.

Over loopback here, and between two "hosts" (a network namespace with its own address and its own
/dev/shm, made by the test) where the machine allows it (docs/security.md).
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from loader import Client
from loader.cli import main as cli_main
from loader.config import LoaderConfig
from loader.config.sections import ServiceConfig
from loader.errors import ConfigError, ServiceUnavailableError
from loader.service import protocol as P
from loader.service import transport
from loader.service.client.client import query_status
from loader.service.daemon.loop import _authentication
from loader.service.transport import auth
from loader.service.transport.sockets import create_key_files
from tests.helpers import REPO_ROOT
from tests.integration.conftest import collect_ids, make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

FILES = [200, 150, 300]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """``loader keys DIR``: the daemon's pair, and a worker's and a client's, admitted."""
    directory = tmp_path_factory.mktemp("keys") / "k"
    assert cli_main(["keys", str(directory)]) == 0
    return {
        "daemon_key": str(directory / "daemon.key_secret"),
        "authorized_keys": str(directory / "authorized"),
        "daemon_public": str(directory / "daemon.key"),
        "worker": str(directory / "peers" / "worker.key_secret"),
        "client": str(directory / "peers" / "client.key_secret"),
        "dir": directory,
    }


def _auth_config(data, keys, bind: str = "tcp://127.0.0.1:*") -> LoaderConfig:
    service = {"bind": bind, "daemon_key": keys["daemon_key"], "authorized_keys": keys["authorized_keys"]}
    return make_config(data, pipeline={"batch_size": 25}, service=service)


@pytest.fixture(scope="module")
def secured(tmp_path_factory, keys):
    data = tmp_path_factory.mktemp("auth-data")
    ids = write_id_files(data, len(FILES), FILES)
    with running_daemon(_auth_config(data, keys)) as daemon:
        yield daemon, ids


def _as(monkeypatch, keys, peer: str | None) -> None:
    if peer is None:
        monkeypatch.delenv(auth.ENV_PEER_KEY, raising=False)
        monkeypatch.delenv(auth.ENV_DAEMON_PUBLIC_KEY, raising=False)
    else:
        monkeypatch.setenv(auth.ENV_PEER_KEY, peer)
        monkeypatch.setenv(auth.ENV_DAEMON_PUBLIC_KEY, keys["daemon_public"])


def test_key_files_are_owner_only(keys):
    for path in (keys["daemon_key"], keys["worker"], keys["client"]):
        assert os.stat(path).st_mode & 0o077 == 0, path


def test_admitted_client_reads_exact_epochs_through_workers_the_daemon_keyed(secured, keys, monkeypatch):
    daemon, ids = secured
    _as(monkeypatch, keys, keys["client"])
    with Client(daemon.endpoint, timeout_s=30) as client:
        for _ in range(2):
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def test_unauthenticated_and_unlisted_peers_get_nothing_and_change_nothing(secured, keys, monkeypatch, tmp_path):
    daemon, ids = secured
    _as(monkeypatch, keys, keys["client"])
    before = query_status(daemon.endpoint)
    stranger_public, stranger_secret = create_key_files(str(tmp_path), "stranger")  # a pair nobody listed
    for peer in (None, stranger_secret):
        _as(monkeypatch, keys, peer)
        with pytest.raises(ServiceUnavailableError):
            query_status(daemon.endpoint, timeout_s=1.0)
        with pytest.raises(ServiceUnavailableError):
            Client(daemon.endpoint, timeout_s=1.0)
        dealer = transport.dealer(daemon.endpoint)
        push = transport.push(daemon.data_endpoint)
        try:
            # Sent, or never taken at all: a peer whose handshake failed may have no connection to queue on.
            dealer.try_send(P.encode(P.Hello(pid=1)), timeout_s=1.0)
            dealer.try_send(P.encode(P.ClientHello()), timeout_s=1.0)
            push.try_send(P.encode(P.FileDone(stream=1, file=0, lease=1, worker="w", sent=0)), timeout_s=1.0)
            assert dealer.recv(1.0) is None
        finally:
            dealer.close()
            push.close()
    _as(monkeypatch, keys, keys["client"])
    after = query_status(daemon.endpoint)
    assert [w["id"] for w in after["workers"]] == [w["id"] for w in before["workers"]]
    assert after["rejected_messages"] == before["rejected_messages"]  # not one message reached it
    with Client(daemon.endpoint, timeout_s=30) as client:
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def test_a_client_whose_keys_the_daemon_refuses_is_told_which_and_not_kept_waiting(
    secured, keys, monkeypatch, tmp_path
):
    """No keys against a keyed daemon, or a key it does not list: zmq's handshake fails at once and is not tried
    again, yet the client waited its whole timeout and then guessed among three causes."""
    import time

    daemon, _ = secured
    _, stranger_secret = create_key_files(str(tmp_path), "stranger")
    cases = (
        (None, "a ZeroMQ peer listens there but refused the handshake: the peer there has CURVE keys and this "),
        (stranger_secret, "the daemon there refused this client's CURVE public key (it is not in its service."),
    )
    for peer, told in cases:
        _as(monkeypatch, keys, peer)
        started = time.monotonic()
        with pytest.raises(ServiceUnavailableError) as caught:
            Client(daemon.endpoint, timeout_s=20.0)
        assert f"no loader daemon answered at {daemon.endpoint} (the handshake failed): " in str(caught.value)
        assert told in str(caught.value)
        assert time.monotonic() - started < 10.0


def test_hand_started_worker_with_keys_serves_an_authenticated_daemon(tmp_path, keys, monkeypatch):
    from workers.main import run_worker

    ids = write_id_files(tmp_path, len(FILES), FILES)
    with running_daemon(_auth_config(tmp_path, keys), start_workers=False) as daemon:
        curve = auth.peer_keys(keys["worker"], keys["daemon_public"])
        stop = threading.Event()
        worker = threading.Thread(
            target=run_worker, args=(auth.Dial(daemon.endpoint, curve),), kwargs={"stop_event": stop}, daemon=True
        )
        worker.start()
        try:
            _as(monkeypatch, keys, keys["client"])
            with Client(daemon.endpoint, timeout_s=30) as client:
                assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        finally:
            stop.set()
            worker.join(10)
        assert not worker.is_alive()


def test_a_daemon_bound_beyond_loopback_needs_authentication_or_a_plain_insecure(caplog):
    with pytest.raises(ConfigError, match="insecure"):
        _authentication(ServiceConfig(bind="tcp://0.0.0.0:5555"))
    with caplog.at_level("WARNING", logger="loader.daemon"):
        assert _authentication(ServiceConfig(bind="tcp://0.0.0.0:5555", insecure=True)) == (None, None)
        assert _authentication(ServiceConfig(bind="tcp://127.0.0.1:5555")) == (None, None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "anyone who reaches the port can read the data" in warnings[0]


def test_half_given_keys_are_refused_with_one_line():
    with pytest.raises(ConfigError, match="daemon_key go together"):
        ServiceConfig(daemon_key="k")
    with pytest.raises(ConfigError, match="both"):
        auth.peer_keys("only-one", None)


def test_ipc_endpoints_are_owner_only(tmp_path):
    router = transport.Router(f"ipc://{tmp_path}/daemon.sock")
    try:
        assert os.stat(tmp_path / "daemon.sock").st_mode & 0o777 == 0o600
    finally:
        router.close()


# -- two hosts --------------------------------------------------------------------------------------------------
def _sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


@pytest.fixture
def second_host():
    """A network namespace joined to this one by a veth pair: (its name, this side's address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("two-host test needs root, ip and unshare (network namespaces)")
    tag = secrets.token_hex(3)
    name, here, there = f"ldr-{tag}", f"lh{tag}", f"lp{tag}"
    subnet = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:4], 16)}"
    if _sh("ip", "netns", "add", name).returncode != 0:
        pytest.skip("this machine does not allow network namespaces (ip netns add failed)")
    try:
        steps = [
            ("ip", "link", "add", here, "type", "veth", "peer", "name", there),
            ("ip", "link", "set", there, "netns", name),
            ("ip", "addr", "add", f"{subnet}.1/30", "dev", here),
            ("ip", "link", "set", here, "up"),
            ("ip", "netns", "exec", name, "ip", "addr", "add", f"{subnet}.2/30", "dev", there),
            ("ip", "netns", "exec", name, "ip", "link", "set", there, "up"),
            ("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _sh(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot wire the second host ({' '.join(step)}): {done.stderr.strip()}")
        yield name, f"{subnet}.1"
    finally:
        _sh("ip", "link", "del", here)
        _sh("ip", "netns", "del", name)


def _on_second_host(name: str, env: dict[str, str], *args: str) -> dict:
    """Run ``tests.integration.netns_peer`` on the second host, with a /dev/shm of its own."""
    script = "mount -t tmpfs tmpfs /dev/shm && exec " + " ".join(
        [sys.executable, "-m", "tests.integration.netns_peer", *args]
    )
    done = subprocess.run(
        ["ip", "netns", "exec", name, "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_second_host_authenticated_peers_read_exact_epochs_and_others_get_nothing(tmp_path, keys, second_host):
    name, address = second_host
    ids = write_id_files(tmp_path, len(FILES), FILES)
    with running_daemon(_auth_config(tmp_path, keys, bind=f"tcp://{address}:*"), start_workers=False) as daemon:
        admitted = {auth.ENV_PEER_KEY: keys["worker"], auth.ENV_DAEMON_PUBLIC_KEY: keys["daemon_public"]}
        stranger = {auth.ENV_PEER_KEY: "", auth.ENV_DAEMON_PUBLIC_KEY: ""}
        # Unauthenticated first: its worker and client reach nothing, so the daemon has no worker at all.
        refused = _on_second_host(name, stranger, daemon.endpoint, "--epochs", "1", "--timeout", "3")
        assert refused == {"worker": "no daemon", "client": "refused", "epochs": []}
        assert daemon.rejected_messages == 0 and not daemon.coordinator.workers
        # Authenticated: a worker and a client on the second host; only that worker reads the files.
        served = _on_second_host(name, admitted, daemon.endpoint, "--epochs", "2", "--timeout", "30")
        assert served["client"] == "served"
        assert [collections.Counter(e) for e in served["epochs"]] == [collections.Counter(ids)] * 2


def test_loader_in_process_ignores_daemon_keys_on_its_private_endpoint(tmp_path, keys):
    import loader

    ids = write_id_files(tmp_path, len(FILES), FILES)
    config = _auth_config(tmp_path, keys)
    with loader.Loader(config) as local:
        assert collections.Counter(collect_ids(local.epoch())) == collections.Counter(ids)


def test_loader_worker_takes_its_keys_from_a_config_and_refuses_half_of_them(tmp_path, keys):
    config = tmp_path / "worker.toml"
    config.write_text(f'[source]\nfiles = ["*.npy"]\n[service]\npeer_key = "{keys["worker"]}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "loader.cli", "worker", "--connect", "tcp://127.0.0.1:1", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert "both" in done.stderr


def test_a_client_and_loader_status_given_a_config_take_its_keys(secured, keys, monkeypatch, tmp_path, capsys):
    # The config that names the daemon's address names the keys for it; the environment has none.
    daemon, ids = secured
    _as(monkeypatch, keys, None)
    config = tmp_path / "peer.toml"
    config.write_text(
        f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "{daemon.endpoint}"\n'
        f'peer_key = "{keys["client"]}"\ndaemon_public_key = "{keys["daemon_public"]}"\n'
    )
    with Client(str(config), timeout_s=30) as client:
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
    assert cli_main(["status", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"]
    # Half a pair in the config, the other half nowhere: one line naming both settings.
    config.write_text(
        f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "{daemon.endpoint}"\npeer_key = "{keys["client"]}"\n'
    )
    with pytest.raises(ConfigError, match="service.daemon_public_key"):
        Client(str(config), timeout_s=1.0)


def test_no_answer_to_keys_from_a_config_blames_the_keys_not_the_environment(keys, monkeypatch, tmp_path, capsys):
    # The config gave this side its keys: "set LOADER_PEER_KEY" sent the user after keys they already have.
    _as(monkeypatch, keys, None)
    config = tmp_path / "peer.toml"
    config.write_text(
        '[source]\nfiles = ["*.npy"]\n[service]\nbind = "ipc://' + str(tmp_path / "nobody") + '"\n'
        f'peer_key = "{keys["client"]}"\ndaemon_public_key = "{keys["daemon_public"]}"\n'
    )
    with socket.socket(socket.AF_UNIX) as listening:  # something listens there and gives no answer
        listening.bind(str(tmp_path / "nobody"))
        listening.listen()
        with pytest.raises(ServiceUnavailableError, match="This side has CURVE keys"):
            Client(str(config), timeout_s=0.2)
        assert cli_main(["status", str(config), "--timeout", "0.2"]) != 0
        assert "This side has CURVE keys" in capsys.readouterr().err


def test_a_daemons_own_keyed_config_given_to_a_client_without_keys_is_refused_at_once(
    keys, monkeypatch, tmp_path, capsys
):
    # The daemon's config (daemon_key, authorized_keys) and no peer keys anywhere: the client waited its whole
    # timeout, then said the daemon might listen elsewhere.
    _as(monkeypatch, keys, None)
    config = tmp_path / "daemon.toml"
    config.write_text(
        f'[source]\nfiles = ["*.npy"]\n[service]\nbind = "ipc://{tmp_path / "daemon"}"\n'
        f'daemon_key = "{keys["daemon_key"]}"\nauthorized_keys = "{keys["authorized_keys"]}"\n'
    )
    with pytest.raises(ConfigError, match=r"sets service.daemon_key, so its daemon answers only peers with CURVE keys"):
        Client(str(config), timeout_s=2.0)
    assert cli_main(["status", str(config), "--timeout", "2"]) != 0
    assert "LOADER_PEER_KEY and LOADER_DAEMON_PUBLIC_KEY (`loader keys DIR` makes them" in capsys.readouterr().err
    _as(monkeypatch, keys, keys["client"])  # the environment's keys serve: no error before the (absent) answer
    with pytest.raises(ServiceUnavailableError):
        Client(str(config), timeout_s=0.2)

"""configs/kubernetes/: every manifest valid against the Kubernetes schemas (offline), and the parts agree."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from loader.config import LoaderConfig
from loader.config.overrides import from_environ

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # in the test extra: present in CI
yaml = pytest.importorskip("yaml")

MANIFESTS = Path(__file__).resolve().parents[2] / "configs" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"  # the oldest release still in wide use whose schemas the package bundles


def documents() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.fixture
def offline(monkeypatch):
    """The schemas are bundled: any attempt to reach the network fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"kubernetes-validate tried to connect: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_every_manifest_is_valid(offline):
    docs = documents()
    assert {kind for kind, _ in docs} == {
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "Job",
        "HorizontalPodAutoscaler",
    }
    for (kind, name), doc in docs.items():
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{kind}/{name}: {exc}")


def test_a_broken_manifest_is_caught(offline):
    broken = documents()[("Deployment", "loader-daemon")]
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def env_of(doc: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(doc).get("env", [])}


def test_the_parts_point_at_each_other():
    docs = documents()
    daemon, workers = docs[("Deployment", "loader-daemon")], docs[("Deployment", "loader-worker")]
    trainer = docs[("Job", "trainer")]
    daemon_env = env_of(daemon)
    # The config in the ConfigMap, with the daemon's overrides for the network, is a valid config.
    toml = tomllib.loads(docs[("ConfigMap", "loader-config")]["data"]["train.toml"])
    network = {k: v for k, v in daemon_env.items() if k in ("LOADER_SERVICE__BIND", "LOADER_SERVICE__METRICS")}
    for override in from_environ(network):
        section, key = override.key.split(".")
        toml.setdefault(section, {})[key] = override.value
    config = LoaderConfig.from_dict(toml)
    metrics_port = int(config.service.metrics.rsplit(":", 1)[1])
    control_port = int(config.service.bind.rsplit(":", 1)[1])
    annotations = daemon["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == metrics_port
    ports = {p["name"]: p["containerPort"] for p in container(daemon)["ports"]}
    assert ports == {"control": control_port, "metrics": metrics_port}
    assert container(daemon)["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container(daemon)["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Both Services select the daemon pod and are headless (the data port is chosen at bind time).
    pod_labels = daemon["spec"]["template"]["metadata"]["labels"]
    for name in ("loader", "loader-workers"):
        service = docs[("Service", name)]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert control_port in [p["port"] for p in service["spec"]["ports"]]
    assert docs[("Service", "loader-workers")]["spec"]["publishNotReadyAddresses"] is True
    assert f"tcp://loader-workers:{control_port}" in container(workers)["command"]
    assert env_of(trainer)["LOADER_ADDRESS"] == f"tcp://loader:{control_port}"
    # Every key file or directory named in an env var is projected from the Secret where the name says,
    # under the names `loader keys` writes and the config keys and variables the code reads.
    secret_keys = set(docs[("Secret", "loader-curve")]["stringData"])
    for doc in (daemon, workers, trainer):
        items = {}
        for volume in doc["spec"]["template"]["spec"]["volumes"]:
            if volume.get("secret", {}).get("secretName") == "loader-curve":
                items = {item["path"]: item["key"] for item in volume["secret"]["items"]}
        assert set(items.values()) <= secret_keys
        for value in env_of(doc).values():
            if value and value.startswith("/etc/loader/keys/"):
                relative = value[len("/etc/loader/keys/") :]
                assert relative in items or any(path.startswith(relative + "/") for path in items), value
    assert env_of(daemon)["LOADER_SERVICE__DAEMON_KEY"].endswith("daemon.key_secret")
    assert env_of(daemon)["LOADER_SERVICE__AUTHORIZED_KEYS"].endswith("/authorized")
    for peer in (workers, trainer):
        assert env_of(peer)["LOADER_DAEMON_PUBLIC_KEY"].endswith("/daemon.key")
        assert env_of(peer)["LOADER_PEER_KEY"].endswith(".key_secret")


def test_the_slurm_script_parses_and_uses_the_conventions():
    import shutil
    import subprocess

    script = MANIFESTS.parent / "slurm" / "train.sbatch"
    bash = shutil.which("bash")
    assert bash is not None
    result = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    text = script.read_text()
    assert text.count("#SBATCH hetjob") == 2  # three components
    assert "--address-file" in text and "export LOADER_ADDRESS=" in text and "torchrun" in text

"""deploy/ checked offline: no container runtime runs here.

Kubernetes manifests against the API schemas (kubernetes-validate, strict), the compose
file against the Compose Specification's JSON schema (vendored in check-jsonschema), and
every reference they make into the code: CLI flags, ports, probe paths, environment
variables, secret keys, the policy they mount, metric names the dashboard plots.
"""

import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient

from engine.config import EngineConfig
from engine.entrypoints.server import create_engine_app
from engine.metrics import EngineMetrics
from gateway.app import create_app
from gateway.backends.balance import Balancer
from gateway.backends.health import ReplicaMetrics
from gateway.cli import build_parser
from gateway.limits import Limiter
from gateway.policy import load_policy, parse_policy
from gateway.stats.counters import Stats
from tests.fake_runner import FakeRunner
from tests.servers import running_engine

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
POLICY = ROOT / "router_policies" / "examples" / "replicas.yaml"
K8S_VERSION = kubernetes_validate.latest_version()
K8S_WORKLOADS = [("StatefulSet", "tiergate-engine"), ("Deployment", "tiergate-gateway")]
SECRET_ENV = [
    "TIERGATE_API_KEY",
    "TIERGATE_ADMIN_KEY",
    "TIERGATE_METRICS_KEY",
    "TIERGATE_SALT_SECRET",
]
EXIT_MARGIN_S = 3  # the drain's abort margin: the process is gone ~3 s after the grace


def k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def k8s(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def gateway() -> Iterator[TestClient]:
    """The gateway on the deploy policy (its replicas need not run to answer probes)."""
    app = create_app(parse_policy(POLICY.read_text(), env=dict.fromkeys(SECRET_ENV, "k")))
    with TestClient(app) as client:
        client.headers["authorization"] = "Bearer k"  # the metrics key, for /metrics
        yield client


@pytest.fixture(scope="module")
def engine() -> Iterator[TestClient]:
    # started before serving, as `tiergate engine` does
    with (
        running_engine(EngineConfig(model="fake"), FakeRunner()) as engine,
        TestClient(create_engine_app(engine, "smollm2")) as client,
    ):
        yield client


def answers(client: TestClient, path: str) -> bool:
    return client.get(path).status_code == 200


# ---------------------------------------------------------------- schemas


@pytest.mark.parametrize("doc", k8s_docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())["resources"]
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(listed) == sorted(files)


def test_compose_file_is_valid() -> None:
    schema_file = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    schema = json.loads(schema_file.read_text())
    jsonschema.validate(compose(), schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema does bite
        jsonschema.validate({"services": {"x": {"stop_grace_period": []}}}, schema)


# ---------------------------------------------------------------- commands, ports, probes


def test_container_commands_parse_with_the_cli() -> None:
    services = compose()["services"]
    commands = [services[s]["command"] for s in ("engine-1", "engine-2", "gateway-1")]
    commands += [container(k8s(k, n))["args"] for k, n in K8S_WORKLOADS]
    commands.append(dockerfile_json("CMD"))
    for command in commands:
        build_parser().parse_args(command)  # exits on an unknown flag


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_kubernetes_probes_ports_and_services_match_the_code(
    gateway: TestClient, engine: TestClient
) -> None:
    for kind, name in K8S_WORKLOADS:
        pod = container(k8s(kind, name))
        port = pod["ports"][0]
        assert int(flag(pod["args"], "--port")) == port["containerPort"]
        client = gateway if pod["args"][0] == "serve" else engine
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in pod:
                assert answers(client, pod[probe]["httpGet"]["path"])
                assert pod[probe]["httpGet"]["port"] == port["name"]
        service = k8s("Service", name)
        assert service["spec"]["ports"][0]["targetPort"] == port["name"]
        assert service["spec"]["selector"] == k8s(kind, name)["spec"]["selector"]["matchLabels"]
    assert (
        container(k8s("Deployment", "tiergate-gateway"))["readinessProbe"]["httpGet"]["path"]
        == "/ready"
    )


def test_graceful_termination_outlasts_the_drain() -> None:
    grace = load_policy(POLICY, env=dict.fromkeys(SECRET_ENV, "k")).server.shutdown_grace_s
    for kind, name in K8S_WORKLOADS:
        pod_spec = k8s(kind, name)["spec"]["template"]["spec"]
        pod = pod_spec["containers"][0]
        drain = (
            grace if pod["args"][0] == "serve" else float(flag(pod["args"], "--shutdown-grace-s"))
        )
        pre_stop = pod["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pod_spec["terminationGracePeriodSeconds"] >= pre_stop + drain + EXIT_MARGIN_S
    for name, service in compose()["services"].items():
        if service.get("image") == "tiergate:cpu":
            assert float(service["stop_grace_period"].rstrip("s")) >= grace + EXIT_MARGIN_S, name


def test_budgets_and_autoscaler_target_real_workloads() -> None:
    for name in ("tiergate-gateway", "tiergate-engine"):
        kind = "Deployment" if name.endswith("gateway") else "StatefulSet"
        labels = k8s(kind, name)["spec"]["template"]["metadata"]["labels"]
        assert k8s("PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"] == labels
    target = k8s("HorizontalPodAutoscaler", "tiergate-gateway")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "tiergate-gateway")
    assert "cpu" in container(k8s("Deployment", "tiergate-gateway"))["resources"]["requests"]


# ---------------------------------------------------------------- policy, env, secrets


def policy_env_names() -> tuple[set[str], set[str]]:
    """(variables the policy needs, variables it can do without) plus api_key_env names."""
    text = POLICY.read_text()
    needed = set(re.findall(r"\$\{(\w+)\}", text)) | set(re.findall(r"api_key_env: (\w+)", text))
    optional = set(re.findall(r"\$\{(\w+):-", text))
    return needed, optional


def test_the_configmap_is_the_policy_file_verbatim() -> None:
    assert k8s("ConfigMap", "tiergate-policy")["data"] == {"replicas.yaml": POLICY.read_text()}
    pod = container(k8s("Deployment", "tiergate-gateway"))
    mount = pod["volumeMounts"][0]["mountPath"]
    assert flag(pod["args"], "--policy") == f"{mount}/replicas.yaml"


def test_kubernetes_env_and_secrets_cover_the_policy() -> None:
    pod = container(k8s("Deployment", "tiergate-gateway"))
    env = {e["name"]: e for e in pod["env"]}
    needed, optional = policy_env_names()
    assert needed | optional <= env.keys()  # defaults are for a laptop, not a cluster
    secret_keys = k8s("Secret", "tiergate-keys")["stringData"].keys()
    for pod_env in [
        env,
        {e["name"]: e for e in container(k8s("StatefulSet", "tiergate-engine"))["env"]},
    ]:
        for entry in pod_env.values():
            if "valueFrom" in entry:
                ref = entry["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "tiergate-keys" and ref["key"] in secret_keys
    values = {n: e.get("value", "secret") for n, e in env.items()}
    policy = load_policy(POLICY, env=values)
    engines = k8s("StatefulSet", "tiergate-engine")
    engine_port = int(flag(container(engines)["args"], "--port"))
    expected = {
        f"http://tiergate-engine-{i}.{engines['spec']['serviceName']}:{engine_port}/v1"
        for i in range(engines["spec"]["replicas"])
    }
    assert {d.api_base for d in policy.tiers["small"].deployments} == expected
    redis = k8s("Service", "tiergate-redis")["spec"]["ports"][0]["port"]
    assert policy.limits.redis_url == f"redis://tiergate-redis:{redis}/0"


def test_compose_env_covers_the_policy() -> None:
    services = compose()["services"]
    gateway = services["gateway-1"]
    needed, optional = policy_env_names()
    assert needed | optional <= gateway["environment"].keys()
    env_example = (DEPLOY / ".env.example").read_text()
    for name, value in gateway["environment"].items():
        if value.startswith("${"):  # from deploy/.env
            assert f"\n{name}=" in "\n" + env_example
    policy = load_policy(
        POLICY, env={k: "x" if v.startswith("${") else v for k, v in gateway["environment"].items()}
    )
    for dep, engine in zip(
        policy.tiers["small"].deployments, ["engine-1", "engine-2"], strict=True
    ):
        port = flag(services[engine]["command"], "--port")
        assert dep.api_base == f"http://{engine}:{port}/v1"
        assert (
            services[engine]["environment"]["TIERGATE_HEALTH_URL"]
            == f"http://127.0.0.1:{port}/health"
        )
    mount = gateway["volumes"][0].split(":")
    assert (DEPLOY / mount[0]).resolve() == POLICY and flag(
        gateway["command"], "--policy"
    ) == mount[1]


def test_prometheus_and_nginx_reach_every_replica(gateway: TestClient, engine: TestClient) -> None:
    services = compose()["services"]
    prometheus = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prometheus["scrape_configs"]}
    mounted = {s["target"] for s in services["prometheus"]["secrets"]}
    targets = []
    for job in jobs.values():
        assert job["authorization"]["credentials_file"] in mounted
        targets += job["static_configs"][0]["targets"]
    ours = [n for n, s in services.items() if s.get("image") == "tiergate:cpu"]
    port_of = {n: flag(services[n]["command"], "--port") for n in ours}
    assert sorted(targets) == sorted(f"{n}:{p}" for n, p in port_of.items())
    nginx = (DEPLOY / "compose" / "nginx.conf").read_text()
    upstreams = re.findall(r"server (gateway-\d):(\d+)", nginx)
    assert sorted(upstreams) == sorted(
        (n, p) for n, p in port_of.items() if n.startswith("gateway")
    )
    assert answers(gateway, "/metrics") and answers(engine, "/metrics")


def test_the_dashboard_plots_metrics_that_exist() -> None:
    names = set()
    stats = Stats()
    Limiter(stats.registry)  # registers the limits' counters, as the app does
    stats.registry.register(ReplicaMetrics(Balancer(), dict))  # and the replicas' gauges
    for registry in (stats.registry, EngineMetrics("m").registry):
        for collector in registry.collect():
            names |= {collector.name, f"{collector.name}_total", f"{collector.name}_bucket"}
    dashboard = json.loads((DEPLOY / "compose/grafana/dashboards/tiergate.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\btiergate_\w+", e)}
    assert used and used <= names, used - names


# ---------------------------------------------------------------- the image


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def dockerfile_json(instruction: str) -> list[str]:
    return json.loads(re.search(rf"^{instruction} (\[.*\])$", dockerfile(), re.M).group(1))


def test_dockerfile_runs_as_non_root_and_checks_ready() -> None:
    text = dockerfile()
    user = re.search(r"^USER (\S+)$", text, re.M).group(1)
    assert user.isdigit() and int(user) > 0
    assert "TIERGATE_HEALTH_URL=http://127.0.0.1:8000/ready" in text
    assert "HEALTHCHECK" in text and "TIERGATE_HEALTH_URL" in text.split("HEALTHCHECK")[1]
    assert flag(dockerfile_json("CMD"), "--port") == "8000"
    for source in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / source).exists(), source
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for source in re.findall(r"^COPY (\S+)", text, re.M):
        assert f"!{source.split('/')[0]}" in ignore.replace("/\n", "\n")


def test_the_kubernetes_schemas_bite() -> None:
    doc = k8s("Deployment", "tiergate-gateway")
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_wheel_carries_every_file_the_code_loads(tmp_path: Path) -> None:
    """A pip install (the image's) must hold the data files beside gateway/ and engine/ code:
    the verifiers' weights, the kernels' C sources, the dashboard."""
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("tiergate-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "gateway", "engine"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    data = [f for f in tracked if not f.endswith(".py")]
    assert any(f.endswith(".onnx") for f in data)
    assert [f for f in data if f not in inside] == []

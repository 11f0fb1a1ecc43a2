"""The deployment files, validated offline (no Docker or Kubernetes runs here): the
compose file against the Compose specification's schema, the Kubernetes manifests
against the Kubernetes schemas, the KEDA ScaledObject against KEDA's documented fields;
and every burnwatch command, setting and rule they carry is checked by the same code
the tests run locally (the CLI's parser, the settings model, the rules loader), and the
Grafana dashboards' queries run on the embedded engine against the migrated schema."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from detector.rules import load_rules
from detector.settings import ENV, Settings, load_settings
from streams.cli import build_parser
from tests.conftest import ROOT

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
K8S = [doc for doc in yaml.safe_load_all((ROOT / "deploy/k8s/worker.yaml").read_text()) if doc]
BRIDGE = [doc for doc in yaml.safe_load_all((ROOT / "deploy/k8s/bridge.yaml").read_text()) if doc]
DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
KNOWN = set(ENV.values())


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with nothing exported: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def settings_from(env: dict[str, str]) -> Settings:
    """The worker's settings from these variables, read by ``load_settings``; an unknown
    ``BURNWATCH_`` variable (a typo the worker would ignore) fails."""
    unknown = sorted(var for var in env if var.startswith(("BURNWATCH_", "SLACK_")) and var not in KNOWN)
    assert not unknown, f"settings the worker does not read: {unknown}"
    return load_settings(environ=env)


def secret(name: str) -> dict[str, str]:
    """The worker manifest's Secret of that name: its keys and values."""
    (found,) = [doc for doc in K8S if doc["kind"] == "Secret" and doc["metadata"]["name"] == name]
    return found["stringData"]


def pod_env(container: dict) -> dict[str, str]:
    """A container's variables: values, and keys of the manifest's Secrets (``secretKeyRef``)."""
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret(ref["name"])[ref["key"]]
    return env


def test_compose_file_follows_the_compose_specification():
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    assert schema["$schema"].startswith("https://json-schema.org/draft-07/")  # written without the '#'
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(COMPOSE), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_compose_stack_has_kafka_kraft_clickhouse_two_workers_grafana_and_start_order():
    services = COMPOSE["services"]
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert {"kafka", "clickhouse", "worker-1", "worker-2", "grafana", "simulator"} <= services.keys()
    assert services["simulator"]["profiles"] == ["sim"]
    for name in ("kafka", "clickhouse", "worker-1", "worker-2", "grafana"):
        assert "healthcheck" in services[name], name
    # The image's health check asks for a worker's /healthz: the simulator, from the same image, serves none.
    assert services["simulator"]["healthcheck"] == {"disable": True}
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    assert "/healthz' % os.environ.get('BURNWATCH_WEB_PORT', '6066')" in dockerfile
    for worker in ("worker-1", "worker-2"):
        assert services[worker]["depends_on"] == {"kafka": {"condition": "service_healthy"},
                                                  "clickhouse": {"condition": "service_healthy"}}  # fmt: skip
    for volume in [v.split(":")[0] for s in services.values() for v in s.get("volumes", []) if v.startswith("./")]:
        assert (ROOT / volume).exists(), volume


@pytest.mark.parametrize("service", ["worker-1", "worker-2", "simulator"])
def test_compose_burnwatch_commands_and_settings_are_the_ones_tested_here(service):
    spec = COMPOSE["services"][service]
    args = build_parser().parse_args(spec["command"])  # the CLI the tests drive
    env = {k: _interpolate(str(v)) for k, v in spec["environment"].items()}
    settings = settings_from(env)
    assert settings.partitions == int(COMPOSE["services"]["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"])
    if service.startswith("worker"):
        assert args.func.__name__ == "cmd_worker"
        assert settings.clickhouse_dsn.startswith("http://") and "@clickhouse:8123" in settings.clickhouse_dsn
        health = " ".join(spec["healthcheck"]["test"])
        assert f":{settings.web_port}/healthz" in health and settings.web_host == "0.0.0.0"
        assert "./rules:" + str(settings.rules_path) + ":ro" in spec["volumes"]  # the rules the tests load


def test_grafana_provisioning_points_the_dashboards_at_the_clickhouse_data_source():
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/clickhouse.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "grafana-clickhouse-datasource" and source["jsonData"]["host"] == "clickhouse"
    grafana = COMPOSE["services"]["grafana"]
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_INSTALL_PLUGINS"]
    assert {d.stem for d in DASHBOARDS} == {"fleet-cost", "waste", "idle-gpus", "open-incidents", "billing"}
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == source["uid"], (path.name, panel["title"])


def _grafana_sql(sql: str, db: str) -> str:
    """A panel's query as the ClickHouse plugin sends it, for the last 30 days."""
    sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 >= now() - INTERVAL 30 DAY AND \1 <= now()", sql)
    sql = sql.replace("$__fromTime", "(now() - INTERVAL 30 DAY)").replace("$__toTime", "now()")
    return sql.replace("burnwatch.", f"{db}.")


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_query_runs_on_the_schema(path, store):
    import time

    from detector.store import EventBatch
    from tests.helpers import scrape, usage

    now = time.time()
    batch = EventBatch()
    for minute in range(90):
        batch.extend([usage(now - 3600 * 2 + minute * 60), *scrape(now - 3600 * 2 + minute * 60, [1.0, 80.0])])
    store.events.insert(batch)
    for panel in json.loads(path.read_text())["panels"]:
        for target in panel["targets"]:
            rows = store.query(_grafana_sql(target["rawSql"], store.db))
            if path.stem in ("fleet-cost", "idle-gpus"):
                assert rows, panel["title"]  # the two hours of usage above are in them


def test_billing_dashboard_shows_the_reconcile_report_of_its_time_range(store):
    """The FOCUS fixture ingested: the table panel is ``burnwatch query reconcile`` over the
    dashboard's range, row for row, and the daily series adds up to it; the range cuts (the
    fixture's October charge is not in November's), and a range before the bill shows nothing."""
    from datetime import UTC, datetime

    from detector.billing.ingest import ingest_files

    ingest_files(store, ROOT / "tests/data/focus/charges-1.2.csv")
    panels = {p["type"]: p["targets"][0]["rawSql"] for p in json.loads(
        (ROOT / "deploy/grafana/dashboards/billing.json").read_text())["panels"]}  # fmt: skip

    def panel(kind: str, since: datetime, until: datetime) -> list[dict]:
        def at(t: datetime) -> str:
            return f"toDateTime({int(t.timestamp())})"  # as the ClickHouse plugin expands $__fromTime

        sql = panels[kind].replace("$__fromTime", at(since)).replace("$__toTime", at(until))
        return store.query(sql.replace("burnwatch.", f"{store.db}."))

    since, until = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    report = store.named("reports/reconcile", {"since": since, "until": until, "team": ""})
    table = panel("table", since, until)
    assert report and any(r["billed_usd"] for r in report)
    key = lambda r: (r["day"], r["team"], r["resource_id"])  # noqa: E731
    assert sorted(table, key=key) == sorted(report, key=key)
    series = panel("timeseries", since, until)
    # the instant's UTC day: clickhouse-connect gives a DateTime in the store's zone, the machine's when embedded
    assert [r["time"].astimezone(UTC).date() for r in series] == sorted({r["day"] for r in report})
    for point in series:
        day = [r for r in report if r["day"] == point["time"].astimezone(UTC).date()]
        assert point["billed_usd"] == pytest.approx(sum(r["billed_usd"] for r in day))
        assert point["claimed_usd"] == pytest.approx(sum(r["claimed_usd"] for r in day))
    november = datetime(2026, 11, 1, tzinfo=UTC)
    assert {r["day"].month for r in report} == {10, 11}
    assert {r["day"].month for r in panel("table", november, until)} == {11}
    assert [r["time"].month for r in panel("timeseries", november, until)] == [11]
    before = datetime(2026, 9, 1, tzinfo=UTC)
    assert panel("table", before, since) == [] and panel("timeseries", before, since) == []


def test_kubernetes_manifests_validate_against_the_kubernetes_schemas():
    kinds = [doc["kind"] for doc in K8S]
    assert kinds == ["ConfigMap", "Secret", "Secret", "Deployment", "PodDisruptionBudget", "Service", "ScaledObject"]
    assert [doc["kind"] for doc in BRIDGE] == ["ConfigMap", "Deployment"]
    for doc in K8S + BRIDGE:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # a CRD: not in the Kubernetes schemas (checked below)
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


# The ScaledObject fields we use, as KEDA documents them (keda.sh/docs, "ScaledObject
# specification" and the "Apache Kafka" scaler): the package with Kubernetes schemas does
# not carry CRDs, so this is ours. Trigger metadata values are strings in KEDA.
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"], "additionalProperties": False,
                                   "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                                  "apiVersion": {"type": "string"}}},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["type", "metadata"],
                    "properties": {
                        "type": {"const": "kafka"},
                        "metadata": {
                            "type": "object", "required": ["bootstrapServers", "consumerGroup"],
                            "additionalProperties": {"type": "string"},
                            "properties": {
                                "lagThreshold": {"type": "string", "pattern": "^[0-9]+$"},
                                "activationLagThreshold": {"type": "string", "pattern": "^[0-9]+$"},
                                "offsetResetPolicy": {"enum": ["earliest", "latest"]},
                                "allowIdleConsumers": {"enum": ["true", "false"]},
                            },
                        },
                    },
                }},
            },
        },
    },
}  # fmt: skip


def test_keda_scales_the_worker_on_its_consumer_lag_up_to_the_partition_count():
    docs = {doc["kind"]: doc for doc in K8S}
    scaled, deployment = docs["ScaledObject"], docs["Deployment"]
    jsonschema.validate(scaled, SCALED_OBJECT)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    settings = settings_from(pod_env(container))
    spec = scaled["spec"]
    (trigger,) = spec["triggers"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert "replicas" not in deployment["spec"]  # the autoscaler owns it
    assert spec["maxReplicaCount"] == settings.partitions  # more would sit idle
    assert spec["minReplicaCount"] >= 1  # Slack's callbacks and the digest need a worker
    assert trigger["metadata"]["consumerGroup"] == settings.app_id  # Faust's group is the app id
    assert trigger["metadata"]["bootstrapServers"] == settings.kafka_bootstrap
    assert trigger["metadata"]["allowIdleConsumers"] == "false"


def test_workers_leave_one_at_a_time_in_a_rollout_and_a_drain():
    """Each worker that joins or leaves rebalances the group (every partition's state handed over): a rollout
    replaces one pod at a time, the new one first, and a drain evicts one at a time (a PodDisruptionBudget on the
    worker pods). Without them a drain could evict every worker at once."""
    docs = {doc["kind"]: doc for doc in K8S}
    deployment, budget = docs["Deployment"], docs["PodDisruptionBudget"]
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}  # fmt: skip
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_worker_pod_runs_the_tested_command_with_its_rules_and_secrets(tmp_path):
    docs = {doc["kind"]: doc for doc in K8S}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert build_parser().parse_args(container["args"]).func.__name__ == "cmd_worker"
    settings = settings_from(pod_env(container))
    port = next(p for p in container["ports"] if p["name"] == "web")["containerPort"]
    assert port == settings.web_port and settings.web_host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "web"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "rules")
    assert Path(mount["mountPath"]) == settings.rules_path
    for name, text in docs["ConfigMap"]["data"].items():
        (tmp_path / name).write_text(text)
    assert load_rules(tmp_path).rules  # the loader the worker uses
    settings_from(secret("burnwatch-slack"))  # every key is a setting the worker reads
    assert container["envFrom"] == [{"secretRef": {"name": "burnwatch-slack"}}]


def test_the_clickhouse_password_is_in_a_secret_not_in_the_pod_spec():
    docs = {doc["kind"]: doc for doc in K8S}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    dsn = next(var for var in container["env"] if var["name"] == "BURNWATCH_CLICKHOUSE_DSN")
    assert "value" not in dsn and dsn["valueFrom"]["secretKeyRef"]["name"] == "burnwatch-clickhouse"
    assert not [var for var in container["env"] if "@" in var.get("value", "")]  # no user:password@ in plain env
    settings = settings_from(pod_env(container))
    assert settings.clickhouse_dsn.startswith("http://") and settings.clickhouse_dsn.endswith("@clickhouse:8123")


def _dockerfile_user() -> int:
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+)(?::\d+)?$", dockerfile, re.M)
    return int(user)


@pytest.mark.parametrize("manifest", ["worker", "bridge"])
def test_pods_run_as_the_images_user_on_a_read_only_root_with_nothing_more(manifest: str):
    """Never root, no privilege to gain, no capability, the runtime's seccomp profile, a read-only
    root file system; what the process writes (the worker: Faust's data dir; both: /tmp, matplotlib's
    cache) is an emptyDir volume. The uid is the image's own user, whose data dir the image makes."""
    docs = K8S if manifest == "worker" else BRIDGE
    pod = next(doc for doc in docs if doc["kind"] == "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == _dockerfile_user() != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = {Path(m["mountPath"]) for m in container["volumeMounts"] if m["name"] in empty and not m.get("readOnly")}
    assert Path("/tmp") in writable
    if manifest == "worker":
        data_dir = settings_from(pod_env(container)).data_dir
        assert data_dir in writable
        dockerfile = (ROOT / "deploy/Dockerfile").read_text()
        assert f"BURNWATCH_DATA_DIR={data_dir}" in dockerfile
        assert re.search(rf"mkdir -p {data_dir}\b.*\n.*chown burnwatch:burnwatch {data_dir}\b", dockerfile)


def test_the_bridge_pod_runs_the_shipped_config_on_the_workers_topics_and_is_scraped(capsys):
    """The bridge's ConfigMap is deploy/bridge.yaml byte for byte, which the bridge's loader takes;
    its command parses as ``burnwatch bridge --config FILE`` on the mounted file; it publishes to the
    worker's broker with the worker's partition count; its /metrics listens on all interfaces of the
    pod, on the port Prometheus is told to scrape."""
    from detector.ingest.config import load_bridge_config

    config_map, deployment = BRIDGE
    shipped = (ROOT / "deploy/bridge.yaml").read_text()
    assert config_map["data"] == {"bridge.yaml": shipped}
    config = load_bridge_config(ROOT / "deploy/bridge.yaml")
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.func.__name__ == "cmd_bridge" and not args.once
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bridge", "--help"])
    help_text = capsys.readouterr().out
    assert all(flag in help_text for flag in container["args"] if flag.startswith("--"))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert Path(args.bridge_config) == Path(mount["mountPath"]) / "bridge.yaml"
    worker = {doc["kind"]: doc for doc in K8S}["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    bridge, worker_settings = settings_from(pod_env(container)), settings_from(pod_env(worker))
    assert (bridge.kafka_bootstrap, bridge.partitions) == (worker_settings.kafka_bootstrap, worker_settings.partitions)
    host, _, port = config.listen.rpartition(":")
    assert host == "0.0.0.0"
    assert int(port) == next(p for p in container["ports"] if p["name"] == "metrics")["containerPort"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == port
    assert deployment["spec"]["replicas"] == 1  # a second bridge would publish (and bill) every host twice
    probe = container["livenessProbe"]["httpGet"]  # a bridge whose loop is stuck is restarted
    assert probe["port"] == "metrics" and probe["path"] == "/metrics"  # the one path serve_metrics answers


def test_the_rules_configmap_carries_the_shipped_prices_routing_and_limits(tmp_path):
    """A ConfigMap of rules.yaml alone priced every alert on the bridge's usage at $0.00/h: the files
    read beside the rules are the repository's, byte for byte (they cannot drift), and the worker's
    loader takes the ConfigMap's files with nothing to warn of."""
    from detector.rules import consistency_warnings

    data = next(doc for doc in K8S if doc["kind"] == "ConfigMap")["data"]
    assert sorted(data) == ["limits.yaml", "pricing.yaml", "routing.yaml", "rules.yaml"]
    for name in ("pricing.yaml", "routing.yaml", "limits.yaml"):
        assert data[name] == (ROOT / "rules" / name).read_text(), f"{name} differs from rules/{name}"
        (tmp_path / name).write_text(data[name])
    (tmp_path / "rules.yaml").write_text(data["rules.yaml"])
    ruleset = load_rules(tmp_path)
    assert ruleset.rules and ruleset.pricing.instances
    assert consistency_warnings(ruleset) == []


def test_the_liveness_probe_outlasts_the_workers_own_stall_exit():
    """``/healthz`` answers 503 from a worker's first failed write (a ClickHouse blip): that is for
    readiness. Liveness must not kill the worker before its own stall exit (status 70 after
    ``BURNWATCH_STALL_EXIT_S``), or every worker dies in a blip of a minute; nor time out on an
    answer slowed by a catch-up (1.05 s seen, the default timeout is 1 s)."""
    docs = {doc["kind"]: doc for doc in K8S}
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    settings = settings_from({e["name"]: e["value"] for e in container["env"] if "value" in e})
    readiness, liveness = container["readinessProbe"], container["livenessProbe"]
    # Kubernetes' defaults where a field is not given
    window = liveness.get("failureThreshold", 3) * liveness.get("periodSeconds", 10)
    assert window > settings.stall_exit_s, f"liveness fails after {window} s, the worker exits after {settings.stall_exit_s} s"
    assert readiness["httpGet"]["path"] == "/healthz"
    for probe in (readiness, liveness):
        assert probe.get("timeoutSeconds", 1) >= 5


def test_the_image_runs_the_cli_with_known_settings():
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (.*)$", dockerfile, re.M).group(1))
    assert entry == ["burnwatch"]  # the console script of pyproject.toml
    assert build_parser().parse_args(cmd).func.__name__ == "cmd_worker"
    env = dict(re.findall(r"(BURNWATCH_[A-Z_]+)=(\S+)", dockerfile))
    assert settings_from(env).web_host == "0.0.0.0"


def test_the_bridge_pods_memory_limit_holds_the_parse_of_the_largest_answer_its_config_takes():
    """Parsing and mapping an answer takes about 12 times its size: with 512Mi, a 30 MiB
    kube-state-metrics or /federate answer (the config takes up to max_bytes, 64 MiB) had the pod
    OOM-killed, and again at each restart. Measured here on a /federate-like answer, scaled to max_bytes."""
    import tracemalloc

    from detector.ingest.config import load_bridge_config
    from detector.ingest.dcgm import DcgmMapper
    from detector.ingest.kube import kube_state
    from detector.ingest.prometheus import parse_exposition

    line = ('DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-8a2b1c3d-4e5f-6789-abcd-{n:012d}",'
            'pci_bus_id="00000000:07:00.0",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",'
            'Hostname="gpu-node-{h}",container="",namespace="",pod=""}} 0\n')  # fmt: skip
    body = "".join(line.format(i=n % 8, n=n, h=n // 8) for n in range(8000)).encode()
    tracemalloc.start()
    try:
        samples = parse_exposition(body, "federate")
        kube_state(samples, 1_796_000_000.0)
        DcgmMapper().map(samples, t=1_796_000_000.0, instance="federate")
        per_byte = tracemalloc.get_traced_memory()[1] / len(body)
    finally:
        tracemalloc.stop()
    (container,) = BRIDGE[1]["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    max_bytes = load_bridge_config(ROOT / "deploy/bridge.yaml").max_bytes
    needed = 256 * 2**20 + 1.2 * per_byte * max_bytes  # the process itself, and the allocator's slack
    assert int(limit[:-2]) * 2**20 >= needed, f"{limit} < {needed / 2**20:.0f}Mi ({per_byte:.1f} bytes per byte answered)"

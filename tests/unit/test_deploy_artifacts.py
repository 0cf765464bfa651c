"""deploy/ checked offline: no Docker engine and no cluster here, so the manifests are validated
against the Kubernetes JSON schemas shipped by kubernetes-validate, YAML is linted, the compose
file is cross-checked against the settings, and the dashboard against deploy/METRICS.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from yamllint import linter
from yamllint.config import YamlLintConfig

from devstack import cache_dir
from processor._runtime.stopping import MARGIN
from processor.settings import parse_duration, unknown_variables

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
# The oldest Kubernetes minor the manifests must keep working on.
KUBERNETES_VERSION = "1.29"
METRICS_PORT = 9464
# The processor's manifests; console.yaml adds a Deployment and a Service of its own
# (tests/unit/test_console_deploy.py).
PROCESSOR = "saga-processor"
# Custom resources have no schema in kubernetes-validate.
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
YAMLLINT = YamlLintConfig(
    """
extends: default
rules:
  line-length: {max: 140}
  document-start: disable
  truthy: {check-keys: false}
  comments: {min-spaces-from-content: 1}
"""
)


def _yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in {".yaml", ".yml"})


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifests() -> list[dict[str, Any]]:
    return [d for p in sorted(KUBERNETES.glob("*.yaml")) for d in _documents(p)]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        m
        for m in _manifests()
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} manifests"
    return found[0]


def _documented_metrics() -> set[str]:
    text = (DEPLOY / "METRICS.md").read_text()
    return set(re.findall(r"^\| `(saga_[a-z0-9_]+)` \|", text, flags=re.MULTILINE))


def _metric_names(expr: str) -> set[str]:
    # Label names (in `by (...)` and selectors) are not metrics; histogram series are the
    # documented name plus a suffix.
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\bsaga_[a-z0-9_]+", expr)}


# -- every YAML file ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_is_lint_clean(path: Path) -> None:
    problems = list(linter.run(path.read_text(), YAMLLINT, str(path)))
    assert problems == [], "\n".join(f"{path}:{p.line}:{p.column} {p.message}" for p in problems)


# -- Kubernetes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest",
    # Custom resources have no schema here: test_keda_scales_the_deployment_on_lag checks them.
    [m for m in _manifests() if (m["apiVersion"], m["kind"]) not in CUSTOM_KINDS],
    ids=lambda m: f"{m['kind']}/{m['metadata']['name']}",
)
def test_manifest_matches_the_kubernetes_schema(manifest: dict[str, Any]) -> None:
    # Strict: a misspelt or misplaced field is an error, not silently dropped by the API server.
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_every_kind_the_issue_asks_for_is_there() -> None:
    kinds = {m["kind"] for m in _manifests()}
    expected = {"Deployment", "Job", "PodDisruptionBudget", "ConfigMap", "Secret"}
    assert expected <= kinds
    assert kinds & {"HorizontalPodAutoscaler", "ScaledObject"}


def test_probes_use_the_metrics_port_and_the_grace_period_outlasts_shutdown() -> None:
    deployment = _one("Deployment", PROCESSOR)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    probe_ports = {
        ports.get(container[probe]["httpGet"]["port"], container[probe]["httpGet"]["port"])
        for probe in ("livenessProbe", "readinessProbe")
    }
    assert probe_ports == {METRICS_PORT}
    shutdown = parse_duration(_one("ConfigMap")["data"]["SAGA_SHUTDOWN_TIMEOUT"])
    # The native watchdog ends a process no Python thread can run MARGIN s past the timeout.
    assert pod["terminationGracePeriodSeconds"] > shutdown.total_seconds() + MARGIN


def test_pods_run_as_an_unprivileged_user() -> None:
    for kind in ("Deployment", "Job"):
        pod = _one(kind, PROCESSOR if kind == "Deployment" else None)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_configmap_holds_settings_and_secrets_hold_credentials() -> None:
    config = _one("ConfigMap")["data"]
    secrets = {
        m["metadata"]["name"]: m["stringData"] for m in _manifests() if m["kind"] == "Secret"
    }
    for keys in (config, *secrets.values()):
        assert unknown_variables(dict.fromkeys(keys, "")) == []
    credential = re.compile(r"URL|PASSWORD|SECRET|TOKEN|KEY")
    assert not [k for k in config if credential.search(k)]
    assert not re.search(r"password", json.dumps(config).replace("sasl.username", ""), re.I)
    runtime, owner = secrets["saga-processor"], secrets["saga-processor-migrate"]
    for url in (runtime["SAGA_DATABASE__URL"], owner["SAGA_DATABASE__URL"]):
        assert "sslmode=verify-full" in url
    assert "saga_runtime" in runtime["SAGA_DATABASE__URL"]
    assert "saga_owner" in owner["SAGA_DATABASE__URL"]
    # The replicas run without DDL: they must not try to create tables.
    assert config["SAGA_DEADLINE__SCHEMA__AUTO"] == "false"


def test_references_between_manifests_resolve() -> None:
    names = {(m["kind"], m["metadata"]["name"]) for m in _manifests()}
    deployment = _one("Deployment", PROCESSOR)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for source in deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]:
        ref = source.get("configMapRef") or source["secretRef"]
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        assert (kind, ref["name"]) in names
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _one("Service", PROCESSOR)["spec"]["selector"].items() <= labels.items()
    hpa = _one("HorizontalPodAutoscaler")["spec"]
    assert ("Deployment", hpa["scaleTargetRef"]["name"]) in names
    job_spec = _one("Job")["spec"]["template"]["spec"]
    # The schema first, then the preflight check with the new image.
    assert [c["args"] for c in job_spec["containers"]] == [["check"]]
    assert (
        job_spec["containers"][0]["envFrom"]
        == deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    )
    job = job_spec["initContainers"][0]
    assert job["args"] == ["migrate"]
    assert job["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    for env in job["env"]:
        ref = env["valueFrom"].get("configMapKeyRef") or env["valueFrom"]["secretKeyRef"]
        kind = "ConfigMap" if "configMapKeyRef" in env["valueFrom"] else "Secret"
        assert (kind, ref["name"]) in names


def test_keda_scales_the_deployment_on_lag() -> None:
    scaled = _one("ScaledObject")
    processor = _one("Deployment", PROCESSOR)
    assert scaled["spec"]["scaleTargetRef"]["name"] == processor["metadata"]["name"]
    assert 0 < scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert _metric_names(trigger["metadata"]["query"]) == {"saga_consumer_lag_records"}
    hpa_metric = _one("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["metric"]
    assert hpa_metric["name"] in _documented_metrics()


# -- compose -----------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_compose_runs_the_stack_the_issue_asks_for() -> None:
    services = _compose()["services"]
    processors = [
        s
        for s in services.values()
        if s.get("command") is None and "SAGA_SAGAS" in s.get("environment", {})
    ]
    assert len(processors) == 2
    assert {s["image"] for s in processors} == {services["migrate"]["image"]}
    assert services["migrate"]["command"] == ["migrate"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    # The registry for topics in a registry format: the release the tests run (registry.sh).
    assert services["registry"]["image"] == "apicurio/apicurio-registry:3.3.3"
    for service in services.values():
        assert ":" in service["image"]
        assert not service["image"].endswith(":latest")


def test_compose_references_resolve() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        depends = service.get("depends_on", [])
        for target in depends:
            assert target in services, f"{name} depends on unknown {target}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"


def test_compose_sets_only_real_settings() -> None:
    for name, service in _compose()["services"].items():
        env = service.get("environment", {})
        saga = {k: v for k, v in env.items() if k.startswith("SAGA_")}
        assert unknown_variables(saga) == [], name
        if "SAGA_SAGAS" in saga:
            assert saga["SAGA_DEADLINE__SCHEMA__AUTO"] == "false"
            assert "saga_runtime" in saga["SAGA_DATABASE__URL"]


def test_prometheus_scrapes_every_replica_on_the_metrics_port() -> None:
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {t for c in job["static_configs"] for t in c["targets"]}
    processors = {
        n for n, s in _compose()["services"].items() if "SAGA_SAGAS" in s.get("environment", {})
    }
    assert targets == {f"{n}:{METRICS_PORT}" for n in processors}


# -- Dockerfile --------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split()[0].upper(), line.partition(" ")[2].strip())
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_runs_the_wheel_as_an_unprivileged_user() -> None:
    instructions = _dockerfile()
    bases = [arg.split()[0] for op, arg in instructions if op == "FROM"]
    assert bases
    assert all(b.startswith("python:3.11-slim") for b in bases)
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    users = [arg for op, arg in final if op == "USER"]
    assert users, "the final stage must set USER"
    assert users[-1].split(":")[0] not in {"root", "0"}
    assert any(op == "RUN" and "pip install" in arg and ".whl" in arg for op, arg in final)
    assert ("ENTRYPOINT", '["saga-processor"]') in final


def test_dockerfile_copies_no_examples() -> None:
    copied = [arg for op, arg in _dockerfile() if op in {"COPY", "ADD"}]
    sources = [part for arg in copied for part in arg.split()[:-1] if not part.startswith("--")]
    for source in sources:
        top = source.strip("./").split("/")[0]
        assert top not in {"sagas", "schemas", "demo", "tests", "benchmarks", ""}, source


# -- Grafana -----------------------------------------------------------------------------------


def test_dashboard_shows_exactly_the_documented_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "saga-processor.json").read_text())
    used: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= _metric_names(target["expr"])
    documented = _documented_metrics()
    assert used - documented == set(), "not in deploy/METRICS.md"
    assert documented - used == set(), "documented but on no panel"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


# -- alert rules -------------------------------------------------------------------------------

ALERTS = DEPLOY / "prometheus" / "alerts.yml"


def _promtool() -> str:
    """promtool as deploy/local/promtool.sh leaves it (make test runs the script first)."""
    for found in (os.environ.get("SAGA_PROMTOOL"), cache_dir() / "promtool/usr/bin/promtool"):
        if found and Path(found).is_file():
            return str(found)
    on_path = shutil.which("promtool")
    assert on_path, "promtool is missing: run deploy/local/promtool.sh (make test does)"
    return on_path


def test_every_alert_rule_fires_on_its_test_series_and_stays_quiet_when_healthy() -> None:
    checked = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"],
        cwd=ALERTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Each rule has a firing case and a quiet case.
    rules = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    cases = yaml.safe_load((ALERTS.parent / "alerts_test.yml").read_text())["tests"]
    firing = {t["alertname"] for t in cases[0]["alert_rule_test"] if t.get("exp_alerts")}
    quiet = {t["alertname"] for t in cases[1]["alert_rule_test"] if not t.get("exp_alerts")}
    assert firing == quiet == set(rules)


def test_alerts_use_documented_metrics_and_link_a_runbook() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    used = set().union(*(_metric_names(r["expr"]) for r in rules))
    assert used - _documented_metrics() == set(), "not in deploy/METRICS.md"
    operations = (DEPLOY.parent / "docs" / "operations.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in operations.splitlines()
        if line.startswith("#")
    }
    for rule in rules:
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/operations.md#{rule['alert'].lower()}"
        assert runbook.split("#")[1] in anchors, f"no runbook section for {rule['alert']}"


def test_the_kubernetes_rule_is_the_same_as_the_prometheus_one() -> None:
    rule = yaml.safe_load((KUBERNETES / "prometheusrule.yaml").read_text())
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())

"""The console's image and Kubernetes manifest, checked offline like the rest of deploy/.

test_deploy_artifacts.py validates console.yaml against the Kubernetes schemas with every other
manifest; here: that it runs the console read-only from the processor's image as the reader
role, that its probes are routes the console serves, that nothing of the processor's selects its
pods, and that the image installs the console with its templates.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import yaml

from processor._console import Backend, create_app
from processor._runtime.stopping import MARGIN
from processor.settings import ProcessorSettings, parse_duration, unknown_variables

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
CONSOLE = "saga-processor-console"


def _manifests() -> list[dict[str, Any]]:
    return [
        d
        for p in sorted(KUBERNETES.glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d is not None
    ]


def _console(kind: str) -> dict[str, Any]:
    [found] = [m for m in _manifests() if m["kind"] == kind and m["metadata"]["name"] == CONSOLE]
    return found


def _container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = _console("Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    [container] = containers
    return container


def test_the_console_runs_read_only_from_the_processors_image_as_the_reader() -> None:
    container = _container()
    args = container["args"]
    assert args[0] == "console"
    assert "--enable-actions" not in args
    assert args[args.index("--host") + 1] == "0.0.0.0"
    port = int(args[args.index("--port") + 1])
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": port}
    # registry.yaml's Deployment runs an image of its own.
    [processor] = [
        m
        for m in _manifests()
        if m["kind"] == "Deployment" and m["metadata"]["name"] == "saga-processor"
    ]
    [replica] = processor["spec"]["template"]["spec"]["containers"]
    assert container["image"] == replica["image"]
    secret = _console("Secret")["stringData"]
    assert unknown_variables(dict.fromkeys(secret, "")) == []
    assert "saga_reader" in secret["SAGA_DATABASE__URL"]
    assert "sslmode=verify-full" in secret["SAGA_DATABASE__URL"]
    names = {(m["kind"], m["metadata"]["name"]) for m in _manifests()}
    for source in container["envFrom"]:
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        assert (kind, (source.get("configMapRef") or source["secretRef"])["name"]) in names
    # The console's own credentials come last, so they win over any in the shared settings.
    assert container["envFrom"][-1] == {"secretRef": {"name": CONSOLE}}


def test_the_probes_are_routes_of_the_console_and_the_grace_outlasts_its_stop() -> None:
    settings = ProcessorSettings(database={"url": "postgresql://nobody@127.0.0.1:1/x"})
    paths = {getattr(r, "path", None) for r in create_app(Backend(settings)).routes}
    container = _container()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] in paths
        assert container[probe]["httpGet"]["port"] == "http"
    config = next(m for m in _manifests() if m["kind"] == "ConfigMap")["data"]
    shutdown = parse_duration(config["SAGA_SHUTDOWN_TIMEOUT"]).total_seconds()
    pod = _console("Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > shutdown + MARGIN
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_only_the_console_service_selects_the_console_pods() -> None:
    deployment = _console("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _console("Service")["spec"]["selector"].items() <= labels.items()
    for m in _manifests():
        if m["metadata"]["name"] == CONSOLE:
            continue
        spec = m.get("spec", {})
        selector = spec.get("selector", {})
        selector = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
        if selector:
            # The processor's Service, PodDisruptionBudget and replicas leave the console alone.
            assert not selector.items() <= labels.items(), m["metadata"]["name"]
        target = spec.get("scaleTargetRef", {}).get("name")
        assert target != CONSOLE


def test_the_image_installs_the_console_and_its_templates_ship_in_the_wheel() -> None:
    text = (REPO / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if line.startswith("RUN pip install")]
    assert any(".whl" in line and "[console]" in line for line in installs)
    [exposed] = [line.split()[1:] for line in text.splitlines() if line.startswith("EXPOSE")]
    port = _container()["args"][_container()["args"].index("--port") + 1]
    assert port in exposed
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["processor"]
    templates = REPO / "processor" / "_console" / "templates"
    files = [p.relative_to(REPO / "processor").as_posix() for p in templates.rglob("*")]
    assert files
    for name in files:
        assert any(fnmatch(name, pattern) for pattern in data), f"{name} is not package data"

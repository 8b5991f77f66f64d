"""The deployment files in deploy/: every Kubernetes manifest valid against the pinned Kubernetes schemas
(offline, kubernetes-validate), each kustomization's files present, the containers' arguments accepted
by the real command line, the image definition's user, sources and ports, and, where buildah can build
here (tools/build_image.py), the image itself built and every role run in it as its own user."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadtest.cli.main import build_parser
from loadtest.profile.loader import load_profile
from loadtest.sim.__main__ import build_parser as sim_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"
# The oldest Kubernetes release still in the main clouds' standard support, and the newest schema set
# kubernetes-validate carries (docs/deploy.md).
KUBERNETES_VERSIONS = ["1.31.0", "1.37.0"]

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")


def _kustomizations() -> list[Path]:
    return sorted(KUBE.rglob("kustomization.yaml"))


def _manifests() -> list[Path]:
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


OVERLAYS = ["sim", "ui-sim"]  # the headless run and the web UI, each against the embedded engine


def _rendered(overlay: str = "sim") -> dict[tuple[str, str], dict[str, Any]]:
    """An overlay and what it builds on merged by hand the way kustomize merges these (resources, then
    ConfigMap data patches), by (kind, name)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}

    def add(kdir: Path) -> None:
        k = yaml.safe_load((kdir / "kustomization.yaml").read_text())
        for res in k.get("resources", []):
            target = (kdir / res).resolve()
            if target.is_dir():
                add(target)
            else:
                for d in _docs(target):
                    out[(d["kind"], d["metadata"]["name"])] = d
        for patch in k.get("patches", []):
            for d in _docs(kdir / patch["path"]):
                out[(d["kind"], d["metadata"]["name"])].setdefault("data", {}).update(d.get("data", {}))

    add(KUBE / "overlays" / overlay)
    return out


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    files = _manifests()
    assert len(files) >= 8, files
    for path in files:
        for doc in _docs(path):
            try:
                kubernetes_validate.validate(doc, version, strict=True)  # unknown fields refused
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{path.relative_to(ROOT)}: {doc['kind']}/{doc['metadata']['name']}: {e.message}")


def test_each_kustomization_names_files_that_exist_and_every_file_is_named() -> None:
    named: set[Path] = set()
    for k in _kustomizations():
        data = yaml.safe_load(k.read_text())
        assert data["kind"] == "Kustomization", k
        for ref in data.get("resources", []) + [p["path"] for p in data.get("patches", [])]:
            target = (k.parent / ref).resolve()
            assert target.exists(), f"{k.relative_to(ROOT)} names {ref}, which does not exist"
            named.add(target if target.is_file() else target / "kustomization.yaml")
    orphans = [p.relative_to(ROOT) for p in _manifests() if p.resolve() not in named]
    assert orphans == [], f"manifests no kustomization uses: {orphans}"


def _args(doc: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The container's arguments with Kubernetes' $(VAR) references expanded from ``env``."""
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


def _env(doc: dict[str, Any], maps: dict[str, dict[str, str]]) -> dict[str, str]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref and ref["name"] in maps:
            env[e["name"]] = maps[ref["name"]][ref["key"]]
    return env


def test_the_containers_arguments_are_what_the_command_line_accepts(tmp_path: Path) -> None:
    res = _rendered()
    maps = {name: d["data"] for (kind, name), d in res.items() if kind == "ConfigMap"}
    master, worker = res[("Job", "loadtest-master")], res[("Job", "loadtest-worker")]
    m = build_parser().parse_args(_args(master, _env(master, maps)))
    assert m.command == "master" and m.master_bind_host == "0.0.0.0"
    # the workers the master waits for are the worker Job's pods
    assert m.expect_workers == worker["spec"]["parallelism"] == worker["spec"]["completions"]
    w = build_parser().parse_args(_args(worker, {}))
    assert w.command == "worker" and w.master_host == "loadtest-master"
    svc = res[("Service", "loadtest-master")]
    ports = {p["port"] for p in svc["spec"]["ports"]}
    assert {w.master_port, m.master_port, m.prometheus_port} <= ports
    # the Service reaches the master's pod
    assert svc["spec"]["selector"].items() <= master["spec"]["template"]["metadata"]["labels"].items()
    # the overlay's master talks to the overlay's engine, whose arguments the engine accepts
    engine = res[("Deployment", "loadtest-engine")]
    e_args = _args(engine, {})
    assert e_args[:2] == ["serve", "sim"]
    e = sim_parser().parse_args(e_args[2:])
    assert m.host == f"http://loadtest-engine:{e.port}" and e.host == "0.0.0.0"
    # the profile in the ConfigMap loads
    mount = next(v for v in master["spec"]["template"]["spec"]["containers"][0]["volumeMounts"])
    assert m.profile == f"{mount['mountPath']}/profile.yaml"
    (tmp_path / "profile.yaml").write_text(maps["loadtest-profile"]["profile.yaml"])
    assert load_profile(str(tmp_path / "profile.yaml"))[0].name == "k8s-chat"
    # no secret value in any file: the API key comes from a Secret the user creates
    assert not any(d["kind"] == "Secret" for d in res.values())
    for doc in (master, worker):
        spec = doc["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        (c,) = spec["containers"]
        key = next(e for e in c["env"] if e["name"] == "OPENAI_API_KEY")
        assert key["valueFrom"]["secretKeyRef"]["name"] == "loadtest-api-key"


def test_the_image_runs_as_a_user_and_copies_what_exists() -> None:
    lines = [ln.split("#")[0].strip() for ln in (DEPLOY / "Dockerfile").read_text().splitlines()]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    for ln in lines:
        if ln.startswith("COPY "):
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), f"deploy/Dockerfile copies {src}, which does not exist"
    exposed = {int(p) for ln in lines if ln.startswith("EXPOSE ") for p in ln.split()[1:]}
    assert {5557, 9646, 8000} <= exposed


def test_the_ui_containers_arguments_are_what_the_command_line_accepts(tmp_path: Path) -> None:
    """The web UI overlay: `loadtest ui` as a Deployment behind a Service with Locust's port names, its
    workers a Deployment whose replicas it waits for, the login and the API key from Secrets."""
    res = _rendered("ui-sim")
    maps = {name: d["data"] for (kind, name), d in res.items() if kind == "ConfigMap"}
    ui, worker = res[("Deployment", "loadtest-ui")], res[("Deployment", "loadtest-ui-worker")]
    u = build_parser().parse_args(_args(ui, _env(ui, maps)))
    assert u.command == "ui" and u.web_host == "0.0.0.0" and u.master_bind_host == "0.0.0.0"
    assert u.expect_workers == worker["spec"]["replicas"] and u.processes == 1
    assert ui["spec"]["replicas"] == 1 and ui["spec"]["strategy"]["type"] == "Recreate"
    # off loopback the UI needs --web-login: its variable comes from a Secret, never from a file here
    (c,) = ui["spec"]["template"]["spec"]["containers"]
    login = next(e for e in c["env"] if e["name"] == u.web_login)
    assert login["valueFrom"]["secretKeyRef"]["name"] == "loadtest-ui-login"
    assert "optional" not in login["valueFrom"]["secretKeyRef"]  # no login, no UI: the pod waits for it
    w = build_parser().parse_args(_args(worker, {}))
    assert w.command == "worker" and w.master_host == "loadtest-ui" and w.master_port == u.master_port
    svc = res[("Service", "loadtest-ui")]
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert (
        ports
        == {"master-p1": u.master_port, "master-p3": u.web_port}
        == {"master-p1": 5557, "master-p3": 8089}
    )
    assert svc["spec"]["selector"].items() <= ui["spec"]["template"]["metadata"]["labels"].items()
    assert not svc["spec"]["selector"].items() <= worker["spec"]["template"]["metadata"]["labels"].items()
    engine = sim_parser().parse_args(_args(res[("Deployment", "loadtest-engine")], {})[2:])
    assert u.host == f"http://loadtest-engine:{engine.port}"
    mount = next(v for v in c["volumeMounts"] if v["mountPath"] == "/etc/loadtest")
    assert u.profile == f"{mount['mountPath']}/profile.yaml" and mount["name"] == "profile"
    assert u.reports_dir == next(v["mountPath"] for v in c["volumeMounts"] if v["name"] == "runs")
    assert not any(d["kind"] == "Secret" for d in res.values())
    for doc in (ui, worker):
        spec = doc["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        (cc,) = spec["containers"]
        key = next(e for e in cc["env"] if e["name"] == "OPENAI_API_KEY")
        assert key["valueFrom"]["secretKeyRef"]["name"] == "loadtest-api-key"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (kustomize rendering)")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_renders_the_overlay_into_valid_resources(tmp_path: Path, overlay: str) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUBE / "overlays" / overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == sorted(f"{k}/{n}" for k, n in _rendered(overlay)), kinds
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[0], strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "loadtest"
    name = {"sim": "loadtest-run", "ui-sim": "loadtest-ui"}[overlay]
    run_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)
    assert run_map["data"]["host"] == "http://loadtest-engine:8000"  # the overlay's patch applied


def _image_tool() -> Any:
    spec = importlib.util.spec_from_file_location("build_image_tool", ROOT / "tools" / "build_image.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _image_tool()
# The base (cold: about a minute) and the build (about 2 minutes: the dependencies, the compiler, the
# compile) on 2 busy cores, and then the runs.
IMAGE_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Any, str]]:
    """deploy/Dockerfile built by tools/build_image.py on its cached Debian base (buildah, chroot isolation),
    as (builder, image name); removed at the end. Skipped, saying why, where buildah cannot build here."""
    if os.environ.get("LOADTEST_IMAGE_BUILD") == "0":
        pytest.skip("LOADTEST_IMAGE_BUILD=0: the image build is switched off")
    reason = tool.unavailable()
    if reason:
        pytest.skip(f"image build: {reason}")
    b = tool.Buildah.default()
    tag = f"localhost/loadtest:test-{os.getpid()}"
    b.build(tag, b.ensure_base())
    try:
        yield b, tag
    finally:
        b.remove_image(tag)


@pytest.mark.timeout(IMAGE_TIMEOUT_S)
def test_the_built_image_runs_loadtest_as_its_own_user(image: tuple[Any, str]) -> None:
    b, tag = image
    config = b.image_config(tag)
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["loadtest"], config
    assert config["WorkingDir"] == "/data"
    assert {"5557/tcp", "9646/tcp", "8000/tcp"} <= set(config["ExposedPorts"])
    assert "PATH=/opt/venv/bin:" + tool.PATH_ENV in config["Env"]


@pytest.mark.timeout(IMAGE_TIMEOUT_S)
@pytest.mark.parametrize(("what", "argv", "expect"), tool.ROLE_CHECKS, ids=[c[0] for c in tool.ROLE_CHECKS])
def test_every_role_starts_in_the_image(
    image: tuple[Any, str], what: str, argv: list[str], expect: str
) -> None:
    b, tag = image
    with b.container(tag) as ctr:
        ran = b.run(ctr, argv)
    assert ran.returncode == 0, ran.failure()
    assert expect in ran.stdout, ran.failure()


@pytest.mark.timeout(IMAGE_TIMEOUT_S)
def test_a_run_in_the_image_writes_its_folder_as_the_images_user(
    image: tuple[Any, str], tmp_path: Path
) -> None:
    b, tag = image
    ran = tool.single_run(b, tag, tmp_path / "data")
    assert ran.returncode == 0, ran.failure()
    out = tmp_path / "data" / "run"
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["metrics"]["requests"]["completed"] > 0
    assert run["verdict"]["exit_code"] == 0
    assert {p.stat().st_uid for p in out.iterdir()} == {tool.IMAGE_UID}  # never root
    assert (out / "report.html").stat().st_size > 0


@pytest.mark.timeout(IMAGE_TIMEOUT_S)
def test_a_master_two_workers_and_the_engine_each_in_a_container_of_the_image(
    image: tuple[Any, str], tmp_path: Path
) -> None:
    b, tag = image
    fleet = tool.distributed_run(b, tag, tmp_path, workers=2)
    assert fleet.master.returncode == 0, fleet.master.failure()
    for w in fleet.workers:
        assert w.returncode == 0, w.failure()
    out = tmp_path / "data" / "run"
    run = json.loads((out / "run.json").read_text())
    req = run["metrics"]["requests"]
    assert run["status"] == "completed"
    # What the master counts is what the engine, in its own container, received and finished.
    assert req["completed"] == fleet.engine_stats["requests_received"] > 0
    assert req["ok"] == fleet.engine_stats["requests_completed"]
    shipped = sorted(p.name for p in out.glob("records-w*.jsonl"))
    assert shipped == ["records-w0.jsonl", "records-w1.jsonl"], shipped
    # Each worker kept its own copy in its /work, and the master's folder has every one of its lines.
    copies = [p for i in range(2) for p in (tmp_path / f"work-{i}").glob("records-w*.jsonl")]
    assert sorted(p.name for p in copies) == shipped
    for copy in copies:
        assert copy.read_text().splitlines() == (out / copy.name).read_text().splitlines()

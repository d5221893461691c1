"""docker/: what the compose files name exists, as far as a machine without Docker can tell.

Every build context, Dockerfile and COPY source is in the repository; every mounted
file exists; ``depends_on`` names services; every ``celery -A`` command loads its
app from the directory the image runs it in (mapped back into the repository through
the Dockerfile's WORKDIR and COPY lines), with the service's environment, and knows
its subcommand; a Celery plugin's command (flower) is installed by the image; the
Prometheus scrape targets are services serving metrics on that port.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML (the test extra) is not installed")

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILES = sorted(DOCKER.glob("compose.y*ml"))
#: Subcommands of the ``celery`` command itself; any other comes from a plugin.
CELERY_OWN = {"worker", "beat", "events", "inspect", "control", "shell", "call", "result"}


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@dataclass
class Image:
    """What a Dockerfile puts where: container directories -> repository paths."""

    context: Path
    copies: dict[PurePosixPath, Path] = field(default_factory=dict)
    workdir: PurePosixPath = field(default_factory=lambda: PurePosixPath("/"))
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    installs: str = ""

    @classmethod
    def parse(cls, dockerfile: Path, context: Path) -> Image:
        image = cls(context)
        for line in dockerfile.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            instruction, _, rest = line.strip().partition(" ")
            instruction = instruction.upper()
            if instruction == "WORKDIR":
                image.workdir = image.workdir / rest.strip()
            elif instruction == "COPY":
                *sources, dest = shlex.split(rest)
                for source in sources:
                    assert (context / source).exists(), f"{dockerfile.name}: COPY {source}"
                    target = image.workdir / dest
                    if len(sources) > 1 or dest.endswith("/"):
                        target = target / Path(source).name
                    image.copies[PurePosixPath(os.path.normpath(target))] = context / source
            elif instruction == "CMD":
                image.cmd = json.loads(rest)
            elif instruction == "ENV":
                key, _, value = rest.partition("=")
                image.env[key.strip()] = value.strip()
            elif instruction == "RUN" and "pip install" in rest:
                image.installs += rest
        return image

    def local(self, path: PurePosixPath) -> Path:
        """The repository path of the container's ``path``, by the longest COPY prefix."""
        for inside in sorted(self.copies, key=lambda p: len(p.parts), reverse=True):
            if path == inside or inside in path.parents:
                return self.copies[inside] / path.relative_to(inside)
        raise AssertionError(f"{path} is not copied into the image")


def services() -> list[tuple[Path, str, dict[str, Any]]]:
    return [(f, name, s) for f in COMPOSE_FILES for name, s in load(f)["services"].items()]


def image_of(compose: Path, service: dict[str, Any]) -> Image:
    build = service["build"]
    if isinstance(build, str):
        build = {"context": build}
    context = (compose.parent / build["context"]).resolve()
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    assert dockerfile.is_file(), dockerfile
    return Image.parse(dockerfile, context)


def environment(service: dict[str, Any], image: Image) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {**image.env, **{k: str(v) for k, v in env.items()}}


def ids(params: list[tuple[Path, str, dict[str, Any]]]) -> list[str]:
    return [f"{f.name}:{name}" for f, name, _ in params]


def test_there_are_compose_files() -> None:
    assert {f.name for f in COMPOSE_FILES} >= {"compose.yaml"}


@pytest.mark.parametrize(("compose", "name", "service"), services(), ids=ids(services()))
def test_each_service_names_an_image_or_a_build_that_exists(
    compose: Path, name: str, service: dict[str, Any]
) -> None:
    assert "image" in service or "build" in service, name
    if "build" in service:
        image_of(compose, service)  # the context, the Dockerfile, its COPY sources
    else:
        repository, _, tag = service["image"].rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: pin {service['image']}"
    others = set(load(compose)["services"]) - {name}
    assert set(service.get("depends_on") or []) <= others, name


@pytest.mark.parametrize(("compose", "name", "service"), services(), ids=ids(services()))
def test_each_mounted_file_exists(compose: Path, name: str, service: dict[str, Any]) -> None:
    named = set(load(compose).get("volumes") or {})
    for volume in service.get("volumes") or []:
        source = volume.split(":", 1)[0] if isinstance(volume, str) else volume["source"]
        if source.startswith((".", "/")):
            assert (compose.parent / source).exists(), f"{name}: {volume}"
        else:
            assert source in named, f"{name}: {volume} names no declared volume"


CELERY_SERVICES = [
    (f, name, s)
    for f, name, s in services()
    if "build" in s
    and (shlex.split(s["command"]) if "command" in s else image_of(f, s).cmd)[:1] == ["celery"]
]


@pytest.mark.parametrize(("compose", "name", "service"), CELERY_SERVICES, ids=ids(CELERY_SERVICES))
def test_each_celery_command_loads_its_app_where_the_image_runs_it(
    compose: Path, name: str, service: dict[str, Any]
) -> None:
    image = image_of(compose, service)
    argv = shlex.split(service["command"]) if "command" in service else image.cmd
    app = argv[argv.index("-A") + 1]
    sub = next(a for a in argv[argv.index("-A") + 2 :] if not a.startswith("-"))
    cwd = image.local(PurePosixPath(service.get("working_dir", str(image.workdir))))
    env = {**os.environ, **environment(service, image)}
    env.pop("PYTHONPATH", None)  # only what the image has: the directory it runs in
    # The app imports and reads its configuration (Django's settings, lazily).
    load_app = (
        "from celery.app.utils import find_app; "
        f"app = find_app({app!r}); print(app.main, app.conf.broker_url)"
    )
    done = subprocess.run(
        [sys.executable, "-c", load_app], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"{name}: {done.stderr}"
    assert done.stdout.split()[-1] == env["REDIS_URL"], done.stdout
    if sub in CELERY_OWN:
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", app, sub, "--help"],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
    else:  # a plugin's command: the image installs it
        assert f"'{sub}" in image.installs or f" {sub}" in image.installs, (name, sub)


def test_prometheus_scrapes_the_workers_on_their_metrics_ports() -> None:
    compose = DOCKER / "compose.yaml"
    stack = load(compose)["services"]
    prometheus = stack["prometheus"]
    mounted = {v.split(":")[1]: compose.parent / v.split(":")[0] for v in prometheus["volumes"]}
    config = load(mounted["/etc/prometheus/prometheus.yml"])
    targets = [
        t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    ]
    workers = sorted(n for n, s in stack.items() if " worker" in s.get("command", ""))
    assert len(workers) == 2, workers
    assert sorted(t.split(":")[0] for t in targets) == workers
    for target in targets:
        host, port = target.split(":")
        service = stack[host]
        image = image_of(compose, service)
        env = environment(service, image)
        assert env["METRICS_PORT"] == port, target
        # prefork: prometheus_client's multiprocess directory, new at each start.
        assert env["PROMETHEUS_MULTIPROC_DIR"] in service["tmpfs"], host
        assert "[prometheus]" in image.installs, "the image lacks prometheus_client"
    assert set(prometheus.get("depends_on") or []) == set(workers)

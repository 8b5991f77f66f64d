#!/usr/bin/env python3
"""Build deploy/Dockerfile with buildah on a local Debian base (no registry, no daemon) and run its roles.

`python3 tools/build_image.py all` makes (or reuses) the base image, builds the tool's image on it, runs
every role in it as the image's own user (the help of each command, the engine's presets, a short
`loadtest run` and a master with two workers and the engine, each in a container of its own) and
removes the image and every container it made. `base` only makes the base; `build [--tag T]` builds
and keeps the image; `check --tag T` runs the roles in an image already built; `remove --tag T`
removes it.

The base is Debian bookworm (`debootstrap --variant=minbase` with python3 and python3-venv: Python
3.11, as in python:3.11-slim), brought up to date from bookworm-updates and bookworm-security and
imported as `localhost/loadtest-base:bookworm-<key>`. It is kept, with buildah's storage, in the cache
folder (`$LOADTEST_IMAGE_CACHE`, else `~/.cache/loadtest/image`): a second call reuses it. Buildah runs
as root with chroot isolation (no daemon, no user namespaces) and the overlay storage driver
(`LOADTEST_BUILDAH_DRIVER=vfs` where overlay mounts are refused). The build's RUN steps see the host's
certificate authorities (read-only, not kept in the image), so that pip trusts what the host trusts.
docs/deploy.md says what this exercises and what it does not.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
MIRROR = os.environ.get("LOADTEST_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
SECURITY_MIRROR = os.environ.get("LOADTEST_DEBIAN_SECURITY_MIRROR") or "http://deb.debian.org/debian-security"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian's bundle; where pip in the base reads it
IMAGE_UID = 10001
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cache_root() -> Path:
    return Path(os.environ.get("LOADTEST_IMAGE_CACHE") or Path.home() / ".cache" / "loadtest" / "image")


def base_name() -> str:
    """The base image's name, keyed by what goes into it: a change of suite, packages or mirror makes a new one."""
    key = hashlib.sha256(json.dumps([SUITE, BASE_PACKAGES, MIRROR, SECURITY_MIRROR, 1]).encode()).hexdigest()
    return f"localhost/loadtest-base:{SUITE}-{key[:12]}"


def unavailable() -> str | None:
    """Why buildah cannot build the image here (None when it can)."""
    if not sys.platform.startswith("linux"):
        return "buildah builds need Linux"
    if os.geteuid() != 0:
        return "this builder runs buildah as root (chroot isolation, no user namespaces); run as root"
    if shutil.which("buildah") is None:
        return (
            "buildah is not installed (Debian: apt-get install buildah debootstrap; dev.py does it as root)"
        )
    if shutil.which("debootstrap") is None and not Buildah.default().image_exists(base_name()):
        return "debootstrap is not installed and no base image is cached (apt-get install debootstrap)"
    return None


@dataclass(frozen=True)
class Ran:
    """One command's outcome in a container."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def failure(self) -> str:
        return f"{' '.join(self.argv)}: exit {self.returncode}\n{self.stdout[-2000:]}\n{self.stderr[-2000:]}"


@dataclass(frozen=True)
class Buildah:
    """buildah with this project's storage (under the cache folder) and chroot isolation."""

    root: Path
    runroot: Path
    driver: str = "overlay"
    isolation: str = "chroot"

    @staticmethod
    def default() -> Buildah:
        return Buildah(
            root=cache_root() / "storage",
            runroot=Path(tempfile.gettempdir()) / f"loadtest-buildah-run-{os.geteuid()}",
            driver=os.environ.get("LOADTEST_BUILDAH_DRIVER") or "overlay",
        )

    def argv(self, *args: str) -> list[str]:
        storage = ["--root", str(self.root), "--runroot", str(self.runroot), "--storage-driver", self.driver]
        return ["buildah", *storage, *args]

    def call(self, *args: str, timeout: float = 120, check: bool = True) -> Ran:
        done = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)
        ran = Ran(list(args), done.returncode, done.stdout, done.stderr)
        if check and done.returncode != 0:
            raise RuntimeError(f"buildah {ran.failure()}")
        return ran

    def image_exists(self, name: str) -> bool:
        return self.call("inspect", "--type", "image", name, check=False).returncode == 0

    def image_config(self, name: str) -> dict[str, Any]:
        """The image's OCI config: User, Entrypoint, Cmd, ExposedPorts, WorkingDir, Env."""
        inspected = json.loads(self.call("inspect", "--type", "image", name).stdout)
        config: dict[str, Any] = inspected["OCIv1"]["config"]
        return config

    def ensure_base(self, refresh: bool = False, log: IO[str] = sys.stderr) -> str:
        """The cached base image, made first when it is missing (about a minute)."""
        name = base_name()
        cache_root().mkdir(parents=True, exist_ok=True)
        with open(cache_root() / "base.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time; the others then find it
            if self.image_exists(name) and not refresh:
                print(f"base: cached {name}", file=log, flush=True)
                return name
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="base-", dir=cache_root()) as tmp:
                rootfs, tar = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
                _debootstrap(rootfs)
                subprocess.run(
                    ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tar), "."], check=True
                )
                ctr = self.call("from", "scratch").stdout.strip()
                try:
                    self.call("add", ctr, str(tar), "/", timeout=600)
                    self.call(
                        "config",
                        "--env",
                        f"PATH={PATH_ENV}",
                        "--env",
                        "LANG=C.UTF-8",
                        "--cmd",
                        "/bin/bash",
                        "--label",
                        f"org.opencontainers.image.description=Debian {SUITE} minbase with python3 and python3-venv",
                        ctr,
                    )
                    self.call("commit", "--rm", ctr, name, timeout=600)
                except BaseException:
                    self.call("rm", ctr, check=False)
                    raise
            print(f"base: made {name} in {time.monotonic() - started:.0f} s", file=log, flush=True)
            return name

    def build(self, tag: str, base: str, timeout: float = 1800) -> float:
        """Build deploy/Dockerfile from the repository root as `tag` on `base`; the seconds it took."""
        started = time.monotonic()
        extra = ["-v", f"{HOST_CA}:{HOST_CA}:ro"] if HOST_CA.is_file() else []
        self.call(
            "bud",
            "--isolation",
            self.isolation,
            "--force-rm",  # no working container left behind by a failed step
            "--layers=false",
            "--pull=never",  # the base is local; nothing is pulled
            *extra,
            "--build-arg",
            f"BASE={base}",
            "-f",
            str(DOCKERFILE),
            "-t",
            tag,
            str(ROOT),
            timeout=timeout,
        )
        return time.monotonic() - started

    def remove_image(self, tag: str) -> None:
        if self.image_exists(tag):
            self.call("rmi", tag)

    @contextlib.contextmanager
    def container(self, image: str) -> Iterator[str]:
        """A working container of `image`, removed on the way out."""
        ctr = self.call("from", "--pull=never", image).stdout.strip()
        try:
            yield ctr
        finally:
            self.call("rm", ctr, check=False)

    def run_argv(self, ctr: str, argv: list[str], mounts: dict[Path, str] | None = None) -> list[str]:
        """`buildah run` of argv in ctr as the image's own user (its USER), with host folders mounted."""
        vols = [a for host, inside in (mounts or {}).items() for a in ("-v", f"{host}:{inside}")]
        return self.argv("run", "--isolation", self.isolation, *vols, ctr, "--", *argv)

    def run(
        self, ctr: str, argv: list[str], mounts: dict[Path, str] | None = None, timeout: float = 120
    ) -> Ran:
        done = subprocess.run(
            self.run_argv(ctr, argv, mounts), capture_output=True, text=True, timeout=timeout
        )
        return Ran(argv, done.returncode, done.stdout, done.stderr)


def _debootstrap(rootfs: Path) -> None:
    """Debian minbase with python3 and python3-venv, its packages brought up to date, apt's caches emptied."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    include = ",".join(BASE_PACKAGES)
    _quiet(["debootstrap", "--variant=minbase", f"--include={include}", SUITE, str(rootfs), MIRROR], env)
    (rootfs / "etc" / "apt" / "sources.list").write_text(
        f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
        f"deb {SECURITY_MIRROR} {SUITE}-security main\n"
    )
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "upgrade", "-y", "-qq"], ["apt-get", "clean"]):
        _quiet(["chroot", str(rootfs), *cmd], env)
    lists = rootfs / "var" / "lib" / "apt" / "lists"
    for p in lists.iterdir():
        if p.is_file():
            p.unlink()


def _quiet(argv: list[str], env: dict[str, str]) -> None:
    """Run argv, showing its output only when it fails."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )


# ---- what the image is checked to do ----

# (what, argv, text its output must hold): every role's command line, as the image's user.
ROLE_CHECKS: list[tuple[str, list[str], str]] = [
    ("the image's user", ["id", "-u"], str(IMAGE_UID)),
    ("loadtest --help", ["loadtest", "--help"], "usage: loadtest"),
    ("master --help", ["loadtest", "master", "--help"], "--expect-workers"),
    ("worker --help", ["loadtest", "worker", "--help"], "--master-host"),
    ("profiles list", ["loadtest", "profiles", "list"], "interactive-chat"),
    ("serve sim --list-presets", ["loadtest", "serve", "sim", "--list-presets"], "H100"),
    (
        "the compiled build",
        [
            "python",
            "-c",
            "from loadtest.compiled import COMPILED, compiled_count; print(compiled_count() == len(COMPILED))",
        ],
        "True",
    ),
]

RUN_ARGS = ["-d", "3", "-c", "4", "--no-telemetry", "--generator-health", "warn"]


def writable_folder(path: Path) -> Path:
    """A host folder the image's user (uid 10001) can write, to mount at /data or /work."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, IMAGE_UID, IMAGE_UID)
    return path


def single_run(b: Buildah, image: str, data: Path) -> Ran:
    """`loadtest run` with the embedded engine inside one container, its run folder in data (as /data/run)."""
    with b.container(image) as ctr:
        argv = ["loadtest", "run", "--out", "/data/run", "--engine-speedup", "20", *RUN_ARGS]
        return b.run(ctr, argv, {writable_folder(data): "/data"}, timeout=180)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Fleet:
    """The outcome of a distributed run in containers: what the engine counted and each role's result."""

    engine_stats: dict[str, Any]
    master: Ran
    workers: list[Ran] = field(default_factory=list)


def distributed_run(b: Buildah, image: str, folder: Path, workers: int = 2) -> Fleet:
    """The Kubernetes manifests' commands, each in a container of the image: the engine (`serve sim`),
    `loadtest master` (run folder in folder/data as /data) and `workers` × `loadtest worker` (each its
    own folder/work-i as /work). Chroot isolation shares the host's network: they meet on loopback."""
    engine_port, master_port = _free_port(), _free_port()
    data = writable_folder(folder / "data")
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        procs: list[tuple[str, subprocess.Popen[str]]] = []

        def start(name: str, argv: list[str], mounts: dict[Path, str]) -> subprocess.Popen[str]:
            ctr = stack.enter_context(b.container(image))
            out = stack.enter_context(open(logs / f"{name}.log", "w+"))
            p = subprocess.Popen(
                b.run_argv(ctr, argv, mounts), stdout=out, stderr=subprocess.STDOUT, text=True
            )
            stack.callback(_stop, p)
            procs.append((name, p))
            return p

        sim_argv = ["loadtest", "serve", "sim", "--port", str(engine_port), "--speedup", "20"]
        start("engine", sim_argv, {})
        _wait_listening(engine_port, logs / "engine.log")
        master_argv = [
            "loadtest",
            "master",
            "--expect-workers",
            str(workers),
            "--master-port",
            str(master_port),
        ]
        master_argv += ["--host", f"http://127.0.0.1:{engine_port}", "--out", "/data/run", *RUN_ARGS]
        master = start("master", master_argv, {data: "/data"})
        ws = [
            start(
                f"worker-{i}",
                ["loadtest", "worker", "--master-port", str(master_port), "--out", "/work"],
                {writable_folder(folder / f"work-{i}"): "/work"},
            )
            for i in range(workers)
        ]
        master.wait(timeout=180)
        for w in ws:
            w.wait(timeout=60)
        stats = _engine_stats(engine_port)
        ran = {name: Ran([name], p.returncode, (logs / f"{name}.log").read_text(), "") for name, p in procs}
    return Fleet(stats, ran["master"], [ran[f"worker-{i}"] for i in range(workers)])


def _stop(p: subprocess.Popen[str]) -> None:
    """SIGTERM to `buildah run` (it passes it on to the container's process), then SIGKILL."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=15)


def _wait_listening(port: int, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the engine in its container never listened on {port}:\n{log.read_text()[-2000:]}")


def _engine_stats(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/sim/stats", timeout=10) as r:
        stats: dict[str, Any] = json.loads(r.read())
        return stats


def check(b: Buildah, image: str, log: IO[str] = sys.stdout) -> bool:
    """Run every check on `image`, one line each; True when all passed."""
    ok = True

    def say(what: str, passed: bool, detail: str = "") -> None:
        nonlocal ok
        ok = ok and passed
        print(f"{'ok  ' if passed else 'FAIL'} {what}{': ' + detail if detail else ''}", file=log, flush=True)

    config = b.image_config(image)
    say("runs as uid 10001", config.get("User", "").split(":")[0] == str(IMAGE_UID), config.get("User", ""))
    say("entry point loadtest", config.get("Entrypoint") == ["loadtest"], str(config.get("Entrypoint")))
    with b.container(image) as ctr:
        for what, argv, expect in ROLE_CHECKS:
            ran = b.run(ctr, argv)
            say(
                what,
                ran.returncode == 0 and expect in ran.stdout,
                "" if ran.returncode == 0 else ran.failure(),
            )
    with tempfile.TemporaryDirectory(prefix="loadtest-image-") as tmp:
        started = time.monotonic()
        ran = single_run(b, image, Path(tmp) / "single")
        made = (Path(tmp) / "single" / "run" / "run.json").is_file()
        say(
            f"loadtest run (embedded engine, {time.monotonic() - started:.0f} s)",
            ran.returncode == 0 and made,
        )
        started = time.monotonic()
        fleet = distributed_run(b, image, Path(tmp) / "fleet")
        run_json = Path(tmp) / "fleet" / "data" / "run" / "run.json"
        completed = (
            json.loads(run_json.read_text())["metrics"]["requests"]["completed"] if run_json.is_file() else -1
        )
        say(
            f"master + 2 workers + engine, 4 containers ({time.monotonic() - started:.0f} s)",
            fleet.master.returncode == 0
            and all(w.returncode == 0 for w in fleet.workers)
            and completed == fleet.engine_stats.get("requests_received", -2) > 0,
            f"{completed} requests, the engine received {fleet.engine_stats.get('requests_received')}",
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="what", required=True)
    p_base = sub.add_parser("base", help="make the cached base image (or say it is cached)")
    p_base.add_argument("--refresh", action="store_true", help="make it again from Debian's current packages")
    for name, text in (
        ("build", "build deploy/Dockerfile on the base and keep the image"),
        ("check", "run every role in an image already built"),
        ("remove", "remove an image built here"),
        ("all", "base, build, check, then remove the image"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--tag", default="localhost/loadtest:dev", help="the image's name (default: %(default)s)"
        )
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        print(f"cannot build the image here: {reason}", file=sys.stderr)
        return 2
    b = Buildah.default()
    if args.what == "base":
        b.ensure_base(refresh=args.refresh)
        return 0
    if args.what == "check":
        return 0 if check(b, args.tag) else 1
    if args.what == "remove":
        b.remove_image(args.tag)
        return 0
    base = b.ensure_base()
    seconds = b.build(args.tag, base)
    print(f"built {args.tag} on {base} in {seconds:.0f} s", flush=True)
    if args.what == "build":
        return 0
    try:
        return 0 if check(b, args.tag) else 1
    finally:
        b.remove_image(args.tag)


if __name__ == "__main__":
    sys.exit(main())

"""A small network of Linux network namespaces for tests: one per node, joined by veth pairs to a bridge.

Every node (``master``, ``w0``, ``engine``, ...) is a namespace with its own address on 10.77.0.0/24; the
bridge lives in a namespace of its own, so the host's network (and any firewall the host's bridges pass
through) is never touched. Every namespace and link is made with a name that carries this process's id,
and removed by that name when the lab closes, also after a failure; what the lab of a killed test
process left, the next lab removes. Needs root and iproute2's ``ip``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.77.0"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (the skip reason), or None."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"ltprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def remove_stale() -> None:
    """Namespaces a lab of a process that no longer exists left behind (it was killed before its
    ``close``): removed by name, with their links."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in listed:
        m = re.match(r"^lt(\d+)-", name)
        if m and not Path("/proc", m.group(1)).exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Node:
    """One namespace: its name, address and the names of its veth pair (node side, bridge side)."""

    name: str
    netns: str
    address: str
    link: str
    peer: str


@dataclass
class Lab:
    """The namespaces and links of one test; ``close()`` removes all of them by name."""

    tag: str = field(default_factory=lambda: f"lt{os.getpid()}")  # links: lt<pid>n<k> ≤ 15 characters
    nodes: dict[str, Node] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def open(self, names: list[str]) -> Lab:
        self.close()  # anything an earlier, killed run of this pid left
        remove_stale()
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for k, name in enumerate(names):
            node = Node(name, f"{self.tag}-{name}", f"{SUBNET}.{k + 2}", f"{self.tag}n{k}", f"{self.tag}b{k}")
            self.nodes[name] = node
            _ip("netns", "add", node.netns)
            _ip("link", "add", node.link, "type", "veth", "peer", "name", node.peer)
            _ip("link", "set", node.peer, "netns", self.switch)
            _ip("link", "set", node.link, "netns", node.netns)
            _ip("-n", self.switch, "link", "set", node.peer, "master", "br0", "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", node.link)
            _ip("-n", node.netns, "link", "set", node.link, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        return self

    def start(self, node: str, argv: list[str], log: Path, cwd: Path) -> subprocess.Popen:
        """``argv`` inside ``node``'s namespace (``ip netns exec`` execs it: the pid is the command's)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.nodes[node].netns, *argv],
            stdout=open(log, "wb"),  # noqa: SIM115 - the child's
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
        self.procs.append(proc)
        return proc

    def run(self, node: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.nodes[node].netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cut(self, node: str) -> None:
        """Set ``node``'s link down: it can reach no other node, nor they it."""
        n = self.nodes[node]
        _ip("-n", n.netns, "link", "set", n.link, "down")

    def stop_processes(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        """Stop every process started here by its pid, then remove every link and namespace by name."""
        self.stop_processes()
        for link in os.listdir("/sys/class/net"):  # a pair still in the host's namespace
            if link.startswith((f"{self.tag}n", f"{self.tag}b")):
                subprocess.run(["ip", "link", "del", link], capture_output=True)
        for netns in self._namespaces():  # a namespace's links go with it (and their peers)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)

    def _namespaces(self) -> list[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        return [n for n in listed if n.startswith(f"{self.tag}-")]

    def leftovers(self) -> list[str]:
        """Namespaces and host links of this lab that still exist (none after ``close``)."""
        links = [n for n in os.listdir("/sys/class/net") if n.startswith((f"{self.tag}n", f"{self.tag}b"))]
        return self._namespaces() + links

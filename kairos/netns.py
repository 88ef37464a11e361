"""A process in a network namespace of its own, joined to the host by a veth pair, whose
traffic can be dropped and let through again: a real network partition for the chaos
suite (iproute2's ``ip netns``; needs root, as CI and these machines have).

The namespace ``kairos-<pid>-<n>`` holds one end of the pair (``10.213.<k>.2/30``) and
a default route to the host end (``10.213.<k>.1``), so every address the host owns is
reachable from inside. A cut installs blackhole routes on both sides: packets already
on an open connection vanish (the connection hangs as in a real partition, no reset),
and new connections fail. Nothing outside the namespace and the host's route to it is
touched, and ``delete()`` (or the next run, for namespaces of a process that died)
removes both ends.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = ipaddress.IPv4Network("10.213.0.0/16")  # one /30 per namespace, from here


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    argv = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"kairos-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_orphans() -> None:
    """Namespaces left by a run that was killed (its veth pair goes with them)."""
    for line in _ip("netns", "list", check=False).splitlines():
        m = re.match(r"kairos-(\d+)-\S+", line)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "del", m.group(0), check=False)


def _used_subnets() -> set[ipaddress.IPv4Network]:
    return {ipaddress.IPv4Network(f"{m.group(1)}/30", strict=False)
            for m in re.finditer(r"inet (10\.213\.\d+\.\d+)/\d+", _ip("-4", "addr", check=False))}


@dataclass
class NetworkNamespace:
    index: int  # unique among this process's namespaces
    name: str = ""
    host_ip: str = ""  # the host's end: reachable from inside (and the host's own address)
    ns_ip: str = ""  # the namespace's end: where the host reaches a process inside
    cut_now: bool = False
    _host_if: str = field(default="", repr=False)

    @classmethod
    def create(cls, index: int) -> NetworkNamespace:
        remove_orphans()
        ns = cls(index)
        ns.name = f"kairos-{os.getpid()}-{index}"
        subnet = next(s for s in SUBNET.subnets(new_prefix=30) if s not in _used_subnets())
        host, inside = list(subnet.hosts())
        ns.host_ip, ns.ns_ip = str(host), str(inside)
        tag = f"{os.getpid() % 100000}{index}"  # interface names: at most 15 characters
        ns._host_if, peer = f"kvh{tag}", f"kvn{tag}"
        try:
            _ip("netns", "add", ns.name)
            _ip("link", "add", ns._host_if, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns.name)
            _ip("addr", "add", f"{host}/30", "dev", ns._host_if)
            _ip("link", "set", ns._host_if, "up")
            _ip("link", "set", "lo", "up", netns=ns.name)
            _ip("addr", "add", f"{inside}/30", "dev", peer, netns=ns.name)
            _ip("link", "set", peer, "up", netns=ns.name)
            _ip("route", "add", "default", "via", str(host), netns=ns.name)
        except Exception:
            ns.delete()
            raise
        return ns

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Drop every packet between the namespace and the host, both ways."""
        _ip("route", "replace", "blackhole", "default", netns=self.name)
        _ip("route", "replace", "blackhole", f"{self.host_ip}/32", netns=self.name)
        _ip("route", "replace", "blackhole", f"{self.ns_ip}/32")
        self.cut_now = True

    def heal(self) -> None:
        _ip("route", "del", "blackhole", f"{self.host_ip}/32", netns=self.name, check=False)
        _ip("route", "replace", "default", "via", self.host_ip, netns=self.name, check=False)
        _ip("route", "del", "blackhole", f"{self.ns_ip}/32", check=False)
        self.cut_now = False

    def delete(self) -> None:
        if self.cut_now:
            self.heal()
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            _ip("netns", "del", self.name, check=False)
        if self._host_if:  # gone with its peer, unless the namespace never got it
            _ip("link", "del", self._host_if, check=False)

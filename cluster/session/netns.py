"""A network for separate machines on this one: a bridge of its own on the host (never docker's ``docker0``), and per
machine a network namespace joined to it by a veth pair, with an address of its own. The host keeps the bridge's
first address (the gateway): a machine reaches the host's own addresses through it, the host reaches each machine
at its address, and the machines reach each other on the bridge; nothing else routes there (no IP forwarding, no
NAT). A machine's ``127.0.0.1`` is its own.

Taking the host end of a machine's link down cuts it off both ways, as a partition does; bringing it up restores it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

NETNS_DIR = Path("/run/netns")


def ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS`` on the host, or inside network namespace ``namespace``."""
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done


class Network:
    """The bridge ``name`` with subnet ``10.199.<third>.0/24``; the host is ``.1``, machine ``n`` is ``.(n+10)``."""

    def __init__(self, name: str, third: int):
        self.name, self.third = name, third

    @classmethod
    def for_process(cls, prefix: str = "rfn") -> "Network":
        """A network named after this process, on a subnet no address of the host is on yet (two sessions on one
        host never share a bridge or a subnet)."""
        taken = ip("-4", "-o", "addr").stdout
        third = next((t for t in range(os.getpid() % 250, os.getpid() % 250 + 250)
                      if f" 10.199.{t % 250}." not in taken), os.getpid() % 250)
        return cls(f"{prefix}{os.getpid() % 100000}", third % 250)

    @property
    def gateway(self) -> str:
        return f"10.199.{self.third}.1"

    def address(self, index: int) -> str:
        if not 1 <= index <= 240:
            raise ValueError(f"machine index {index} is outside 1..240")
        return f"10.199.{self.third}.{index + 10}"

    def exists(self) -> bool:
        return ip("link", "show", self.name, check=False).returncode == 0

    def create(self) -> "Network":
        if not self.exists():
            # A MAC of its own: a bridge without one takes its lowest port's, so a machine that leaves could change
            # the gateway's MAC under the others, whose ARP entries then send every packet for the head nowhere
            # until they expire (long enough for Ray to declare those machines dead).
            ip("link", "add", "name", self.name, "address", f"02:52:46:c7:{self.third:02x}:01", "type", "bridge")
            ip("addr", "add", f"{self.gateway}/24", "dev", self.name)
        ip("link", "set", self.name, "up")
        if shutil.which("iptables") and not self._forwarding("-C"):
            self._forwarding("-I", check=True)
        return self

    def _forwarding(self, action: str, check: bool = False) -> bool:
        """Frames between two machines on the bridge pass the host's FORWARD chain when ``br_netfilter`` is loaded
        (docker loads it, and sets that chain's policy to DROP): one rule lets the bridge's own traffic through."""
        command = ["iptables", action, "FORWARD", "-i", self.name, "-o", self.name, "-j", "ACCEPT"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
        return done.returncode == 0

    def delete(self) -> None:
        if shutil.which("iptables"):
            while self._forwarding("-D"):
                pass
        ip("link", "del", self.name, check=False)

    def state(self) -> dict:
        return {"name": self.name, "third": self.third}

    @classmethod
    def from_state(cls, state: dict) -> "Network":
        return cls(state["name"], state["third"])


class NetNamespace:
    """Network namespace ``name`` on ``network`` at ``network.address(index)``: loopback, one link (``eth0``) and a
    default route through the host."""

    def __init__(self, name: str, network: Network, index: int):
        self.name, self.network, self.index = name, network, index
        self.address = network.address(index)
        self.link = f"{network.name[:9]}v{index}"
        """The host end of the veth pair (the machine's end is its ``eth0``)."""

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def create(self) -> "NetNamespace":
        self.delete()  # what a killed run left under the same name
        ip("netns", "add", self.name)
        ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns", self.name)
        ip("link", "set", self.link, "master", self.network.name, "up")
        ip("addr", "add", f"{self.address}/24", "dev", "eth0", namespace=self.name)
        ip("link", "set", "eth0", "up", namespace=self.name)
        ip("link", "set", "lo", "up", namespace=self.name)
        ip("route", "add", "default", "via", self.network.gateway, namespace=self.name)
        return self

    def enter(self) -> list[str]:
        """The command prefix that runs a command in this namespace (and nothing else of it: no mount namespace)."""
        return ["nsenter", f"--net={self.path}"]

    def cut(self) -> None:
        """A partition: the link's host end down, no packet either way until ``restore``."""
        ip("link", "set", self.link, "down")

    def restore(self) -> None:
        ip("link", "set", self.link, "up")

    def delete(self) -> None:
        ip("link", "del", self.link, check=False)
        ip("netns", "del", self.name, check=False)

"""A private network namespace joined to this one by a veth pair, whose connections can go silent.

For the half-open tests (docs/high-availability.md, silent networks): a process run in
the namespace (``wrap(argv)``) reaches this namespace's servers through the veth pair at
``host_addr``. ``silence(ports)`` drops, in both directions, every packet of the
connections whose namespace-side port is one of ``ports``, where each end of the pair
receives it (nftables netdev ingress rules, so neither sender's own stack sees an
error): no FIN, no RST, and no kernel in between that acknowledges data or answers TCP
keepalive probes, as after a NAT or load-balancer timeout; new connections (new ports)
still work. Unlike tests/integration/tcp_proxy.py this tests TCP keepalives. (The
machine's kernel has no tc drop action nor netem: nftables it is.)

Owns only what it creates: the namespace, the veth pair (10.231.N.0/30, N unused on
this machine) and one nft table per end of it, each bound to its own veth device;
``veth_namespace()`` removes all of it on exit, whatever happened. Needs root
(CAP_NET_ADMIN), ``ip`` (iproute2) and ``nft`` (nftables); ``unavailable()`` says why
not, in one line.

Must not: touch an interface, address, route or rule it did not create.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from itertools import count

_SEQUENCE = count()


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def unavailable() -> str | None:
    """None when this process may create network namespaces, else why not (one line)."""
    name = f"cdcr-probe-{os.getpid()}"
    try:
        _ip("ip", "netns", "add", name)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces unavailable (needs root and iproute2): {exc}"
    try:
        _ip("ip", "netns", "exec", name, "nft", "add", "table", "netdev", "probe")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"nftables unavailable (apt-get install nftables): {exc}"
    finally:
        _ip("ip", "netns", "del", name, check=False)
    return None


@dataclass(frozen=True)
class Netns:
    name: str
    host_if: str
    host_addr: str  # this namespace's end of the veth pair: servers listen here
    ns_addr: str  # the namespace's end: its processes' connections come from here

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def client_ports(self, port: int) -> set[int]:
        """Namespace-side ports of the established connections to ``host_addr:port``."""
        out = _ip(*self.wrap(["ss", "-Htn", "state", "established", "dst", self.host_addr,
                              "dport", "=", f":{port}"]))
        return {int(line.split()[2].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}

    def silence(self, ports: set[int]) -> None:
        """Drop every packet of the connections with these namespace-side ports, both ways."""
        listed = "{ " + ", ".join(str(p) for p in sorted(ports)) + " }"
        _ip("nft", "add", "rule", "netdev", self.name, "in", "ip", "saddr", self.ns_addr,
            "tcp", "sport", listed, "drop")
        _ip(*self.wrap(["nft", "add", "rule", "netdev", self.name, "in", "ip", "saddr",
                        self.host_addr, "tcp", "dport", listed, "drop"]))


def _ingress_table(prefix: Sequence[str], table: str, device: str) -> None:
    """An empty netdev table whose chain sees what ``device`` receives."""
    _ip(*prefix, "nft", "add", "table", "netdev", table)
    _ip(*prefix, "nft", "add", "chain", "netdev", table, "in",
        f"{{ type filter hook ingress device {device} priority 0; }}")


def _free_subnet() -> int:
    used = _ip("ip", "-4", "-o", "addr", "show")
    for n in range(1 + os.getpid() % 200, 255):
        if f"10.231.{n}." not in used:
            return n
    raise RuntimeError("no free 10.231.N.0/30 subnet for a test veth pair")


@contextmanager
def veth_namespace() -> Iterator[Netns]:
    """A namespace with a veth pair to this one; removed (with its filters) on exit."""
    tag = f"{os.getpid() % 100000}{next(_SEQUENCE)}"
    name, host_if, ns_if = f"cdcr{tag}", f"cdcrh{tag}", f"cdcrn{tag}"
    n = _free_subnet()
    netns = Netns(name, host_if, f"10.231.{n}.1", f"10.231.{n}.2")
    try:
        _ip("ip", "netns", "add", name)
        _ip("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("ip", "link", "set", ns_if, "netns", name)
        _ip("ip", "addr", "add", f"{netns.host_addr}/30", "dev", host_if)
        _ip("ip", "link", "set", host_if, "up")
        _ip("ip", "-n", name, "addr", "add", f"{netns.ns_addr}/30", "dev", ns_if)
        _ip("ip", "-n", name, "link", "set", ns_if, "up")
        _ip("ip", "-n", name, "link", "set", "lo", "up")
        _ingress_table((), name, host_if)
        _ingress_table(netns.wrap([]), name, ns_if)
        yield netns
    finally:
        with suppress(OSError, subprocess.TimeoutExpired):
            _ip("nft", "delete", "table", "netdev", name, check=False)
            _ip("ip", "netns", "del", name, check=False)  # takes the pair and its own table
            _ip("ip", "link", "del", host_if, check=False)

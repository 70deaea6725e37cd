"""Hosts on one machine for the multi-host benchmarks: network namespaces, each joined to this one
by a veth of its own (needs root and `ip`)."""

from __future__ import annotations

import contextlib
import os
import subprocess


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def other_hosts(n: int, tag: str = "dpf", net: int = 79):
    """[(netns name, our address on its link, its address, our end of the link)] for n hosts; host i is
    10.(net+i).X.2, with a default route through us (so it reaches our other links' addresses, not
    each other). Raises CalledProcessError or FileNotFoundError where namespaces cannot be made."""
    made = []
    try:
        for i in range(n):
            ns, subnet = f"{tag}{os.getpid() % 100_000}{i}", f"10.{net + i}.{os.getpid() % 250}"
            made.append(ns)
            ip("netns", "add", ns)
            ip("link", "add", f"{ns}v", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("addr", "add", f"{subnet}.1/24", "dev", f"{ns}v")
            ip("link", "set", f"{ns}v", "up")
            ip("-n", ns, "addr", "add", f"{subnet}.2/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", f"{subnet}.1")
        yield [(ns, f"10.{net + i}.{os.getpid() % 250}.1", f"10.{net + i}.{os.getpid() % 250}.2", f"{ns}v")
               for i, ns in enumerate(made)]
    finally:
        for ns in made:
            subprocess.run(["ip", "link", "del", f"{ns}v"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_host(ns: str, *cmd: str) -> list[str]:
    """The command in that host's network (nsenter, not `ip netns exec`, which mounts a /sys without
    tracefs: the eBPF probes would be skipped)."""
    return ["nsenter", f"--net=/run/netns/{ns}", *cmd]

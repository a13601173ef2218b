#!/usr/bin/env python3
"""Prints N free loopback TCP ports (default 1), one per line, for the
process tests. The ports lie outside the kernel's ephemeral range
(net.ipv4.ip_local_port_range), so that no outgoing connection can take one
as its source port between now and the moment a worker binds it; the same
rule as common/ports.h."""
import random
import socket
import sys


def ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first, last = (int(x) for x in f.read().split())
            return first, last
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count):
    first, last = ephemeral_range()
    candidates = list(range(10000, max(10000, first))) + list(range(last + 1, 65536))
    held, ports = [], []
    try:
        for _ in range(count):
            for port in random.sample(candidates, min(64, len(candidates))) + [0]:
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                held.append(s)
                ports.append(s.getsockname()[1])
                break
            else:
                sys.exit("free_ports: no free loopback port")
    finally:
        for s in held:
            s.close()
    return ports


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print("\n".join(str(p) for p in free_ports(n)))

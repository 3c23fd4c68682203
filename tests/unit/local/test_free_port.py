"""`free_port` never hands the same port out twice in a process: the kernel may offer a
port just closed again, and two brokers of one fault test were once given the same port
(one could not listen, and the cluster never had its three brokers)."""

from __future__ import annotations

import socket

from gazette.local import free_port


def test_free_ports_are_distinct_and_free() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out

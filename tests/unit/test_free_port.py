"""The ports a run gives its members: each one free when chosen, and never the same one twice
(two members given one port: the second cannot listen)."""

import socket

from daskprobe.tracer.capture.cluster import HOST, free_port


def test_no_port_is_handed_out_twice():
    # 2,000 draws from about 22,000 ports: some 90 repeats at random were there no memory of them
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_a_port_handed_out_can_be_listened_on():
    with socket.socket() as s:
        s.bind((HOST, free_port()))
        s.listen()

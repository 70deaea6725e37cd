"""A link that holds every frame DELAY_MS before passing it on, in both directions: what netem's
delay would do, on a kernel without netem. Run in a network namespace between two veth ends;
frames pass unchanged (their offload headers too), so each end sees the same TCP connection.

    python relay.py DEV_A DEV_B DELAY_MS      (prints "ready", runs until killed)
"""

import queue
import socket
import sys
import threading
import time

ETH_P_ALL, SOL_PACKET, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING = 3, 263, 15, 23


def packet_socket(dev: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)  # a segmentation-offloaded frame passes whole, as read
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)  # not what the other direction sends out here
    s.bind((dev, ETH_P_ALL))
    return s


def forward(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    held: queue.Queue = queue.Queue()  # one delay for all: first in, first out

    def send() -> None:
        while True:
            due, frame = held.get()
            time.sleep(max(0.0, due - time.monotonic()))
            dst.send(frame)

    threading.Thread(target=send, daemon=True).start()
    while True:
        frame = src.recv(1 << 17)
        held.put((time.monotonic() + delay_s, frame))


def main(a: str, b: str, delay_ms: str) -> None:
    sa, sb = packet_socket(a), packet_socket(b)
    delay = float(delay_ms) / 1e3
    threading.Thread(target=forward, args=(sb, sa, delay), daemon=True).start()
    print("ready", flush=True)
    forward(sa, sb, delay)


if __name__ == "__main__":
    main(*sys.argv[1:4])

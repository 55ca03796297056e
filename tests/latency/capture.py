"""Capture packets in a separate process (so the sniffer never competes with the measuring client
for the GIL): `python capture.py IFACE FILTER OUT.pcap`, prints READY, stops when stdin closes."""

from __future__ import annotations

import sys


def main() -> None:
    from scapy.all import AsyncSniffer, wrpcap

    iface, bpf, out = sys.argv[1:4]
    sniffer = AsyncSniffer(iface=iface, filter=bpf, store=True)
    sniffer.start()
    import time

    time.sleep(0.2)  # the capture socket is open once start() has spun up the thread
    print("READY", flush=True)
    sys.stdin.read()
    time.sleep(0.5)  # a loaded machine lets the sniffer thread lag; let it drain the socket
    wrpcap(out, sniffer.stop())


if __name__ == "__main__":
    main()

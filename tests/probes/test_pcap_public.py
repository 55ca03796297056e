"""probe tcp --read on public captures (tests/probes/data, sources in its README), compared at test time
with tshark's own dissection and with p0f 3.09b's raw_sig of every SYN and SYN/ACK."""

from __future__ import annotations

from pathlib import Path

import pytest
from wire_refs import p0f_available, p0f_signatures, stream_key, tshark_available, tshark_view

from zgtool.probes.pcap import analyse_packets, read_capture

DATA = Path(__file__).parent / "data"
CAPTURES = sorted(p for p in DATA.iterdir() if p.suffix in (".pcap", ".pcapng"))


def test_the_public_captures_are_present_and_small() -> None:
    assert len(CAPTURES) >= 15
    assert all(p.stat().st_size < 200_000 for p in CAPTURES)
    listed = (DATA / "README.md").read_text()
    assert all(p.name in listed for p in CAPTURES)  # every file has its source and licence


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_stream_matches_tshark(path: Path) -> None:
    if not tshark_available():
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    a = analyse_packets(read_capture(path), source=str(path))
    ours = {stream_key(s.client, s.server): s for s in a.streams}
    theirs = tshark_view(path).streams
    assert set(theirs) <= set(ours)
    for key, t in theirs.items():
        s = ours[key]
        if t.synack_ttl is not None:
            assert (s.server_ttl, s.server_window, s.server_mss, s.server_wscale) == (
                t.synack_ttl, t.synack_window, t.synack_mss, t.synack_wscale), key
        if t.initial_rtt_ms is not None:  # tshark: the last SYN -> the ACK that completes the handshake
            assert s.handshake_ms == pytest.approx(t.initial_rtt_ms, abs=0.002), key
        assert (s.retransmissions, s.out_of_order) == (t.retransmissions, t.out_of_order), key


def test_signatures_match_p0f_on_every_public_capture() -> None:
    if not p0f_available():
        pytest.skip("p0f is not installed (scripts/setup.sh installs it)")
    compared = 0
    for path in CAPTURES:
        ours = {stream_key(s.client, s.server): s for s in analyse_packets(read_capture(path)).streams}
        for mod, cli, srv, sig in p0f_signatures(path):
            s = ours[stream_key(cli, srv)]
            assert (s.client_signature if mod == "syn" else s.server_signature) == sig, (path.name, mod, cli)
            compared += 1
    assert compared >= 30


def test_encapsulations_in_the_public_captures_are_noted() -> None:
    notes = analyse_packets(read_capture(DATA / "zeek_mixed-vlan-mpls.pcap")).notes
    assert any("MPLS-encapsulated (label stacks 29)" in n for n in notes)
    assert any("VLAN tags" in n for n in analyse_packets(read_capture(DATA / "zeek_http-qinq-0.pcap")).notes)

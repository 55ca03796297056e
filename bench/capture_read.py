"""How fast a capture is read: the hand-written reader issue 34 replaced vs scapy's streaming readers.

    .venv/bin/python bench/capture_read.py [--size-mb 64] [--format pcap|pcapng] [--repeats 2] [--keep FILE]

Generates one capture of --size-mb (Ethernet; TCP streams of a handshake, a 300-byte request, eight
1448-byte response segments, ACKs and FINs: ~690 bytes a frame), then reads it with each reader,
alternating, --repeats times, every read in its own child process (so each peak RSS is its own):
  frames  every record's bytes and timestamp. old: capfile.read_records (the whole file read into memory);
          new: scapy's RawPcapReader / RawPcapNgReader, one record at a time.
  ip      every IP packet as a scapy object, as `probe tcp --read` needs them (counted, not kept).
          old: read_records + linklayer.decode + IP()/IPv6(); new: probes/capfile.py's CaptureReader
          (scapy's PcapReader / PcapNgReader dissecting from the link layer, with the record checks) +
          linklayer.find_ip.
"old" is probes/capfile.py + probes/linklayer.py as of HAND_READER_REV, loaded from git (this must run in
the repository's checkout). Times are the reading process's CPU seconds (on a shared machine the wall
clock mostly measures the neighbours; each read's wall time is printed beside it). Prints per level the
best CPU seconds, MB/s, microseconds a record and peak RSS,
the ratio new/old, and both extrapolated to 1 GiB (linear in records: the readers stream or scale with
the file). The issue's rule: keep the hand reader only if scapy is > 3x slower AND > 60 s for 1 GiB.
The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HAND_READER_REV = "7e1b309"        # the last commit with the hand-written pcap/pcapng reader
GIB = 1024 ** 3
LEVELS = ("frames", "ip")
READERS = ("old", "new")
KEEP_RULE = {"slower_than_x": 3.0, "gib_over_s": 60.0}


# --- the capture ------------------------------------------------------------------------------------

def stream_frames(port: int) -> list[bytes]:
    """One TCP stream's Ethernet frames (client 10.0.0.2:port -> server 10.0.0.9:8000)."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    opts = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)]

    def seg(c2s: bool, flags: str, seq: int, ack: int, data: bytes = b"", **kw: Any) -> bytes:
        src, dst = ("10.0.0.2", "10.0.0.9") if c2s else ("10.0.0.9", "10.0.0.2")
        sport, dport = (port, 8000) if c2s else (8000, port)
        p = Ether() / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, **kw)
        return bytes(p / data) if data else bytes(p)

    c, s = 1000, 5000
    req = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n".ljust(300, b"x")
    out = [seg(True, "S", c, 0, options=opts), seg(False, "SA", s, c + 1, options=opts),
           seg(True, "A", c + 1, s + 1), seg(True, "PA", c + 1, s + 1, req)]
    c += 1 + len(req)
    s += 1
    for i in range(8):
        out.append(seg(False, "A", s + 1448 * i, c, bytes([65 + i]) * 1448))
        if i % 2:
            out.append(seg(True, "A", c, s + 1448 * (i + 1)))
    s += 8 * 1448
    out += [seg(False, "FA", s, c), seg(True, "FA", c, s + 1), seg(False, "A", s + 1, c + 1)]
    return out


def write_capture(path: Path, size_bytes: int, fmt: str) -> int:
    """Frames of 64 streams repeated (new timestamps) until the file holds size_bytes; the record count."""
    streams = [stream_frames(40000 + i) for i in range(64)]
    n, t_us, written = 0, 1_700_000_000 * 10**6, 0
    with path.open("wb") as f:
        if fmt == "pcap":
            written += f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        else:
            written += f.write(struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28))
            written += f.write(struct.pack("<IIHHII", 1, 20, 1, 0, 65535, 20))
        while written < size_bytes:
            for frames in streams:
                for data in frames:
                    t_us += 37
                    if fmt == "pcap":
                        rec = struct.pack("<IIII", t_us // 10**6, t_us % 10**6, len(data), len(data)) + data
                    else:
                        pad = -len(data) % 4
                        blen = 32 + len(data) + pad
                        rec = (struct.pack("<IIIIIII", 6, blen, 0, t_us >> 32, t_us & 0xFFFFFFFF, len(data),
                                           len(data)) + data + b"\0" * pad + struct.pack("<I", blen))
                    written += f.write(rec)
                    n += 1
    return n


# --- the readers (one per child process) -----------------------------------------------------------

def hand_reader() -> tuple[Any, Any]:
    """probes/capfile.py and probes/linklayer.py as of HAND_READER_REV, as modules."""
    mods = []
    for name in ("capfile", "linklayer"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{HAND_READER_REV}:probes/{name}.py"],
                             capture_output=True, text=True, check=True).stdout
        mod = types.ModuleType(f"hand_{name}")
        sys.modules[mod.__name__] = mod          # dataclasses look their module up there
        exec(compile(src, f"{HAND_READER_REV}:probes/{name}.py", "exec"), mod.__dict__)  # noqa: S102
        mods.append(mod)
    return mods[0], mods[1]


def read_old(level: str, path: str) -> tuple[int, int]:
    capfile, linklayer = hand_reader()
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6

    records = ips = 0
    for rec in capfile.read_records(path).records:
        records += 1
        if level == "ip":
            d = linklayer.decode(rec.linktype, rec.data)
            if d.ip is not None:
                pkt = IP(d.ip) if d.ip[0] >> 4 == 4 else IPv6(d.ip)
                pkt.time = rec.time_s
                ips += 1
    return records, ips


def read_new(level: str, path: str) -> tuple[int, int]:
    from zgtool.probes.capfile import CaptureReader
    from zgtool.probes.linklayer import find_ip

    records = ips = 0
    if level == "frames":
        from scapy.utils import RawPcapReader

        with RawPcapReader(path) as raw:        # scapy's metaclass picks RawPcapNgReader for pcapng
            for _data, _meta in raw:
                records += 1
        return records, ips
    reader = CaptureReader(path)
    for pkt in reader:
        records += 1
        ips += find_ip(pkt).ip is not None
    return records, ips


def child(level: str, which: str, path: str) -> None:
    import scapy.layers.inet  # noqa: F401  (imports outside the timed read)
    import scapy.layers.inet6  # noqa: F401
    import scapy.layers.l2  # noqa: F401

    from zgtool.probes.linklayer import load

    load()
    t0, c0 = time.perf_counter(), time.process_time()
    records, ips = (read_old if which == "old" else read_new)(level, path)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": cpu, "wall_s": wall, "records": records, "ip_packets": ips, "max_rss_kb": rss_kb}))


def run_child(level: str, which: str, path: Path) -> dict[str, Any]:
    r = subprocess.run([sys.executable, __file__, "--child", level, which, str(path)], capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"capture_read: the {which} reader failed at level {level}:\n{r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


# --- main -------------------------------------------------------------------------------------------

def measure(path: Path, repeats: int) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for level in LEVELS:
        for rep in range(repeats):
            order = READERS if rep % 2 == 0 else READERS[::-1]    # alternate, so load drifts hit both
            for which in order:
                r = run_child(level, which, path)
                key = f"{level}_{which}"
                if key not in best or r["seconds"] < best[key]["seconds"]:
                    best[key] = {**r, "max_rss_kb": max(r["max_rss_kb"], best.get(key, {}).get("max_rss_kb", 0))}
                print(f"  {level:<6} {which}: {r['seconds']:8.2f} s CPU, {r['wall_s']:8.2f} s wall  ({r['records']} records, "
                      f"{r['max_rss_kb'] / 1024:.0f} MiB peak RSS)", flush=True)
    return best


def report(best: dict[str, dict[str, Any]], size: int, records: int) -> dict[str, Any]:
    scale = GIB / size
    figures: dict[str, Any] = {}
    print(f"\n{'level':<7}{'reader':<7}{'CPU s':>9}{'MB/s':>9}{'us/rec':>9}{'peak MiB':>10}{'1 GiB s':>10}")
    for level in LEVELS:
        for which in READERS:
            r = best[f"{level}_{which}"]
            row = {"seconds": round(r["seconds"], 3), "mb_per_s": round(size / 1e6 / r["seconds"], 1),
                   "us_per_record": round(r["seconds"] / records * 1e6, 2),
                   "wall_s": round(r["wall_s"], 3), "peak_rss_mib": round(r["max_rss_kb"] / 1024, 1),
                   "gib_seconds": round(r["seconds"] * scale, 1),
                   "ip_packets": r["ip_packets"]}
            figures[f"{level}_{which}"] = row
            print(f"{level:<7}{which:<7}{row['seconds']:>9.2f}{row['mb_per_s']:>9.1f}{row['us_per_record']:>9.2f}"
                  f"{row['peak_rss_mib']:>10.0f}{row['gib_seconds']:>10.1f}")
        ratio = best[f"{level}_new"]["seconds"] / best[f"{level}_old"]["seconds"]
        figures[f"{level}_new_over_old"] = round(ratio, 3)
        print(f"{level}: scapy's reader takes x{ratio:.2f} the hand reader's time")
    slow = figures["ip_new_over_old"] > KEEP_RULE["slower_than_x"]
    long = figures["ip_new"]["gib_seconds"] > KEEP_RULE["gib_over_s"]
    figures["keep_hand_reader"] = slow and long
    print(f"rule (keep the hand reader if scapy is > {KEEP_RULE['slower_than_x']:g}x slower and > "
          f"{KEEP_RULE['gib_over_s']:g} s for 1 GiB, level ip): {'keep it' if slow and long else 'scapy'}")
    return figures


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=64.0, help="capture size (1024: the issue's 1 GiB)")
    ap.add_argument("--format", choices=("pcap", "pcapng"), default="pcap")
    ap.add_argument("--repeats", type=int, default=2, help="reads per reader and level (the best is kept)")
    ap.add_argument("--keep", type=Path, help="write the capture here (kept) instead of a temporary file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zg-capread-") as tmp:
        path = args.keep or Path(tmp) / f"bench.{args.format}"
        records = write_capture(path, int(args.size_mb * 1e6), args.format)
        size = path.stat().st_size
        print(f"capture: {path.name}, {size / 1e6:.1f} MB, {records} records ({size / records:.0f} bytes each)")
        best = measure(path, args.repeats)
    figures = report(best, size, records)
    print(json.dumps({"bench": "capture_read", "format": args.format, "size_bytes": size, "records": records,
                      "repeats": args.repeats, "hand_reader_rev": HAND_READER_REV,
                      "extrapolated_to_bytes": GIB, **figures, "rule": KEEP_RULE}))


if __name__ == "__main__":
    main()

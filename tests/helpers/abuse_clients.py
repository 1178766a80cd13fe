#!/usr/bin/python3
"""Hostile HTTP clients for the exporter's abuse tests and bench/exporter_abuse.py.

Run as a script, as the unprivileged attacker (standard library only, so the system
python runs it as any user); each mode prints one JSON line with what it saw:

* ``flood PORT N SECONDS``: holds N connections that never send a byte (half-open from
  the server's side), opening a new one for each the server closes; prints ``ready``
  once N were opened the first time.
* ``slowloris PORT INTERVAL LIMIT``: a request line, then one header byte per INTERVAL s,
  never the blank line; reports when the server closed it (null: still open at LIMIT s).
* ``nonreader PORT LIMIT``: pipelines GET /metrics and never reads a byte; reports when
  the server dropped it after its writes stalled (null: still held at LIMIT s).
* ``talker PORT N SECONDS``: holds N connections that each ask for /metrics again as soon
  as the last response is in, opening a new one for each the server closes; prints
  ``ready`` once N answers came.
"""

import json
import select
import socket
import sys
import time
from typing import Dict, List, Optional, Tuple

HOST = "127.0.0.1"
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def closed_by_server(sock: socket.socket) -> bool:
    """Did the server end this connection we never read from? (non-blocking)"""
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def slowloris(port: int, interval: float, limit: float) -> Dict[str, Optional[float]]:
    start = time.monotonic()
    try:
        s = socket.create_connection((HOST, port), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
    except OSError:  # closed at once (over the cap)
        return {"closed_after_s": 0.0}
    s.setblocking(False)
    while time.monotonic() - start < limit:
        if closed_by_server(s):
            return {"closed_after_s": round(time.monotonic() - start, 3)}
        try:
            s.send(b"X")
        except BlockingIOError:
            pass
        except OSError:
            return {"closed_after_s": round(time.monotonic() - start, 3)}
        time.sleep(interval)
    return {"closed_after_s": None}


def nonreader(port: int, limit: float) -> Dict[str, Optional[float]]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
    start = time.monotonic()
    try:
        s.connect((HOST, port))
    except OSError:  # closed at once (over the cap)
        return {"dropped_after_s": 0.0, "requests": 0}
    s.setblocking(False)
    poller = select.poll()
    poller.register(s, select.POLLOUT)
    sent = 0
    while time.monotonic() - start < limit:
        events = dict(poller.poll(100))
        if events.get(s.fileno(), 0) & GONE:
            return {"dropped_after_s": round(time.monotonic() - start, 3), "requests": sent}
        try:
            s.send(REQUEST)  # a partial send only ever splits the last request
            sent += 1
        except BlockingIOError:
            pass
        except OSError:
            return {"dropped_after_s": round(time.monotonic() - start, 3), "requests": sent}
    return {"dropped_after_s": None, "requests": sent}


def responses_in(buf: bytearray) -> int:
    """Take the whole responses off the front of ``buf``; how many there were."""
    n = 0
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return n
        length = 0
        for line in bytes(buf[:end]).split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buf) < end + 4 + length:
            return n
        del buf[:end + 4 + length]
        n += 1


def hold(port: int, n: int, seconds: float, ask: bool) -> Dict[str, int]:
    """N connections held for SECONDS, each one the server closes replaced at the next
    turn: silent ones (the flood: "ready" once N were opened) or ones that ask for
    /metrics again as soon as the last response is in (the talkers: "ready" once N
    answers came)."""
    held: Dict[int, Tuple[socket.socket, bytearray]] = {}
    poller = select.poll()
    seen = {"opened": 0, "closed_by_server": 0, "answered": 0, "connect_failed": 0}
    end = time.monotonic() + seconds
    announced = False
    while time.monotonic() < end:
        while len(held) < n and time.monotonic() < end:
            try:
                s = socket.create_connection((HOST, port), timeout=2)
                if ask:
                    s.sendall(REQUEST)
            except OSError:
                seen["connect_failed"] += 1
                break
            s.setblocking(False)
            held[s.fileno()] = (s, bytearray())
            poller.register(s, select.POLLIN)
            seen["opened"] += 1
        if not announced and (seen["answered"] if ask else len(held)) >= n:
            print("ready", flush=True)
            announced = True
        for fd, _ in poller.poll(50):
            s, buf = held[fd]
            answered = asked_again(s, buf) if ask else (None if closed_by_server(s) else 0)
            if answered is not None:
                seen["answered"] += answered
                continue
            poller.unregister(fd)  # closed by the server: replaced at the next turn
            s.close()
            del held[fd]
            seen["closed_by_server"] += 1
    for s, _ in held.values():
        s.close()
    if not ask:
        del seen["answered"]
    return seen


def asked_again(s: socket.socket, buf: bytearray) -> Optional[int]:
    """Read what came on an asking connection and ask again once a response is whole: how
    many responses came (None: the server closed the connection)."""
    try:
        data = s.recv(65536)
        if not data:
            return None
        buf += data
        got = responses_in(buf)
        if got:
            s.send(REQUEST)  # a few dozen bytes: the send buffer has room
        return got
    except BlockingIOError:
        return 0
    except OSError:
        return None


def main(argv: List[str]) -> int:
    mode, port = argv[0], int(argv[1])
    if mode in ("flood", "talker"):
        result: dict = hold(port, int(argv[2]), float(argv[3]), ask=mode == "talker")
    elif mode == "slowloris":
        result = slowloris(port, float(argv[2]), float(argv[3]))
    elif mode == "nonreader":
        result = nonreader(port, float(argv[2]))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

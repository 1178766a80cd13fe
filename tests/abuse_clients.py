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
GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def closed_by_server(sock: socket.socket) -> bool:
    """Did the server end this connection we never read from? (non-blocking)"""
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def flood(port: int, n: int, seconds: float) -> Dict[str, int]:
    held: Dict[int, socket.socket] = {}
    poller = select.poll()
    opened = replaced = failed = 0
    end = time.monotonic() + seconds
    announced = False
    while time.monotonic() < end:
        while len(held) < n and time.monotonic() < end:
            try:
                s = socket.create_connection((HOST, port), timeout=2)
            except OSError:
                failed += 1
                break
            s.setblocking(False)
            held[s.fileno()] = s
            poller.register(s, select.POLLIN)
            opened += 1
        if not announced and len(held) >= n:
            print("ready", flush=True)
            announced = True
        for fd, _ in poller.poll(50):
            s = held[fd]
            if closed_by_server(s):
                poller.unregister(fd)
                s.close()
                del held[fd]
                replaced += 1
    for s in held.values():
        s.close()
    return {"opened": opened, "closed_by_server": replaced, "connect_failed": failed}


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
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    poller = select.poll()
    poller.register(s, select.POLLOUT)
    sent = 0
    while time.monotonic() - start < limit:
        events = dict(poller.poll(100))
        if events.get(s.fileno(), 0) & GONE:
            return {"dropped_after_s": round(time.monotonic() - start, 3), "requests": sent}
        try:
            s.send(request)  # a partial send only ever splits the last request
            sent += 1
        except BlockingIOError:
            pass
        except OSError:
            return {"dropped_after_s": round(time.monotonic() - start, 3), "requests": sent}
    return {"dropped_after_s": None, "requests": sent}


REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


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


def talker(port: int, n: int, seconds: float) -> Dict[str, int]:
    held: Dict[int, Tuple[socket.socket, bytearray]] = {}
    poller = select.poll()
    opened = replaced = answered = failed = 0
    end = time.monotonic() + seconds
    announced = False
    while time.monotonic() < end:
        while len(held) < n and time.monotonic() < end:
            try:
                s = socket.create_connection((HOST, port), timeout=2)
                s.sendall(REQUEST)
            except OSError:
                failed += 1
                break
            s.setblocking(False)
            held[s.fileno()] = (s, bytearray())
            poller.register(s, select.POLLIN)
            opened += 1
        if not announced and answered >= n:
            print("ready", flush=True)
            announced = True
        for fd, _ in poller.poll(50):
            s, buf = held[fd]
            try:
                data = s.recv(65536)
                if data:
                    buf += data
                    got = responses_in(buf)
                    if got:
                        answered += got
                        s.send(REQUEST)  # a few dozen bytes: the send buffer has room
                    continue
            except BlockingIOError:
                continue
            except OSError:
                pass
            poller.unregister(fd)  # closed by the server: replaced at the next turn
            s.close()
            del held[fd]
            replaced += 1
    for s, _ in held.values():
        s.close()
    return {"opened": opened, "closed_by_server": replaced, "answered": answered,
            "connect_failed": failed}


def main(argv: List[str]) -> int:
    mode, port = argv[0], int(argv[1])
    if mode == "flood":
        result: dict = flood(port, int(argv[2]), float(argv[3]))
    elif mode == "slowloris":
        result = slowloris(port, float(argv[2]), float(argv[3]))
    elif mode == "nonreader":
        result = nonreader(port, float(argv[2]))
    elif mode == "talker":
        result = talker(port, int(argv[2]), float(argv[3]))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

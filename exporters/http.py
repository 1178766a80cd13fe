"""The exporter's HTTP side: /metrics served from a page kept ready by the caller.

A scrape never runs a check: it returns the exposition the caller rendered after its
last run (plus the exporter's own ``process_*`` series), so a wedged daemon can slow a
run down to its budget but never a scrape, and Prometheus' 10 s scrape timeout is never
at risk.

The port is open to every user of the node, so the server holds under abuse
(docs/monitoring.md, "The exporter under abuse"): at most ``max_connections`` are open,
and a new one closes the oldest that has not yet sent a whole request (a held-open or
slowloris connection) rather than being refused, so a scraper, which sends its request
at once, is answered during a flood; a request head must arrive within
``header_timeout_s``, a response must be taken within ``write_timeout_s`` (no more
requests are read from a client meanwhile), an idle keep-alive connection ends after
``idle_timeout_s``; what the attacker causes is logged as one counted line per kind and
``log_interval_s``, never a traceback.
"""

import errno
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict
from typing import Callable, Dict, NamedTuple, Optional, Tuple

from mps_health.exporters.logthrottle import Throttled

LANDING = (b"<html><head><title>mps-health exporter</title></head><body>"
           b"<h1>mps-health exporter</h1><p><a href=\"/metrics\">Metrics</a></p>"
           b"</body></html>\n")


def process_page() -> bytes:
    """The exporter's own process_* series, fresh per scrape (cheap: /proc/self)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    return generate_latest(reg)


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large"}
MAX_HEAD = 16384  # bytes of request line and headers we accept
READ_CHUNK = 65536
ACCEPT_BATCH = 64  # accepted per wake-up; the rest wait in the kernel's queue meanwhile
# The kernel's queue of connections not yet accepted. Kept short: while it is full the
# kernel drops SYNs, which slows a reconnecting flood to TCP's retransmits; at 1024 the
# same flood (bench/exporter_abuse.py) cycled 15x more connections and a scrape's median
# went from 1 ms to 16-57 ms. The cost is a rare scrape whose SYN is dropped (1 s).
LISTEN_BACKLOG = 128
PIPELINE_BATCH = 8  # pipelined requests answered per turn of one connection
TICK_S = 0.1  # deadlines and the stop flag are looked at this often
ACCEPT_PAUSE_S = 0.25  # after accept() fails for want of fds: retrying at once would spin
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, keeps no buffers
SEND_BUFFER = 256 * 1024  # per connection: a whole page at once, yet a client that never
# reads stalls after a few responses instead of the megabytes of autotuned buffers
PROCESS_FRESH_S = 0.5  # the process_* and server series are rebuilt at most this often


# Why the server closed a connection (or could not accept one): the series' label.
REFUSALS = ("over_cap", "header_timeout", "write_timeout", "accept_failed", "internal_error")


class _Fixed:
    """A collector over a fixed list of families."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


class Limits(NamedTuple):
    """What one client may hold (the config's ``exporter`` keys of the same names)."""

    max_connections: int = 64
    header_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0  # Prometheus' own keep-alive idle limit is 90 s
    log_interval_s: float = 60.0


def parse_head(head: bytes) -> Tuple[str, str, str, Dict[str, str]]:
    """Method, target, version and lower-cased headers of one request head (pure)."""
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split()
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (h.partition(":") for h in lines[1:] if h)}
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        return "", "", "", headers
    return words[0], words[1], words[2], headers


def response(code: int, ctype: str, body: bytes, close: bool, head_only: bool) -> bytes:
    return (f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"{'Connection: close' if close else 'Connection: keep-alive'}"
            "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)


class Conn:
    """One client connection: what it sent that is not yet answered, what is left to
    send it, and when it must have made progress by."""

    __slots__ = ("close_after", "closed", "deadline", "events", "inbuf", "out", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.out = memoryview(b"")
        self.deadline = deadline
        self.close_after = False
        self.closed = False
        self.events = selectors.EVENT_READ  # what the selector waits for on it


class MetricsHTTP:
    """A minimal HTTP/1.1 server for /metrics on one thread with a selector.

    One thread serves every connection: with a thread per connection (http.server), 16
    concurrent scrapers fight over the GIL and a cached page took 3x node_exporter's
    time (bench/monitoring_speed.py). Keep-alive as Prometheus uses it; GET and HEAD only.
    A plain selector rather than asyncio: every fd, buffer and deadline is ours to bound
    (asyncio accepts a whole backlog before a handler can refuse one, and logs a
    traceback per failed accept).
    """

    def __init__(self, page: Callable[[], bytes], listener: socket.socket, limits: Limits,
                 log: Throttled, with_process: bool = True) -> None:
        self.page = page
        self.listener = listener
        self.limits = limits
        self.log = log
        self.with_process = with_process
        self.sel = selectors.DefaultSelector()
        # Open connections in eviction order: those without a whole request yet, oldest
        # first; then those that sent one, least recently active first.
        self.fresh: OrderedDict[Conn, None] = OrderedDict()
        self.talking: OrderedDict[Conn, None] = OrderedDict()
        self.accept_paused_until: Optional[float] = None
        self.process: Tuple[float, bytes] = (float("-inf"), b"")
        self.refused: Dict[str, int] = dict.fromkeys(REFUSALS, 0)

    def refuse(self, reason: str, what: str) -> None:
        """Count what a client caused (a series and a rate-limited log line)."""
        self.refused[reason] += 1
        self.log.note(reason, what)

    def process_series(self) -> bytes:
        """process_page() and server_page(), reused for PROCESS_FRESH_S: a client
        pipelining requests costs a copy per response, not a /proc read (no scraper asks
        twice a second)."""
        now = time.monotonic()
        if now - self.process[0] >= PROCESS_FRESH_S:
            self.process = (now, process_page() + self.server_page())
        return self.process[1]

    def server_page(self) -> bytes:
        """The server's own series: connections open, the cap, and those it closed."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        prefix = "mps_health_exporter_"
        closed = CounterMetricFamily(
            prefix + "connections_closed", "Connections the exporter closed or could not "
            "accept because of what the client did, by reason (docs/monitoring.md).",
            labels=["reason"])
        for reason in REFUSALS:
            closed.add_metric([reason], self.refused[reason])
        families = [GaugeMetricFamily(prefix + "connections", "Client connections open now.",
                                      value=self.count()),
                    GaugeMetricFamily(prefix + "max_connections", "The cap on open client "
                                      "connections (exporter.max_connections, or lower to "
                                      "fit the open-file limit).",
                                      value=self.limits.max_connections),
                    closed]
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Fixed(families))
        return generate_latest(reg)

    def route(self, path: str) -> Tuple[int, str, bytes]:
        if path == "/metrics":
            from mps_health.exporters.prometheus import CONTENT_TYPE

            body = self.page()
            if self.with_process:
                body += self.process_series()
            return 200, CONTENT_TYPE, body
        if path == "/":
            return 200, "text/html; charset=utf-8", LANDING
        return 404, "text/plain; charset=utf-8", b"not found: try /metrics\n"

    def answer(self, head: bytes) -> Tuple[bytes, bool]:
        """The response to one request head, and whether to close after it."""
        method, target, version, headers = parse_head(head)
        connection = headers.get("connection", "").lower()
        close = connection == "close"
        if not method:
            return response(400, "text/plain", b"bad request\n", True, False), True
        if method not in ("GET", "HEAD"):
            code, ctype, body = 405, "text/plain", b"GET /metrics\n"
        else:
            code, ctype, body = self.route(target.split("?", 1)[0])
        if version == "HTTP/1.0" and connection != "keep-alive":
            close = True
        if headers.get("content-length", "0") not in ("", "0"):
            close = True  # we read no request bodies: do not misread one as a request
        return response(code, ctype, body, close, method == "HEAD"), close

    # --- connections ------------------------------------------------------------------

    def count(self) -> int:
        return len(self.fresh) + len(self.talking)

    def close(self, conn: Conn, reset: bool = False) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.fresh.pop(conn, None)
        self.talking.pop(conn, None)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        try:
            if reset:  # drop what the kernel still holds for it instead of sending it
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            conn.sock.close()
        except OSError:
            pass

    def evict_one(self) -> None:
        queue = self.fresh if self.fresh else self.talking
        oldest = next(iter(queue))
        self.close(oldest, reset=True)
        self.refuse("over_cap", f"connections over the cap of {self.limits.max_connections} "
                    "closed (the oldest without a whole request first)")

    def accept(self, now: float) -> None:
        # A quarter of the cap per turn: a scraper accepted in one turn has its request
        # read in the next, before a flood can push it to the front of the eviction queue.
        for _ in range(max(1, min(ACCEPT_BATCH, self.limits.max_connections // 4))):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.refuse("accept_failed", f"cannot accept connections: {e.strerror} "
                                "(open files of this process or the node at their limit)")
                    self.sel.unregister(self.listener)
                    self.accept_paused_until = now + ACCEPT_PAUSE_S
                return  # ECONNABORTED and the like: that client is gone already
            if self.count() >= self.limits.max_connections:
                self.evict_one()
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            conn = Conn(sock, now + self.limits.header_timeout_s)
            self.fresh[conn] = None
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self.on_read(conn, now)  # a scraper's request is often here already: answer it

    def active(self, conn: Conn) -> None:
        """``conn`` sent a whole request or took a whole response: last to be evicted."""
        self.fresh.pop(conn, None)
        self.talking.pop(conn, None)
        self.talking[conn] = None

    def on_read(self, conn: Conn, now: float) -> None:
        try:
            data = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close(conn)
            return
        if not conn.inbuf and conn in self.talking:  # a new head starts on a kept-alive one
            conn.deadline = now + self.limits.header_timeout_s
        conn.inbuf += data
        self.pump(conn, now)

    def next_response(self, conn: Conn, now: float) -> bool:
        """Queue the answer to the next whole request in ``conn.inbuf``, if there is one."""
        end = conn.inbuf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if end < 0:
            if len(conn.inbuf) <= MAX_HEAD:
                return False
            out = response(431, "text/plain", b"request head too large\n", True, False)
            conn.out, conn.close_after = memoryview(out), True
        else:
            head = bytes(conn.inbuf[:end])
            del conn.inbuf[:end + 4]
            self.active(conn)
            out, conn.close_after = self.answer(head)
            conn.out = memoryview(out)
        conn.deadline = now + self.limits.write_timeout_s
        return True

    def pump(self, conn: Conn, now: float) -> None:
        """Send what is queued, then answer the next request, until one waits on the
        client. Nothing more is read from a client while its response is unsent, so one
        that sends requests and never reads holds one response, never a growing queue."""
        for _ in range(PIPELINE_BATCH):
            if conn.out:
                try:
                    sent = conn.sock.send(conn.out)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    self.close(conn)
                    return
                conn.out = conn.out[sent:]
                if conn.out:
                    self.want(conn, selectors.EVENT_WRITE)
                    return
                if conn.close_after:
                    self.close(conn)
                    return
                self.active(conn)
                conn.deadline = now + (self.limits.header_timeout_s if conn.inbuf
                                       else self.limits.idle_timeout_s)
            if not self.next_response(conn, now):
                self.want(conn, selectors.EVENT_READ)
                return
        self.want(conn, selectors.EVENT_WRITE)  # more queued: go on when the others had a turn

    def want(self, conn: Conn, events: int) -> None:
        if conn.events != events:
            self.sel.modify(conn.sock, events, conn)
            conn.events = events

    def expire(self, now: float) -> None:
        for conn in [c for queue in (self.fresh, self.talking) for c in queue
                     if c.deadline <= now]:
            if conn.out:
                self.refuse("write_timeout", "connections closed that took no response "
                            f"within write_timeout_s {self.limits.write_timeout_s:g}")
                self.close(conn, reset=True)
            elif conn.inbuf or conn in self.fresh:
                self.refuse("header_timeout", "connections closed that sent no whole request "
                            f"within header_timeout_s {self.limits.header_timeout_s:g}")
                self.close(conn, reset=True)
            else:  # an idle keep-alive connection: normal, not worth a line
                self.close(conn)

    # --- the loop -----------------------------------------------------------------------

    def event(self, conn: Conn, now: float) -> None:
        if conn.closed:  # closed earlier in this round (evicted by an accept)
            return
        try:
            if conn.events == selectors.EVENT_WRITE:
                self.pump(conn, now)
            else:
                self.on_read(conn, now)
        except Exception as e:  # a bug must cost one connection, never the server
            self.close(conn, reset=True)
            self.refuse("internal_error", "internal error on a connection, closed: "
                        f"{type(e).__name__}: {ascii(str(e))[:200]}")

    def serve(self, stop: threading.Event) -> None:
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        next_sweep = 0.0
        try:
            while not stop.is_set():
                for key, _ in self.sel.select(TICK_S):
                    now = time.monotonic()
                    if key.data is None:
                        self.accept(now)
                    else:
                        self.event(key.data, now)
                now = time.monotonic()
                if self.accept_paused_until is not None and now >= self.accept_paused_until:
                    self.accept_paused_until = None
                    self.sel.register(self.listener, selectors.EVENT_READ, None)
                if now >= next_sweep:
                    next_sweep = now + TICK_S
                    self.expire(now)
                    self.log.flush()
        finally:
            for conn in list(self.fresh) + list(self.talking):
                self.close(conn)
            self.sel.close()
            self.log.flush(final=True)


def listen(address: Tuple[str, int]) -> socket.socket:
    """A listening socket on ``address`` (OSError when it cannot be bound)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def serve(page: Callable[[], bytes], address: Tuple[str, int],
          listening: Callable[[str], None], stop: threading.Event,
          limits: Optional[Limits] = None, log: Optional[Throttled] = None) -> None:
    """Serve ``page()`` at /metrics until ``stop`` is set, on this thread.
    ``listening`` is told the URL once the address is bound; OSError when it cannot be."""
    limits = limits or Limits()
    listener = listen(address)
    try:
        host, port = listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        listening(f"http://{shown}:{port}/metrics")
        MetricsHTTP(page, listener, limits, log or Throttled(limits.log_interval_s)
                    ).serve(stop)
    finally:
        listener.close()

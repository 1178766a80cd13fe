"""The exporter's HTTP side: /metrics served from a page kept ready by the caller.

A scrape never runs a check: it returns the exposition the caller rendered after its last
run (plus the exporter's own ``process_*`` series), so a wedged daemon can slow a run but
never a scrape. The server is prometheus_client's ``ThreadingWSGIServer`` (``http.server``
parses, ``wsgiref`` writes); what it lacks is added here, because the port is open to
every user of the node (docs/monitoring.md, "The exporter under abuse"):

* a thread per connection: a held-open, slowloris or never-reading connection holds only
  its own thread, never a scraper's;
* at most ``max_connections``. Over the cap one open connection is shut down rather than
  the newcomer refused (refusing would let whoever reconnects fastest keep every slot),
  chosen in this order (``MetricsServer.victim``):

  1. one that has sent no whole request within ``GRACE_S`` of its accept, oldest first
     (held-open and slowloris connections);
  2. one within its grace that has not sent a byte yet, oldest first (a flood of new
     connections pushes out its own kind); looked at again when chosen, since on a
     loaded machine its thread may not have read what came (a new scraper's request);
  3. the most demanding one, if it asks more than ``DEMANDING_PER_S`` requests a second
     (``Conn.rate``: a client hammering /metrics);
  4. one within its grace that has sent part of a request, oldest first;
  5. the most demanding of the rest.

  A connection cannot tell us whose it is (every local client is 127.0.0.1, and TCP has
  no peer credentials), so the rule is per connection, by what it does: a new scraper's
  connection, which sends its request at once (often already waiting when accepted), is
  read and answered within its grace; a kept-alive
  scraper, which asks once per scrape interval, is the least demanding connection and
  comes last, behind every connection a flood opens. What it cannot tell apart is a
  client whose every connection behaves as a scraper does: the whole cap held by old
  connections each asking as seldom as the scraper (docs/monitoring.md, "The exporter
  under abuse");
* a request head must arrive whole within ``header_timeout_s`` (per connection, not per
  byte: a slowloris is closed at it), a response be taken within ``write_timeout_s``
  (nothing more is read meanwhile), an idle keep-alive connection ends at ``idle_timeout_s``;
* what a client causes is one counted line per kind and ``log_interval_s``, never a line
  per request, never a traceback.
"""

import bisect
import contextlib
import errno
import fcntl
import io
import socket
import struct
import sys
import termios
import threading
import time
from collections import deque
from typing import IO, Any, Callable, Deque, Dict, Iterable, List, Optional, cast
from wsgiref.handlers import SimpleHandler
from wsgiref.simple_server import WSGIRequestHandler

from mps_health.config.exporter import ExporterConfig
from mps_health.exporters.logthrottle import Throttled
from mps_health.exporters.prometheus import CONTENT_TYPE, latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer

LANDING = (b"<html><head><title>mps-health exporter</title></head><body>"
           b"<h1>mps-health exporter</h1><p><a href=\"/metrics\">Metrics</a></p>"
           b"</body></html>\n")


MAX_HEAD = 16384  # bytes of request line and headers we accept
READ_CHUNK = 16384  # a client's pipelined requests are read this much at a time
# The kernel's queue of connections not yet accepted. Kept short: while it is full the kernel
# drops SYNs, which slows a reconnecting flood to TCP's retransmits (bench/exporter_abuse.py).
# The cost is a rare scrape whose SYN is dropped (1 s).
LISTEN_BACKLOG = 128
TICK_S = 0.1  # the stop flag and the log's counts are looked at this often
ACCEPT_PAUSE_S = 0.25  # after accept() fails for want of fds: retrying at once would spin
EVICT_WAIT_S = 0.5  # for a shut-down connection's thread to close it before an accept
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, keeps no buffers
SEND_BUFFER = 256 * 1024  # per connection: a whole page at once, yet a client that never
# reads stalls after a few responses instead of the megabytes of autotuned buffers
PROCESS_FRESH_S = 0.5  # the process_* and server series are rebuilt at most this often
# Over the cap (see the module's docstring): a new connection's time to send its request
# before it may be shut down ahead of others; a scraper's is already on its way.
GRACE_S = 1.0
# Demanding: more requests a second than this (Conn.rate). Prometheus scrapes once every
# 15 to 60 s, 1 s at the fastest; a client asking again at once, hundreds of times.
DEMANDING_PER_S = 2.0
RECENT = 32  # a connection's requests remembered: enough to tell 2 a second over RECENT_S
RECENT_S = 10.0

# Why the server closed a connection (or could not accept one): the series' label.
REFUSALS = ("over_cap", "header_timeout", "write_timeout", "accept_failed", "internal_error")


class Conn:
    """One open connection, as the server's accept loop and its own thread share it
    (its times are changed under the server's lock)."""

    __slots__ = ("asked", "closing", "opened", "reset", "sock", "spoke")

    def __init__(self, sock: socket.socket, now: float, spoke: bool = False) -> None:
        self.sock = sock
        self.opened = now
        self.spoke = spoke  # a byte came: it is sending a request, not only holding a slot
        self.asked: Deque[float] = deque(maxlen=RECENT)  # when its last requests came
        self.closing = False  # shut down by the server (evicted, or the server stops)
        self.reset = False  # closed for what the client did: RST, no buffers kept

    def rate(self, now: float) -> float:
        """Requests a second over the last RECENT_S (or its life, if shorter; or since
        its RECENT-th last request, if that came later), taken over a second at least:
        a new connection's one request is 1 a second, a kept-alive scraper's 1 per scrape
        interval, a connection asking without pause all it can."""
        first = bisect.bisect_right(self.asked, now - RECENT_S)  # oldest within RECENT_S
        count = len(self.asked) - first
        if not count:
            return 0.0
        since = self.asked[first] if count == RECENT else max(self.opened, now - RECENT_S)
        return count / max(now - since, 1.0)


class Responder(SimpleHandler):
    """wsgiref's response writer, speaking HTTP/1.1 with keep-alive, silent."""

    http_version = "1.1"
    # Read only: each request's environ starts from it, not from the process's environment.
    os_environ: dict[str, str] = {}  # noqa: RUF012
    server_software = ""  # no Server header: nothing to tell a client about versions
    headers: Any  # wsgiref's, set per response
    request_handler: "Handler"

    def cleanup_headers(self) -> None:
        super().cleanup_headers()
        # Hop-by-hop: the server's to set, not the application's.
        self.headers["Connection"] = ("close" if self.request_handler.close_connection
                                      else "keep-alive")

    def handle_error(self) -> None:
        raise  # to the connection's handler, which counts it; never a traceback


class Handler(WSGIRequestHandler):
    """One connection: request heads read within their deadlines, answered in turn."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    default_request_version = "HTTP/1.0"  # so an error reply has a status line
    disable_nagle_algorithm = True  # a response goes out at once
    server: "MetricsServer"

    def setup(self) -> None:
        # socketserver's setup: with its default wbufsize 0, wfile writes each piece whole
        # (sendall, under the connection's timeout).
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO()  # one request head at a time, read by read_head
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self.requestline = ""

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request: what a client causes is counted by the server."""

    def send_error(self, code: int, message: Optional[str] = None,
                   explain: Optional[str] = None) -> None:
        # The standard reason phrase: never a client's own request line in the status line.
        super().send_error(code, None, explain)

    def read_head(self, conn: Conn, buf: bytearray, kept_alive: bool) -> Optional[bytes]:
        """The next whole request head, None when the connection is to end. The head
        deadline runs from the connection's start, or on a kept-alive connection from
        the first byte of the request; every recv waits only for what is left of it."""
        limits = self.server.limits
        deadline = None if kept_alive and not buf else time.monotonic() + limits.header_timeout_s
        while True:
            end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if end >= 0:
                head = bytes(buf[:end + 4])
                del buf[:end + 4]
                return head
            if len(buf) > MAX_HEAD:
                self.command, self.request_version, self.close_connection = "", "HTTP/1.0", True
                self.request.settimeout(limits.write_timeout_s)
                self.send_error(431, explain=f"a request head is {MAX_HEAD} bytes at most")
                return None
            wait = limits.idle_timeout_s if deadline is None else deadline - time.monotonic()
            try:
                if wait <= 0:
                    raise socket.timeout
                self.request.settimeout(wait)
                data = self.request.recv(READ_CHUNK)
            except socket.timeout:  # TimeoutError from 3.10, its own OSError on 3.9
                if deadline is not None:  # an idle kept-alive one: normal, not worth a line
                    conn.reset = True
                    self.server.refuse("header_timeout", "connections closed that sent no "
                                       "whole request within header_timeout_s "
                                       f"{limits.header_timeout_s:g}")
                return None
            except OSError:
                return None
            if not data:
                return None
            if deadline is None:
                deadline = time.monotonic() + limits.header_timeout_s
            conn.spoke = True
            buf += data

    def handle(self) -> None:
        conn = self.server.conn_of(self.request)
        buf = bytearray()
        kept_alive = False
        while conn is not None and not conn.closing:
            try:
                head = self.read_head(conn, buf, kept_alive)
                if head is None or not self.answer(conn, head):
                    return
            except socket.timeout:  # sendall's deadline: the client does not take its reply
                conn.reset = True
                self.server.refuse("write_timeout", "connections closed that took no response "
                                   f"within write_timeout_s {self.server.limits.write_timeout_s:g}")
                return
            except OSError:  # the client went away, or the server shut the connection
                return
            kept_alive = True

    def answer(self, conn: Conn, head: bytes) -> bool:
        """Reply to one request head; whether to read the next one."""
        self.server.asked(conn)
        self.request.settimeout(self.server.limits.write_timeout_s)  # sendall's total
        self.rfile = io.BytesIO(head)
        self.raw_requestline = self.rfile.readline(MAX_HEAD + 1)
        if not self.parse_request():  # http.server has sent the error, if any
            return False
        if self.headers.get("Content-Length", "0").strip() not in ("", "0") or \
                "Transfer-Encoding" in self.headers:
            self.close_connection = True  # bodies are not read: never misread as requests
        responder = Responder(self.rfile, cast(IO[bytes], self.wfile), sys.stderr,
                              self.get_environ(), multithread=True)
        responder.request_handler = self
        responder.run(self.server.app)
        return not self.close_connection


class MetricsServer(ThreadingWSGIServer):
    """prometheus_client's server with a connection cap, deadlines and counted refusals."""

    daemon_threads = True
    block_on_close = False  # stopping never waits for a client's thread
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], page: Callable[[], bytes],
                 limits: ExporterConfig, log: Throttled, with_process: bool = True) -> None:
        host, port = address
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.page, self.limits, self.log, self.with_process = page, limits, log, with_process
        # Open connections, oldest first; those shut down but not yet closed by their
        # thread, which still hold an fd each, are counted too.
        self.lock = threading.Condition()
        self.conns: Dict[socket.socket, Conn] = {}
        self.closing: Dict[socket.socket, Conn] = {}
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self.process: tuple[float, bytes] = (float("-inf"), b"")
        super().__init__((host, port), Handler)

    def server_bind(self) -> None:
        # http.server's server_bind asks DNS for the host's full name (getfqdn), with no
        # timeout on a node whose resolver hangs; the name is used for nothing here.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), \
            int(self.server_address[1])
        self.setup_environ()

    def server_activate(self) -> None:
        super().server_activate()
        # A client gone between the wake-up and the accept must not block the loop (and
        # its stop flag) until the next client comes.
        self.socket.setblocking(False)

    # --- the page -----------------------------------------------------------------------

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]
            ) -> Iterable[bytes]:
        """The WSGI application: /metrics, a landing page, 404 and 405; HEAD as GET."""
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        extra: list[tuple[str, str]] = []
        if method not in ("GET", "HEAD"):
            status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET /metrics\n"
            extra = [("Allow", "GET, HEAD")]
        elif path == "/metrics":
            status, ctype, body = "200 OK", CONTENT_TYPE, self.page()
            if self.with_process:
                body += self.process_series()
        elif path == "/":
            status, ctype, body = "200 OK", "text/html; charset=utf-8", LANDING
        else:
            status, ctype, body = ("404 Not Found", "text/plain; charset=utf-8",
                                   b"not found: try /metrics\n")
        start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                                *extra])
        return [b"" if method == "HEAD" else body]

    def process_series(self) -> bytes:
        """The process_* series (cheap: /proc/self) and the server's own (connections open,
        the cap, those it closed), reused for PROCESS_FRESH_S: a client pipelining requests
        costs a copy per response, not a /proc read (no scraper asks twice a second)."""
        now = time.monotonic()
        if now - self.process[0] < PROCESS_FRESH_S:
            return self.process[1]
        prefix = "mps_health_exporter_"
        closed = CounterMetricFamily(
            prefix + "connections_closed", "Connections the exporter closed or could not "
            "accept because of what the client did, by reason (docs/monitoring.md).",
            labels=["reason"])
        with self.lock:
            refused = dict(self.refused)
            count = self.count()
        for reason in REFUSALS:
            closed.add_metric([reason], refused[reason])
        families = [GaugeMetricFamily(prefix + "connections", "Client connections open now.",
                                      value=count),
                    GaugeMetricFamily(prefix + "max_connections", "The cap on open client "
                                      "connections (exporter.max_connections, or lower to "
                                      "fit the open-file limit).",
                                      value=self.limits.max_connections),
                    closed]
        self.process = (now, latest(families, process=True))
        return self.process[1]

    # --- connections ------------------------------------------------------------------

    def refuse(self, reason: str, what: str) -> None:
        """Count what a client caused: a series, a rate-limited line (lock reentrant)."""
        with self.lock:
            self.refused[reason] += 1
            self.log.note(reason, what)

    def count(self) -> int:
        return len(self.conns) + len(self.closing)

    def conn_of(self, sock: socket.socket) -> Optional[Conn]:
        with self.lock:
            return self.conns.get(sock) or self.closing.get(sock)

    def asked(self, conn: Conn) -> None:
        """``conn`` sent a whole request."""
        with self.lock:
            conn.asked.append(time.monotonic())

    def victim(self, now: float) -> Optional[Conn]:
        """The connection to shut down for a newcomer (the lock held), in the order of the
        module's docstring; None when every one is closing already."""
        silent: Optional[Conn] = None  # the oldest without a whole request
        mutes: List[Conn] = []  # those without a byte read, oldest first
        busiest: Optional[Conn] = None  # the oldest of those asking the most
        most = -1.0
        for conn in self.conns.values():  # oldest first
            if not conn.asked:
                silent = silent or conn
                if not conn.spoke:
                    mutes.append(conn)
                continue
            rate = conn.rate(now)
            if rate > most:
                busiest, most = conn, rate
        if silent is not None and now - silent.opened >= GRACE_S:
            return silent
        mute = next((conn for conn in mutes if not spoke_since(conn)), None)
        if mute is not None:
            return mute
        if busiest is not None and most > DEMANDING_PER_S:
            return busiest
        return silent or busiest

    def shut(self, conn: Conn) -> None:
        """End ``conn`` from another thread (the lock held): shutdown wakes its thread,
        blocked in recv or send, which then closes the socket. Only the owner closes it,
        so no thread ever reads or writes an fd number reused by a newer connection."""
        self.conns.pop(conn.sock, None)
        self.closing[conn.sock] = conn
        conn.closing = True
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept one connection, at the cap shutting one down first (``victim``) and
        waiting for its thread to close it, so the fds in use never pass the cap."""
        cap = self.limits.max_connections
        with self.lock:
            if self.count() >= cap:
                victim = self.victim(time.monotonic())
                if victim is not None:
                    self.shut(victim)
                    self.refuse("over_cap", f"connections over the cap of {cap} closed (those "
                                "without a request, then the most demanding, first)")
                if not self.lock.wait_for(lambda: self.count() < cap, EVICT_WAIT_S):
                    raise OSError("no room yet")  # the loop comes back while one waits
            try:
                sock, address = self.socket.accept()
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise  # ECONNABORTED and the like: that client is gone already
                self.refuse("accept_failed", f"cannot accept connections: {e.strerror} (open "
                            "files of this process or the node at their limit)")
                self.lock.wait(ACCEPT_PAUSE_S)  # retrying at once would spin
                raise
            self.conns[sock] = Conn(sock, time.monotonic(), spoke=waiting(sock))
        return sock, address

    def shutdown_request(self, request: Any) -> None:
        """The connection's thread (or a failed start of one) closes it."""
        with self.lock:
            conn = self.conns.pop(request, None) or self.closing.pop(request, None)
            self.lock.notify_all()
        with contextlib.suppress(OSError):
            if conn is not None and conn.reset:  # drop what the kernel still holds for it
                request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A bug, or no thread for a connection, costs that connection, never the server,
        and is one counted line, never a traceback."""
        e = sys.exc_info()[1]
        if isinstance(e, OSError) and not isinstance(e, socket.timeout):
            return  # the client went away mid-request
        self.refuse("internal_error", "internal error on a connection, closed: "
                    f"{type(e).__name__}: {ascii(str(e))[:200]}")

    def service_actions(self) -> None:
        with self.lock:
            self.log.flush()

    def stop(self) -> None:
        """After serve_forever: every connection shut down (its thread ends), the
        listener closed, the last counts written."""
        with self.lock:
            for conn in list(self.conns.values()):
                self.shut(conn)
        self.server_close()
        with self.lock:
            self.log.flush(final=True)


def spoke_since(conn: Conn) -> bool:
    """Whether bytes came on ``conn`` that its thread has not read yet (the server's lock
    held: an open connection's socket is closed only after it leaves the table). Once
    seen, the byte marks it: a connection is not looked at again after it spoke."""
    conn.spoke = conn.spoke or waiting(conn.sock)
    return conn.spoke


def waiting(sock: socket.socket) -> bool:
    """Whether bytes wait on a connection that its thread has not read. Asked of the
    kernel (FIONREAD), never through the socket object: on a socket its thread gave a
    timeout, Python's recv first waits that long for data, whatever the flags."""
    try:
        count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):  # gone already
        return False
    return struct.unpack("i", count)[0] > 0


def serve(page: Callable[[], bytes], address: tuple[str, int],
          listening: Callable[[str], None], stop: threading.Event,
          limits: ExporterConfig) -> None:
    """Serve ``page()`` at /metrics until ``stop`` is set, on this thread, each client held
    to ``limits`` (the ``exporter`` section). ``listening`` is told the URL once the
    address is bound; OSError when it cannot be."""
    server = MetricsServer(address, page, limits, Throttled(limits.log_interval_s))
    try:
        host, port = (str(part) for part in server.server_address[:2])
        shown = f"[{host}]" if ":" in host else host
        listening(f"http://{shown}:{port}/metrics")

        def stopper() -> None:
            stop.wait()
            server.shutdown()  # returns once serve_forever below has

        threading.Thread(target=stopper, name="http-stop", daemon=True).start()
        server.serve_forever(poll_interval=TICK_S)
    finally:
        stop.set()
        server.stop()

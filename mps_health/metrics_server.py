"""The exporter's runtime: checks in a background thread, scrapes served from the cache.

A scrape never runs a check: it returns the exposition rendered after the last run (plus
the exporter's own ``process_*`` series), so a wedged daemon can slow a run down to its
budget but never a scrape, and Prometheus' 10 s scrape timeout is never at risk. When
runs stop finishing, ``mps_health_last_run_timestamp_seconds`` stops moving: that is
what the alert watches.
"""

import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Sequence, Tuple

from . import engine
from .config import Config

LANDING = (b"<html><head><title>mps-health exporter</title></head><body>"
           b"<h1>mps-health exporter</h1><p><a href=\"/metrics\">Metrics</a></p>"
           b"</body></html>\n")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Refresher:
    """Runs the checks every ``interval_s`` and keeps the rendered exposition."""

    def __init__(self, config: Config, root: str, only: Sequence[str], skip: Sequence[str],
                 interval_s: float, budget_s: float) -> None:
        from .exporters import prometheus
        from .exporters.budget import within_budget

        self.config = within_budget(config, budget_s)  # a wedged daemon judged, not lost
        self.root, self.only, self.skip = root, list(only), list(skip)
        self.interval_s, self.budget_s = interval_s, budget_s
        self.record: Optional[prometheus.RunRecord] = None
        self.page: bytes = prometheus.exposition(None)  # build info until the first run
        self.runs = 0

    def run_once(self):  # -> prometheus.RunRecord
        from .exporters import prometheus

        previous = self.record.last_success_at if self.record is not None else None
        try:
            facts, report = engine.run(self.config, self.root, self.only, self.skip,
                                       self.budget_s)
        except Exception as e:  # the engine never raises for a bad node; say so and go on
            print(f"mps-health exporter: run failed: {_one_line(e)}", file=sys.stderr)
            record = prometheus.RunRecord(None, time.time(), False, previous,
                                          error=_one_line(e))
        else:
            now = time.time()
            ok = prometheus.run_success(report)
            record = prometheus.RunRecord(
                report, now, ok, now if ok else previous,
                {i.name: i.gpu for i in facts.instances if i.gpu})
        page = prometheus.exposition(record)
        self.record, self.page = record, page  # one reference each: a scrape sees either
        self.runs += 1
        return record

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            self.run_once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


def process_page() -> bytes:
    """The exporter's own process_* series, fresh per scrape (cheap: /proc/self)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    return generate_latest(reg)


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"
    protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus scrapes
    server_version = "mps-health-exporter"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from .exporters.prometheus import CONTENT_TYPE

            body = self.server.refresher.page
            if self.server.with_process:
                body += process_page()
            self._send(200, CONTENT_TYPE, body)
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", LANDING)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a line per scrape would flood the journal


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], refresher: Refresher,
                 with_process: bool = True) -> None:
        self.refresher = refresher
        self.with_process = with_process
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


def parse_listen(text: str) -> Tuple[str, int]:
    """'HOST:PORT', ':PORT' (every IPv4 address) or '[V6]:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {text!r} is not HOST:PORT (e.g. :10102, "
                         "127.0.0.1:10102, [::]:10102)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen address {text!r}: put an IPv6 address in brackets")
    return host or "0.0.0.0", int(port)


def serve(refresher: Refresher, address: Tuple[str, int],
          announce: Callable[[str], None], stop: threading.Event) -> None:
    """Serve until ``stop`` is set (SIGTERM/SIGINT): HTTP and refresher in threads."""
    server = MetricsServer(address, refresher)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    announce(f"serving http://{shown}:{port}/metrics, checks every "
             f"{refresher.interval_s:g}s (budget {refresher.budget_s:g}s)")
    http = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    checks = threading.Thread(target=refresher.loop, args=(stop,), name="checks", daemon=True)
    http.start()
    checks.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        # Let a run in flight end, so its bounded commands are killed by their deadline.
        checks.join(refresher.budget_s + 2.0)

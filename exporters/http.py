"""The exporter's HTTP side: /metrics served from a page kept ready by the caller.

A scrape never runs a check: it returns the exposition the caller rendered after its
last run (plus the exporter's own ``process_*`` series), so a wedged daemon can slow a
run down to its budget but never a scrape, and Prometheus' 10 s scrape timeout is never
at risk.
"""

import threading
from typing import Callable, Tuple

LANDING = (b"<html><head><title>mps-health exporter</title></head><body>"
           b"<h1>mps-health exporter</h1><p><a href=\"/metrics\">Metrics</a></p>"
           b"</body></html>\n")


def process_page() -> bytes:
    """The exporter's own process_* series, fresh per scrape (cheap: /proc/self)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    return generate_latest(reg)


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
MAX_HEAD = 16384  # bytes of request line and headers we accept
IDLE_S = 120.0  # a keep-alive connection idle this long is closed (Prometheus' is 90 s)


class MetricsHTTP:
    """A minimal HTTP/1.1 server for /metrics on one asyncio loop.

    One thread serves every connection: with a thread per connection (http.server), 16
    concurrent scrapers fight over the GIL and a cached page took 3x node_exporter's
    time (bench/monitoring_speed.py). Keep-alive as Prometheus uses it; GET and HEAD only.
    """

    def __init__(self, page: Callable[[], bytes], with_process: bool = True) -> None:
        self.page = page
        self.with_process = with_process
        self.open: set = set()  # writers of open connections, closed at shutdown

    def route(self, path: str) -> Tuple[int, str, bytes]:
        if path == "/metrics":
            from .prometheus import CONTENT_TYPE

            body = self.page()
            if self.with_process:
                body += process_page()
            return 200, CONTENT_TYPE, body
        if path == "/":
            return 200, "text/html; charset=utf-8", LANDING
        return 404, "text/plain; charset=utf-8", b"not found: try /metrics\n"

    async def handle(self, reader, writer) -> None:  # asyncio.StreamReader/StreamWriter
        import asyncio

        self.open.add(writer)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                        asyncio.TimeoutError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                words = lines[0].split()
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (h.partition(":") for h in lines[1:] if h)}
                close = headers.get("connection", "").lower() == "close"
                if len(words) != 3 or not words[2].startswith("HTTP/1."):
                    code, ctype, body, close = 400, "text/plain", b"bad request\n", True
                elif words[0] not in ("GET", "HEAD"):
                    code, ctype, body = 405, "text/plain", b"GET /metrics\n"
                else:
                    code, ctype, body = self.route(words[1].split("?", 1)[0])
                if words[2:3] == ["HTTP/1.0"] and headers.get("connection", "").lower() \
                        != "keep-alive":
                    close = True
                if headers.get("content-length", "0") not in ("", "0"):
                    close = True  # we read no request bodies: do not misread one as a request
                writer.write((f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: {ctype}\r\n"
                              f"Content-Length: {len(body)}\r\n"
                              f"{'Connection: close' if close else 'Connection: keep-alive'}"
                              "\r\n\r\n").encode("latin-1")
                             + (body if words[:1] != ["HEAD"] else b""))
                await writer.drain()
                if close:
                    return
        except ConnectionError:
            return
        finally:
            self.open.discard(writer)
            writer.close()


def serve(page: Callable[[], bytes], address: Tuple[str, int],
          listening: Callable[[str], None], stop: threading.Event) -> None:
    """Serve ``page()`` at /metrics until ``stop`` is set, on this thread's asyncio loop.
    ``listening`` is told the URL once the address is bound; OSError when it cannot be."""
    import asyncio

    async def main() -> None:
        http = MetricsHTTP(page)
        server = await asyncio.start_server(http.handle, address[0], address[1],
                                            reuse_address=True, backlog=128,
                                            limit=MAX_HEAD)
        host, port = server.sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else host
        listening(f"http://{shown}:{port}/metrics")
        try:
            while not stop.is_set():
                await asyncio.sleep(0.25)
        finally:
            server.close()
            for writer in list(http.open):  # idle keep-alive connections end now
                writer.close()
            await asyncio.wait_for(server.wait_closed(), 5.0)

    asyncio.run(main())

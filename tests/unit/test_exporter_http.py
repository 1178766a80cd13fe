"""The exporter's HTTP server as a library: how it binds and what its WSGI app answers
(the server under real clients and abuse: tests/e2e/test_exporter_abuse.py)."""

import socket
from typing import Any, Dict, List, Tuple

import pytest
from mps_health.exporters.http import Limits, MetricsServer
from mps_health.exporters.logthrottle import Throttled


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    def no_dns(*_args: Any) -> str:
        raise AssertionError("getfqdn: a DNS lookup with no timeout")

    # http.server's own bind asks DNS for the host's name; a hung resolver would hang it.
    monkeypatch.setattr(socket, "getfqdn", no_dns)
    srv = MetricsServer(("127.0.0.1", 0), lambda: b"page\n", Limits(), Throttled(60.0),
                        with_process=False)
    yield srv
    srv.server_close()


def call(srv: MetricsServer, method: str, path: str) -> Tuple[str, Dict[str, str], bytes]:
    seen: List[Any] = []
    body = b"".join(srv.app({"REQUEST_METHOD": method, "PATH_INFO": path},
                            lambda status, headers: seen.append((status, dict(headers)))))
    return seen[0][0], seen[0][1], body


def test_binds_without_dns_and_reports_its_address(server: MetricsServer) -> None:
    host, port = server.server_address[:2]
    assert host == "127.0.0.1" and port > 0


def test_app_pages(server: MetricsServer) -> None:
    status, headers, body = call(server, "GET", "/metrics")
    assert status == "200 OK" and body == b"page\n"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert headers["Content-Length"] == "5"
    status, headers, body = call(server, "HEAD", "/metrics")
    assert (status, headers["Content-Length"], body) == ("200 OK", "5", b"")
    assert call(server, "GET", "/")[2].startswith(b"<html>")
    assert call(server, "GET", "/nope")[0] == "404 Not Found"
    status, headers, _ = call(server, "POST", "/metrics")
    assert status == "405 Method Not Allowed" and headers["Allow"] == "GET, HEAD"

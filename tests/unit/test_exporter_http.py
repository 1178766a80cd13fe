"""The exporter's HTTP server as a library: how it binds and what its WSGI app answers
(the server under real clients and abuse: tests/e2e/test_exporter_abuse.py)."""

import socket
from typing import Any, Dict, List, Tuple

import pytest
from mps_health.config.exporter import ExporterConfig
from mps_health.exporters.http import DEMANDING_PER_S, GRACE_S, Conn, MetricsServer
from mps_health.exporters.logthrottle import Throttled


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    def no_dns(*_args: Any) -> str:
        raise AssertionError("getfqdn: a DNS lookup with no timeout")

    # http.server's own bind asks DNS for the host's name; a hung resolver would hang it.
    monkeypatch.setattr(socket, "getfqdn", no_dns)
    srv = MetricsServer(("127.0.0.1", 0), lambda: b"page\n", ExporterConfig(), Throttled(60.0),
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


def conn_at(srv: MetricsServer, opened: float, asked: List[float]) -> Conn:
    """A connection in the server's table (kept in the order accepted), opened and asking
    at these (monotonic) times."""
    sock = socket.socket()
    conn = Conn(sock, opened)
    conn.asked.extend(asked)
    srv.conns[sock] = conn
    return conn


@pytest.fixture
def table(server: MetricsServer):
    yield server
    for sock in server.conns:
        sock.close()


def test_rate_tells_a_scraper_from_a_client_asking_without_pause() -> None:
    now = 1000.0
    with socket.socket() as sock:
        assert Conn(sock, now).rate(now) == 0.0
        new = Conn(sock, now - 0.01)
        new.asked.append(now - 0.005)
        assert new.rate(now) == 1.0  # one request is never a high rate
        prometheus = Conn(sock, now - 3600)
        prometheus.asked.extend(now - 15 * k for k in range(100, 0, -1))
        assert prometheus.rate(now) <= 0.1
        every_second = Conn(sock, now - 3600)
        every_second.asked.extend(now - k for k in range(40, 0, -1))
        assert every_second.rate(now) <= DEMANDING_PER_S
        hammering = Conn(sock, now - 5)
        hammering.asked.extend(now - 0.01 * k for k in range(200, 0, -1))
        assert hammering.rate(now) > 10 * DEMANDING_PER_S


def test_over_the_cap_held_open_then_new_then_demanding_then_the_rest(table) -> None:
    """The order of the module's docstring: a kept-alive scraper comes last, a new
    connection sending its request after every demanding one."""
    now = 1000.0
    scraper = conn_at(table, now - 3600, [now - 30, now - 15])  # in the order accepted
    demanding = conn_at(table, now - 60, [now - 0.1 * k for k in range(40, 0, -1)])
    held_open = conn_at(table, now - GRACE_S * 2, [])
    speaking = conn_at(table, now - GRACE_S / 2, [])
    speaking.spoke = True
    mute = conn_at(table, now - GRACE_S / 3, [])
    order = []
    for _ in range(4):
        order.append(table.victim(now))
        del table.conns[order[-1].sock]
        order[-1].sock.close()
    assert order == [held_open, mute, demanding, speaking]
    one_request = conn_at(table, now - 0.2, [now - 0.1])
    assert table.victim(now) is one_request  # asks more often than the scraper
    del table.conns[one_request.sock]
    one_request.sock.close()
    assert table.victim(now) is scraper


def test_a_slow_flood_of_new_connections_pushes_out_its_own_kind(table) -> None:
    now = 1000.0
    scraper = conn_at(table, now - 3600, [now - 10])
    flood = [conn_at(table, now - GRACE_S + k * 0.01, []) for k in range(10)]
    assert table.victim(now) is flood[0] and table.victim(now) is not scraper


def test_a_new_connection_whose_request_came_is_not_taken_for_a_mute_one(table) -> None:
    """Its thread has not read it yet (a loaded machine): the request waiting on the
    socket is looked at when it is chosen, and a truly mute connection goes instead."""
    now = 1000.0
    ours, client = socket.socketpair()
    try:
        scraper = Conn(ours, now - GRACE_S / 2)  # accepted before its request came
        table.conns[ours] = scraper
        client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        mute = conn_at(table, now - GRACE_S / 3, [])
        assert table.victim(now) is mute and scraper.spoke
    finally:
        client.close()

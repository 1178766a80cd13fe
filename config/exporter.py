"""The exporter's config section (``exporter:``): where it listens, how often it runs,
what one client may hold (exporters/http.py; docs/monitoring.md). Apart from the command,
so that loading a config imports no HTTP server. Port 10102: the Prometheus wiki's
default-port list has no room left in 9100-9999; new exporters register above 10000.
"""

from __future__ import annotations

from typing import Any, Tuple

from mps_health.config.schema import Invalid, Record, Section, custom, number, shown, text, whole

DEFAULT_LISTEN = ":10102"
DEFAULT_INTERVAL_S = 30.0


def parse_listen(text: str) -> Tuple[str, int]:
    """'HOST:PORT', ':PORT' (every IPv4 address) or '[V6]:PORT' -> (host, port), or Invalid."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise Invalid(f"listen address {shown(text)} is not HOST:PORT (e.g. :10102, "
                         "127.0.0.1:10102, [::]:10102)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise Invalid(f"listen address {shown(text)}: put an IPv6 address in brackets")
    return host or "0.0.0.0", int(port)


def _listen(value: Any) -> str:
    listen = str(text(DEFAULT_LISTEN).parse(value))
    parse_listen(listen)
    return listen


class ExporterConfig(Record):
    listen: str = custom(DEFAULT_LISTEN, _listen)
    interval_s: float = number(DEFAULT_INTERVAL_S, low=1.0, high=3600.0)
    # What one client may hold (exporters/http.py; docs/monitoring.md).
    max_connections: int = whole(64, low=1, high=100000)
    header_timeout_s: float = number(10.0, low=0.1, high=300.0)
    write_timeout_s: float = number(10.0, low=0.1, high=300.0)
    idle_timeout_s: float = number(120.0, low=1.0, high=3600.0)  # Prometheus': 90 s
    log_interval_s: float = number(60.0, low=1.0, high=3600.0)


SECTION = Section("exporter", ExporterConfig)
SECTIONS = (SECTION,)
exporter_config = SECTION.of

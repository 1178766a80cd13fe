"""In every Python program a test starts: report touches of the host's mps-health state."""

import os

_log = os.environ.get("MPS_HEALTH_TEST_TRIPWIRE")
if _log:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hostpaths

    sys.path.pop(0)

    def _record(event: str, path: str) -> None:
        with open(_log, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {' '.join(sys.argv)[:200]}: {event} {path}\n")

    hostpaths.install(_record)

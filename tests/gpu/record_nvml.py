#!/usr/bin/env python3
"""Print this node's NVML answers as a recording (the fixture format of tests/fixtures/nvml__*).

    python3 tests/gpu/record_nvml.py > tests/fixtures/nvml__h200_default.json

Read-only: it only asks NVML questions (nothing is changed on the GPU). Every answer,
and every NVML error by name, is kept, so the recording replays through the same code
(mps_health.probes.nvml.RecordedApi) that reads the live GPU.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from mps_health.probes.nvml import PynvmlApi, record


def main() -> int:
    data = record(PynvmlApi())
    data["note"] = (f"recorded for real by tests/gpu/record_nvml.py on {os.uname().nodename} "
                    f"at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    print(json.dumps(data, indent=1))
    return 0 if not data.get("init_error") else 1


if __name__ == "__main__":
    sys.exit(main())

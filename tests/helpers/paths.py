"""Where things are, for every test and helper: the checkout, the fakes, the fixtures."""

import subprocess
from pathlib import Path

from fakebin import FakeBinError, fake_bin

HELPERS = Path(__file__).resolve().parent  # these shared modules
TESTS = HELPERS.parent
REPO = TESTS.parent
FAKES = TESTS / "fakes"  # the fakes' sources (scripts), and mps-canary
FIXTURES = TESTS / "fixtures"
# The fake MPS binaries as executables (built from FAKES, see fakebin): what tests run
# and configure, as a node has the real binaries.
# Where they cannot be built (no compiler or python3-dev: a GPU node running only the
# real-binary tests), FAKE_BIN does not exist and FAKE_BIN_ERROR says why.
FAKE_BIN_ERROR = ""
try:
    FAKE_BIN = fake_bin()
except (FakeBinError, OSError, subprocess.SubprocessError) as e:
    FAKE_BIN, FAKE_BIN_ERROR = Path("/nonexistent/mps-health-fake-binaries"), str(e)
FAKE_CONTROL = str(FAKE_BIN / "nvidia-cuda-mps-control")
FAKE_SERVER = str(FAKE_BIN / "nvidia-cuda-mps-server")


def fake_binaries():  # -> mps_health.probes.process_identity.Binaries
    """The fakes as the binaries mps-health judges processes by (as a config naming them
    would give)."""
    from mps_health.probes.process_identity import binaries_of

    return binaries_of(FAKE_CONTROL)

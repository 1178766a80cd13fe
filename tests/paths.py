"""Where things are, for every test and helper: the checkout, the fakes, the fixtures."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAKES = TESTS / "fakes"
FIXTURES = TESTS / "fixtures"
FAKE_CONTROL = str(FAKES / "nvidia-cuda-mps-control")
FAKE_SERVER = str(FAKES / "nvidia-cuda-mps-server")

"""The default config file, /etc/mps-health/config.yaml, with its parsed form kept in
/run/mps-health/config.json by root's first run: the next check reads no YAML (PyYAML
cannot even be imported there) and says the same. Run in a mount namespace of its own,
with /etc an overlay and /run a tmpfs, so the host's files are never touched."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
set -e
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$UPPER,workdir=$WORK" /etc
mount -t tmpfs tmpfs /run
mkdir -p /etc/mps-health
cp "$CFG" /etc/mps-health/config.yaml
set +e
"$PY" -m mps_health.cli.main check; echo "rc=$?"
ls -l /run/mps-health/config.json | cut -d' ' -f1,3
"$PY" -c "import sys; sys.modules['yaml'] = None
from mps_health.cli.main import main; sys.exit(main(['check']))"; echo "rc=$?"
echo 'budget_s: 0' >> /etc/mps-health/config.yaml
"$PY" -c "import sys; sys.modules['yaml'] = None
from mps_health.cli.main import main; sys.exit(main(['check']))" >/dev/null 2>&1; echo "rc=$?"
"$PY" -m mps_health.cli.main check; echo "rc=$?"
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a private mount namespace)")
def test_the_default_config_is_parsed_once_and_kept(site, tmp_path: Path) -> None:
    site.start_daemon()
    for d in ("upper", "work"):
        (tmp_path / d).mkdir()
    env = dict(os.environ, UPPER=str(tmp_path / "upper"), WORK=str(tmp_path / "work"),
               CFG=site.config(), PY=sys.executable)
    # /etc and /run are the namespace's own (the script stops before any run if a mount
    # fails): the tripwire, which cannot see namespaces, is not told about these runs.
    env.pop("MPS_HEALTH_TEST_TRIPWIRE", None)
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", SCRIPT],
                       capture_output=True, text=True, timeout=180, env=env)
    if "overlay" in r.stderr and "rc=" not in r.stdout:
        pytest.skip("no overlay file system here: " + r.stderr.strip()[:200])
    lines = r.stdout.splitlines()
    verdicts = [line for line in lines if line.startswith("MPS ")]
    codes = [line for line in lines if line.startswith("rc=")]
    same = [v.split(" in ")[0] for v in verdicts[:2]]  # the run's duration differs
    assert codes[:2] == ["rc=0", "rc=0"] and same[0] == same[1], r.stdout + r.stderr
    assert "-rw-r--r-- root" in lines, r.stdout  # root's, writable by root only
    # The file changed: the kept form is stale, so a run without PyYAML cannot read it
    # (exit 3, not the old file's OK), and a normal run reads the new value (budget_s: 0
    # is refused, exit 3, in one line).
    assert codes[2:] == ["rc=3", "rc=3"], r.stdout + r.stderr
    assert "budget_s" in r.stdout + r.stderr

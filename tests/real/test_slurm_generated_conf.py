"""The gres.conf and slurm.conf lines mps-health renders are accepted by real slurmctld and slurmd.

A test cluster whose gres.conf is `mps-health slurm gres-conf` output (from the 2-GPU
NVML recording, device files in the cluster's dir) and whose slurm.conf carries the
`mps-health slurm conf` lines in place of its own (GresTypes, SelectType, the hooks,
the health check, the node's Gres=). The node must come up IDLE with that Gres, an
mps job must get its per-job daemon, and --diff must find nothing to change. On this
machine's Slurm and on Slurm 24.11 in the Debian 13 root (there the hooks are the
root's install; the lines are rendered by this checkout, which renders the same).
"""

import shutil
from typing import Iterator, List, Optional

import pytest
from clirun import mps_health
from conftest import FIXTURES
from jobhooks import JobHooks, hooks_for_slurm
from slurmcluster import SlurmCluster, SlurmClusterError

pytestmark = pytest.mark.slurm
RECORD = str(FIXTURES / "nvml__HANDWRITTEN_2gpu-test-node.json")
RENDERED_KEYS = ("gresTypes", "selecttype", "prolog", "taskprolog", "epilog",
                 "healthcheckprogram", "healthcheckinterval", "healthchecknodestate")


class GeneratedConfCluster(SlurmCluster):
    """The fixture's cluster with our rendered gres.conf and slurm.conf lines."""

    def __init__(self, hooks: JobHooks, mps_gpus: str, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.hooks = hooks
        self.mps_gpus = mps_gpus
        self.rendered_conf = ""

    def render(self, what: str, *extra: str) -> str:
        r = mps_health("slurm", what, "--nvml-record", RECORD, "--mps-gpus", self.mps_gpus,
                       "--node-name", self.node_name, "--config", str(self.hooks.config), *extra)
        if r.returncode != 0:
            raise SlurmClusterError(f"mps-health slurm {what}: {r.stderr}")
        return r.stdout

    def write_conf(self) -> None:
        super().write_conf()
        shutil.copy(self.gres_conf, self.dir / "gres.conf.fixture")
        self.gres_conf.write_text(self.render("gres-conf", "--dev-dir", str(self.dir / "dev")))
        self.rendered_conf = self.render("conf", "--prefix", str(self.hooks.hooks),
                                         "--health-check-program", "/bin/true",
                                         "--health-check-interval", "600")
        gres = next(x.split("Gres=", 1)[1] for x in self.rendered_conf.splitlines()
                    if x.lstrip("# ").startswith("Gres="))
        lines: List[str] = []
        for line in self.conf.read_text().splitlines():
            key = line.split("=", 1)[0].lower()
            if key in {k.lower() for k in RENDERED_KEYS}:
                continue  # ours replaces it
            if key == "nodename":
                line = " ".join(w for w in line.split() if not w.startswith("Gres="))
                line += f" Gres={gres}"
            lines.append(line)
        rendered = [x for x in self.rendered_conf.splitlines() if x and not x.startswith("#")]
        self.conf.write_text("\n".join(rendered + lines) + "\n")


@pytest.fixture(scope="module")
def hooks(slurm_user: str, slurm_where) -> Iterator[JobHooks]:
    yield from hooks_for_slurm(slurm_user, slurm_where)


def start(hooks: JobHooks, mps_gpus: str, node: str, where) -> GeneratedConfCluster:
    c = GeneratedConfCluster(hooks, mps_gpus, node_name=node, root=where)
    try:
        return c.start()  # type: ignore[return-value]
    except SlurmClusterError as e:
        pytest.fail(f"Slurm refused the generated configuration: {e}", pytrace=False)


def node_field(cluster: SlurmCluster, name: str) -> Optional[str]:
    for field in cluster.node_line().split():
        if field.startswith(name + "="):
            return field[len(name) + 1:]
    return None


def test_all_gpus_with_mps(hooks: JobHooks, slurm_where) -> None:
    cluster = start(hooks, "all", "gennode", slurm_where)
    try:
        print(cluster.gres_conf.read_text(), cluster.rendered_conf, sep="\n")
        assert node_field(cluster, "Gres") == "gpu:2,mps:200"
        assert cluster.node_state() == "IDLE"
        r = cluster.run(["srun", "--gres=mps:50", "env"], user=hooks.user, timeout=90)
        assert r.returncode == 0, r.stderr + cluster.logs()
        env = dict(x.split("=", 1) for x in r.stdout.splitlines() if "=" in x)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(hooks.pipe_dir(env["SLURM_JOB_ID"]))
        cluster.wait_state(lambda s: s == "IDLE", 60)
        assert hooks.entries() == [] and hooks.processes() == []

        same = mps_health("slurm", "gres-conf", "--nvml-record", RECORD, "--dev-dir",
                          str(cluster.dir / "dev"), "--diff", "--gres-conf",
                          str(cluster.gres_conf), "--node-name", "gennode")
        assert same.returncode == 0, same.stdout + same.stderr
        # The fixture's own hand-written gres.conf (gpu lines, then mps lines) says the same.
        fixture = mps_health("slurm", "gres-conf", "--nvml-record", RECORD, "--dev-dir",
                             str(cluster.dir / "dev"), "--diff", "--gres-conf",
                             str(cluster.dir / "gres.conf.fixture"), "--node-name", "gennode")
        assert fixture.returncode == 0, fixture.stdout + fixture.stderr
        conf = mps_health("slurm", "conf", "--nvml-record", RECORD, "--config",
                          str(hooks.config), "--prefix", str(hooks.hooks),
                          "--health-check-program", "/bin/true", "--health-check-interval",
                          "600", "--node-name", "gennode", "--diff", "--slurm-conf",
                          str(cluster.conf))
        assert conf.returncode == 0, conf.stdout + conf.stderr
    finally:
        cluster.stop()


def test_mixed_node_mps_on_gpu0_only(hooks: JobHooks, slurm_where) -> None:
    cluster = start(hooks, "0", "mixnode", slurm_where)
    try:
        assert node_field(cluster, "Gres") == "gpu:2,mps:100"
        assert cluster.gres_conf.read_text().count("Name=mps") == 1
        r = cluster.run(["srun", "--gres=mps:50", "env"], user=hooks.user, timeout=90)
        assert r.returncode == 0, r.stderr + cluster.logs()
        assert "CUDA_VISIBLE_DEVICES=0\n" in r.stdout and "CUDA_MPS_PIPE_DIRECTORY=" in r.stdout
        cluster.wait_state(lambda s: s == "IDLE", 60)
        # Against the fixture's own file (mps on both GPUs), --diff shows the difference.
        diff = mps_health("slurm", "gres-conf", "--nvml-record", RECORD, "--mps-gpus", "0",
                          "--dev-dir", str(cluster.dir / "dev"), "--diff", "--gres-conf",
                          str(cluster.dir / "gres.conf.fixture"), "--node-name", "mixnode")
        assert diff.returncode == 1
        assert f"-Name=mps Count=100 File={cluster.dir}/dev/nvidia1" in diff.stdout.splitlines()
    finally:
        cluster.stop()
    assert hooks.entries() == [] and hooks.processes() == []

"""The gres-drift check on made facts: Slurm's GPUs and mps against NVML, gres.conf and
the node's daemons, for resident (node, per-gpu) and per-job MPS; Slurm or NVML that
cannot be asked."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from mps_health.checks import gres_drift
from mps_health.model.facts import Instance, ProcessFact
from mps_health.model.results import CRITICAL, UNKNOWN, WARNING, Result
from mps_health.probes.gres_conf import DeviceFile, GresConf, GresLine
from mps_health.probes.nvml import GpuFact, NvmlFacts
from mps_health.probes.slurm import GresItem, SlurmFacts, SlurmJob, SlurmNode

from .made import GPU0, JOB, NODE, dirs_of, problems, proc, run

RECONFIGURE = "'scontrol reconfigure'"
DEVS = ("/dev/nvidia0", "/dev/nvidia1")
PER_JOB = {"mps": {"layout": "per-job", "pipe_dir": "/tmp/nvidia-mps_job{job}",
                   "log_dir": "/tmp/nvidia-log_job{job}"}}
GPU1 = Instance("gpu1", "per-gpu", "/tmp/nvidia-mps-gpu1", "/var/log/nvidia-mps-gpu1", gpu="1")


def node(gpus: int = 2, mps: int = 200, state: str = "MIXED", reason: str = "",
         used: Optional[Tuple[GresItem, ...]] = None) -> SlurmNode:
    gres = (GresItem("gpu", None, gpus),) + ((GresItem("mps", None, mps),) if mps else ())
    return SlurmNode("n1", state, tuple(state.split("+")), reason, gres, used)


def nvml(gpus: int = 2) -> NvmlFacts:
    return NvmlFacts(True, gpus=tuple(GpuFact(i, f"GPU-{i}", i) for i in range(gpus)))


def conf(gpu_files: Sequence[str] = DEVS, mps_files: Sequence[str] = DEVS,
         devices: Optional[Sequence[DeviceFile]] = None, errors: Tuple[str, ...] = ()
         ) -> GresConf:
    lines = (GresLine("gres.conf:1", "gpu", None, tuple(gpu_files), len(gpu_files)),
             GresLine("gres.conf:2", "mps", None, tuple(mps_files), 200))
    made = tuple(DeviceFile(p, "char", int(p[-1])) for p in dict.fromkeys(
        (*gpu_files, *mps_files))) if devices is None else tuple(devices)
    return GresConf("/etc/slurm/gres.conf", True, "n1", lines, None, made, errors)


def judge(slurm: Optional[SlurmFacts] = None, gpus: Optional[NvmlFacts] = None,
          gres: Optional[GresConf] = None, procs: Sequence[ProcessFact] = (),
          instances: Sequence[Instance] = (NODE,), cfg: Optional[Dict[str, Any]] = None,
          **extra: Any) -> List[Result]:
    sources = {"slurm": slurm or SlurmFacts("n1", node()), "nvml": gpus or nvml(),
               "gres_conf": gres or conf(), "processes": tuple(procs),
               "dirs": dirs_of(*instances)}
    return run(gres_drift, sources, instances, cfg, **extra)


def only(results: List[Result]) -> Result:
    (r,) = problems(results)
    return r


def test_a_node_that_agrees_is_ok() -> None:
    found = judge(procs=[proc(100)])
    assert problems(found) == []
    assert [r.message for r in found] == [
        "Slurm: node n1 is MIXED", "GPU count agrees: Slurm gpu:2, NVML 2, gres.conf 2",
        "mps count agrees: mps:200 = 2 gres.conf mps devices x 100",
        "Slurm offers mps on GPU 0, served by node", "Slurm offers mps on GPU 1, served by node"]


def test_the_nodes_state_is_context_never_a_failure() -> None:
    slurm = SlurmFacts("n1", node(state="MIXED+DRAIN", reason="MPS-HC: daemon-absent"))
    found = judge(slurm, procs=[proc(100)])
    assert problems(found) == []
    assert found[0].message == "Slurm: node n1 is MIXED+DRAIN, reason 'MPS-HC: daemon-absent' " \
        "(drained by mps-health)"
    assert dict(found[0].values) == {"node_drained": 1.0, "node_drained_by_us": 1.0}


def test_a_humans_reason_that_only_begins_with_the_tag_is_not_ours() -> None:
    # The health check resumes only a reason whose first word is its tag; the metric
    # and the text say "by mps-health" by the same rule, never for a human's drain.
    slurm = SlurmFacts("n1", node(state="IDLE+DRAIN", reason="MPS-HC:maintenance by bob"))
    found = judge(slurm, procs=[proc(100)])
    assert "(drained by mps-health)" not in found[0].message
    assert dict(found[0].values) == {"node_drained": 1.0, "node_drained_by_us": 0.0}


def test_slurm_that_cannot_be_asked_is_unknown_and_the_rest_still_judged() -> None:
    slurm = SlurmFacts("n1", None, "timeout", "scontrol timed out after 5s")
    found = judge(slurm, gres=conf(devices=[DeviceFile("/dev/nvidia0", "missing")]))
    assert [(r.state, r.code) for r in found] == [(CRITICAL, "gres-file-missing"),
                                                  (UNKNOWN, "slurm-unavailable")]
    assert found[1].message == "scontrol timed out after 5s"
    assert "scontrol ping" in found[1].action


def test_nvml_that_cannot_be_used_is_unknown() -> None:
    found = judge(gpus=NvmlFacts(False, "DRIVER_NOT_LOADED", "Driver Not Loaded"),
                  procs=[proc(100)])
    r = only(found)
    assert (r.state, r.code) == (UNKNOWN, "nvml-unavailable")
    assert r.message == "NVML: Driver Not Loaded" and "modprobe nvidia" in r.action
    assert "GPU count agrees: Slurm gpu:2, gres.conf 2" in [x.message for x in found]


def test_slurm_offering_other_than_nvml_sees() -> None:
    r = only(judge(gpus=nvml(1), gres=conf(DEVS[:1], DEVS[:1]), procs=[proc(100)],
                   slurm=SlurmFacts("n1", node(mps=100))))
    assert (r.state, r.code) == (CRITICAL, "gres-gpu-count")
    assert r.message == "Slurm offers gpu:2 on n1 but NVML sees 1 GPUs"
    assert RECONFIGURE in r.action and dict(r.values) == {"slurm_gpus": 2.0, "nvml_gpus": 1.0}


def test_gres_conf_listing_other_than_nvml_sees() -> None:
    r = only(judge(gres=conf((*DEVS, "/dev/nvidia2"), DEVS, devices=[]), procs=[proc(100)]))
    assert (r.state, r.code) == (CRITICAL, "gres-conf-gpu-count")
    assert r.message == "gres.conf lists 3 gpu devices for n1 but NVML sees 2 GPUs"


def test_fewer_gpus_than_the_node_must_have() -> None:
    r = only(judge(procs=[proc(100)], cfg={"gpu": {"count": 4}}))
    assert (r.state, r.code) == (CRITICAL, "gpu-count")
    assert r.message == "this node should have 4 GPUs (gpu.count) but NVML sees 2"


def test_mps_count_other_than_mps_per_gpu_times_the_gpus() -> None:
    r = only(judge(SlurmFacts("n1", node(mps=100)), procs=[proc(100)]))
    assert (r.state, r.code) == (WARNING, "gres-mps-count")
    assert r.message == "Slurm offers mps:100 but 2 gres.conf mps devices x 100 " \
        "(slurm.mps_per_gpu) = 200"
    assert judge(SlurmFacts("n1", node(mps=100)), procs=[proc(100)],
                 cfg={"slurm": {"mps_per_gpu": 50}})[2].code == "ok"


@pytest.mark.parametrize("device, code, wording", [
    (DeviceFile("/dev/nvidia1", "missing"), "gres-file-missing",
     "gres.conf names /dev/nvidia1, which does not exist"),
    (DeviceFile("/dev/nvidia1", "file"), "gres-file-not-device",
     "gres.conf names /dev/nvidia1, which is a file, not a character device"),
    (DeviceFile("/dev/nvidia1", "char", 7), "gres-file-minor",
     "gres.conf names /dev/nvidia1 (minor 7), but NVML's GPUs have minors 0, 1"),
])
def test_gres_conf_files(device: DeviceFile, code: str, wording: str) -> None:
    found = judge(gres=conf(devices=[DeviceFile("/dev/nvidia0", "char", 0), device]),
                  procs=[proc(100)])
    r = one_of(found, code)
    assert (r.instance, r.state) == ("", CRITICAL)
    assert r.message.startswith(wording) and RECONFIGURE in r.action


def one_of(found: List[Result], code: str) -> Result:
    (r,) = [r for r in found if r.code == code]
    return r


def test_a_bad_gres_conf_line_is_a_warning() -> None:
    r = only(judge(gres=conf(errors=("gres.conf:3: unknown key Flies=",)), procs=[proc(100)]))
    assert (r.state, r.code) == (WARNING, "gres-conf-invalid")
    assert r.message == "gres.conf: gres.conf:3: unknown key Flies="


def test_mps_offered_on_a_gpu_without_a_daemon() -> None:
    found = problems(judge())
    assert [(x.instance, x.state, x.code) for x in found] == [
        ("gpu0", CRITICAL, "mps-gpu-no-daemon"), ("gpu1", CRITICAL, "mps-gpu-no-daemon")]
    r = found[0]
    assert "Slurm offers mps on GPU 0 but the control daemon of node (/tmp/nvidia-mps) is " \
        "not running" in r.message
    assert "'mps-health remediate reset node'" in r.action


def test_mps_offered_on_a_gpu_no_instance_serves() -> None:
    found = judge(instances=(GPU0,), procs=[proc(100, pipe_dir=GPU0.pipe_dir)],
                  cfg={"mps": {"layout": "per-gpu", "gpus": [0]}})
    r = only(found)
    assert (r.instance, r.state, r.code) == ("gpu1", CRITICAL, "mps-gpu-unserved")
    assert r.message.startswith("Slurm offers mps on GPU 1 but no MPS instance serves it")


def test_mps_served_on_a_gpu_gres_conf_offers_none() -> None:
    found = judge(SlurmFacts("n1", node(mps=100)), gres=conf(mps_files=DEVS[:1]),
                  instances=(GPU0, GPU1),
                  procs=[proc(100, pipe_dir=GPU0.pipe_dir), proc(101, pipe_dir=GPU1.pipe_dir)],
                  cfg={"mps": {"layout": "per-gpu", "gpus": [0, 1]}})
    r = only(found)
    assert (r.instance, r.state, r.code) == ("gpu1", WARNING, "mps-gpu-not-offered")
    assert r.message.startswith("MPS serves GPU 1 but gres.conf offers no mps on it")


def job(job_id: str, gres: str = "gres:mps:50", state: str = "RUNNING",
        elapsed: float = 600.0) -> SlurmJob:
    return SlurmJob(job_id, "alice", 1002, state, elapsed, gres)


def per_job(jobs: Optional[Tuple[SlurmJob, ...]], procs: Sequence[ProcessFact] = (),
            used: Optional[Tuple[GresItem, ...]] = None, **extra: Any) -> List[Result]:
    slurm = SlurmFacts("n1", node(used=used), jobs=jobs,
                       jobs_error=None if jobs is not None else "squeue timed out")
    return judge(slurm, procs=procs, instances=(JOB,), cfg=PER_JOB, **extra)


def test_a_running_mps_job_without_its_daemon() -> None:
    r = only(per_job((job("77"),)))
    assert (r.instance, r.state, r.code) == ("job77", CRITICAL, "mps-job-no-daemon")
    assert r.message == "job 77 (alice) holds gres:mps:50 but no MPS daemon runs for it: its " \
        "CUDA clients run without MPS"
    # Its daemon runs; a young job; a job our hooks are setting up: no finding.
    assert problems(per_job((job("77"),), [proc(100, uid=1002, pipe_dir=JOB.pipe_dir)])) == []
    assert problems(per_job((job("77", elapsed=5),))) == []
    assert problems(per_job((job("77"),), unjudged=(("77", "prolog running"),))) == []


def test_a_per_job_daemon_without_its_mps_job() -> None:
    daemon = proc(100, uid=1002, pipe_dir=JOB.pipe_dir)
    r = only(per_job((job("77", gres="gres:gpu:1"),), [daemon]))
    assert (r.instance, r.state, r.code) == ("job77", WARNING, "mps-daemon-no-job")
    assert r.message == "MPS daemon 100 serves job 77, but job 77 is RUNNING without mps"
    assert "remediate reset job77" in r.action
    assert only(per_job((), [daemon])).message.endswith("job 77 does not run on n1")


def test_jobs_that_cannot_be_listed_are_unknown() -> None:
    r = only(per_job(None))
    assert (r.state, r.code) == (UNKNOWN, "slurm-jobs-unavailable")
    assert r.message == "cannot list this node's jobs: squeue timed out"
    # Slurm's node still shows mps in use and no per-job daemon runs: that is said too.
    found = problems(per_job(None, used=(GresItem("mps", None, 50, (0,)),)))
    assert [(x.state, x.code) for x in found] == [(CRITICAL, "mps-job-no-daemon"),
                                                  (UNKNOWN, "slurm-jobs-unavailable")]
    assert found[0].message == "Slurm shows mps in use on GPU 0 but no per-job MPS daemon runs"

"""The job as the hooks see it, from the environments real slurmd 22.05 gave them."""

import pytest
from jobhooks import fixture_env
from mps_health.config.load import from_mapping
from mps_health.slurm.hooks import _holds_gpus, main
from mps_health.slurm.jobenv import JobEnvError, parse_gpus, parse_job_env, wants_daemon
from mps_health.slurm.lifecycle import job_dirs, task_exports, task_gpu

PER_JOB = {"mps": {"layout": "per-job"}}


def test_prolog_of_an_mps_job() -> None:
    job = parse_job_env(fixture_env("slurm-22.05_prolog_mps-50"))
    assert job == ("1", 1001, 1001, "mpshtest", ("0",), "50")
    assert wants_daemon(job, "mps") and wants_daemon(job, "gpu")


def test_prolog_of_a_whole_gpu_job() -> None:
    job = parse_job_env(fixture_env("slurm-22.05_prolog_gpu-1"))
    assert job.gpus == ("0",) and job.mps_percentage is None
    assert not wants_daemon(job, "mps") and wants_daemon(job, "gpu")


def test_epilog_sees_the_same_job() -> None:
    for label in ("mps-50", "gpu-1", "no-gres"):
        prolog = parse_job_env(fixture_env(f"slurm-22.05_prolog_{label}"))
        epilog = parse_job_env(fixture_env(f"slurm-22.05_epilog_{label}"))
        assert prolog == epilog


def test_which_hooks_take_the_fast_path() -> None:
    for hook in ("prolog", "task_prolog", "epilog"):
        assert not _holds_gpus(fixture_env(f"slurm-22.05_{hook}_no-gres"))
        assert _holds_gpus(fixture_env(f"slurm-22.05_{hook}_mps-50"))
        assert _holds_gpus(fixture_env(f"slurm-22.05_{hook}_gpu-1"))


def test_fast_path_reads_no_config() -> None:
    env = fixture_env("slurm-22.05_prolog_no-gres")
    assert main("prolog", "/nonexistent/config.yaml", env) == 0
    assert main("epilog", "/nonexistent/config.yaml", env) == 0


def test_a_job_without_gpus_wants_no_daemon() -> None:
    job = parse_job_env(fixture_env("slurm-22.05_prolog_no-gres"))
    assert job.gpus == () and not wants_daemon(job, "gpu")


def test_task_prolog_env_names_the_step_gpu() -> None:
    env = fixture_env("slurm-22.05_task_prolog_mps-50")
    assert "SLURM_JOB_GPUS" not in env  # only the step's GPUs reach a task
    assert task_gpu(env) == "0"
    assert task_gpu({"CUDA_VISIBLE_DEVICES": "0,1"}) is None


@pytest.mark.parametrize("bad, message", [
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is missing"),
    ({"SLURM_JOB_UID": "root"}, "SLURM_JOB_UID is 'root'"),
    ({"SLURM_JOB_USER": "a b"}, "SLURM_JOB_USER is 'a b'"),
    ({"CUDA_VISIBLE_DEVICES": "0;rm -rf /"}, "not a list of GPU indices"),
    ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "150"}, "is not a percentage"),
])
def test_bad_environments_are_one_line(bad: dict, message: str) -> None:
    env = {**fixture_env("slurm-22.05_prolog_mps-50"), **bad}
    with pytest.raises(JobEnvError, match=message):
        parse_job_env(env)


def test_gpu_lists() -> None:
    assert parse_gpus("0,1") == ("0", "1")
    assert parse_gpus("GPU-15679ef6-f0ce-236f-4585-607064cf111a") == (
        "GPU-15679ef6-f0ce-236f-4585-607064cf111a",)
    assert parse_gpus("NoDevFiles") == ()


def test_dirs_follow_the_checks_template() -> None:
    config = from_mapping(PER_JOB, None)
    assert job_dirs(config, "12", ("0", "1")) == (
        ("/tmp/nvidia-mps_job12", "/tmp/nvidia-log_job12", ("0", "1")),)
    per_gpu = from_mapping({"mps": {"layout": "per-job",
                                    "pipe_dir": "/tmp/mps_job{job}_gpu{gpu}",
                                    "log_dir": "/tmp/mpslog_job{job}_gpu{gpu}"}}, None)
    assert job_dirs(per_gpu, "12", ("0", "1")) == (
        ("/tmp/mps_job12_gpu0", "/tmp/mpslog_job12_gpu0", ("0",)),
        ("/tmp/mps_job12_gpu1", "/tmp/mpslog_job12_gpu1", ("1",)))


def test_task_exports_nothing_for_another_users_job_or_layout() -> None:
    config = from_mapping(PER_JOB, None)
    env = fixture_env("slurm-22.05_task_prolog_mps-50")
    assert task_exports(env, config, uid=4242) == []  # SLURM_JOB_UID is 1001
    node = from_mapping({}, None)
    assert task_exports(env, node, uid=1001) == []

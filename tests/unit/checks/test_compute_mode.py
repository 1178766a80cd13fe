"""compute-mode on recorded NVML facts: expectations by layout, overrides, MIG, lost GPUs."""

from typing import Any, Dict, List, Tuple

import pytest
from conftest import fixture_text
from mps_health.checks import compute_mode
from mps_health.config.load import ConfigError, from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.model.facts import Facts
from mps_health.model.results import CRITICAL, OK, UNKNOWN, WARNING
from mps_health.probes.nvml import GpuFact, NvmlFacts, load_record, read_nvml

from . import made

MIXED = "nvml__HANDWRITTEN_8gpu-h200-mixed.json"
TWO = "nvml__HANDWRITTEN_2gpu-test-node.json"


def judge(fixture: str, config: Dict[str, Any]) -> List[Tuple[str, int, str]]:
    nvml = read_nvml(load_record(fixture_text(fixture), fixture))
    facts = Facts("n1", 0.0, "/", (), {"nvml": nvml}, {}, {})
    cfg = from_mapping(config, "site.yaml")
    (run,) = engine.judge(facts, cfg, [registry.checks()["compute-mode"]])
    return [(r.instance, r.state, r.code) for r in run.results]


def problems(results: List[Tuple[str, int, str]]) -> List[Tuple[str, int, str]]:
    return [r for r in results if r[1] != OK]


def test_mixed_node_as_configured_only_reports_the_pending_mig() -> None:
    cfg = {"mps": {"layout": "per-gpu", "gpus": [0, 1, 2, 3]}, "gpu": {}}
    results = judge(MIXED, cfg)
    assert problems(results) == [("gpu6", WARNING, "mig-change-pending")]
    assert ("gpu0", OK, "ok") in results and ("gpu7", OK, "ok") in results


def test_mixed_two_gpu_node() -> None:
    # MPS on GPU 0 only (EXCLUSIVE_PROCESS), GPU 1 for exclusive jobs (DEFAULT).
    cfg = {"mps": {"layout": "per-gpu", "gpus": [0]}, "gpu": {}}
    assert problems(judge(TWO, cfg)) == []


def test_node_wide_daemon_expects_exclusive_process_everywhere() -> None:
    results = judge(TWO, {"gpu": {}})
    assert problems(results) == [("gpu1", WARNING, "compute-mode-mismatch")]


def test_per_gpu_override_by_index_and_uuid() -> None:
    assert problems(judge(TWO, {"gpu": {"compute_mode": {"1": "default"}}})) == []
    uuid = read_nvml(load_record(fixture_text(TWO), TWO)).gpus[1].uuid
    assert problems(judge(TWO, {"gpu": {"compute_mode": {uuid: "any"}}})) == []


def test_prohibited_is_critical() -> None:
    assert problems(judge(TWO, {"gpu": {"mps_gpus": [], "compute_mode": {
        "other": "PROHIBITED"}}})) == [("gpu0", WARNING, "compute-mode-mismatch"),
                                       ("gpu1", WARNING, "compute-mode-mismatch")]
    rec = fixture_text(TWO).replace('"compute_mode": 0', '"compute_mode": 2')
    nvml = read_nvml(load_record(rec, TWO))
    assert nvml.gpus[1].compute_mode == "PROHIBITED"
    facts = Facts("n1", 0.0, "/", (), {"nvml": nvml}, {}, {})
    (run,) = engine.judge(facts, from_mapping({"gpu": {"mps_gpus": [0]}}, None),
                          [registry.checks()["compute-mode"]])
    assert [(r.instance, r.state) for r in run.results if r.state] == [("gpu1", CRITICAL)]


def test_mig_on_an_mps_gpu() -> None:
    results = judge(MIXED, {"gpu": {"mps_gpus": [5], "compute_mode": {"mps": "any"}}})
    assert ("gpu5", WARNING, "mig-on-mps-gpu") in problems(results)
    # MPS on MIG is supported: a site that means it says so, and is not warned
    allowed = judge(MIXED, {"gpu": {"mps_gpus": [5], "compute_mode": {"mps": "any"},
                                    "mig": "allow"}})
    assert "mig-on-mps-gpu" not in [code for _, _, code in problems(allowed)]


def test_configured_mps_gpu_that_does_not_exist() -> None:
    results = judge(TWO, {"mps": {"layout": "per-gpu", "gpus": [0, 9]}, "gpu": {}})
    assert problems(results) == [("gpu9", CRITICAL, "mps-gpu-missing")]


def test_lost_gpu_is_critical_and_unreadable_mode_unknown() -> None:
    cfg = {"mps": {"layout": "per-gpu", "gpus": [0, 1, 2, 3]}, "gpu": {}}
    found = problems(judge("nvml__HANDWRITTEN_8gpu-h200-gpu-lost.json", cfg))
    assert ("gpu3", CRITICAL, "gpu-lost") in found
    assert ("gpu7", UNKNOWN, "compute-mode-unreadable") in found


def test_no_driver_is_unknown_never_critical() -> None:
    assert judge("nvml__cpu-vm_no-driver.json", {"gpu": {}}) == [
        ("", UNKNOWN, "nvml-unavailable")]


def test_bad_gpu_config_is_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        from_mapping({"gpu": {"compute_mode": {"mps": "SHARED"}}}, "site.yaml")
    assert str(e.value) == ("site.yaml: key 'gpu.compute_mode.mps': must be one of DEFAULT, "
                            "EXCLUSIVE_PROCESS, PROHIBITED, any (got 'SHARED')")


def test_gpu_checks_run_only_when_configured() -> None:
    plain = [c.name for c in engine.select_checks(from_mapping({}, None))]
    assert "compute-mode" not in plain and "gres-drift" not in plain
    gpu = [c.name for c in engine.select_checks(from_mapping({"gpu": {}}, None))]
    assert "compute-mode" in gpu and "gres-drift" not in gpu
    slurm = [c.name for c in engine.select_checks(from_mapping({"slurm": {}}, None))]
    assert {"gres-drift", "orphans"} <= set(slurm)


def test_real_h200_default_mode_judged_both_ways() -> None:
    from test_nvml import h200_recording

    nvml = read_nvml(h200_recording())
    facts = Facts("h200", 0.0, "/", (), {"nvml": nvml}, {}, {})
    for raw, want in (({"gpu": {}}, (WARNING, "compute-mode-mismatch")),
                      ({"gpu": {"compute_mode": {"mps": "DEFAULT"}}}, (OK, "ok"))):
        (run,) = engine.judge(facts, from_mapping(raw, None), [registry.checks()["compute-mode"]])
        assert [(r.state, r.code) for r in run.results] == [want]


def test_no_gpu_seen_is_critical_where_mps_must_serve_some() -> None:
    none = {"nvml": NvmlFacts(True, driver_version="580.65")}
    found = made.run(compute_mode, none, (), {"gpu": {}})
    assert made.codes(found) == [("", WARNING, "no-gpus")]
    assert found[0].message == "NVML sees no GPU on this node"
    assert "nvidia-smi" in found[0].action
    assert made.codes(made.run(compute_mode, none, (), {"gpu": {"mps_gpus": [0]}})) == \
        [("", CRITICAL, "no-gpus")]


@pytest.mark.parametrize("gpu, cfg, state, code, wording, action", [
    (GpuFact(0, "GPU-a", compute_mode="DEFAULT"), {}, WARNING, "compute-mode-mismatch",
     "GPU 0 (GPU-a) is in compute mode DEFAULT, expected EXCLUSIVE_PROCESS (served by MPS)",
     "nvidia-smi -i 0 -c EXCLUSIVE_PROCESS"),
    (GpuFact(0, "GPU-a", compute_mode="PROHIBITED"), {}, CRITICAL, "compute-mode-mismatch",
     "GPU 0 (GPU-a) is in compute mode PROHIBITED, expected EXCLUSIVE_PROCESS",
     "gpu.compute_mode"),
    (GpuFact(0, "GPU-a", errors=("compute_mode: NVML_ERROR_NO_PERMISSION",)), {}, UNKNOWN,
     "compute-mode-unreadable",
     "cannot read the compute mode of GPU 0 (GPU-a): compute_mode: NVML_ERROR_NO_PERMISSION",
     "run mps-health as root"),
    (GpuFact(0, "GPU-a", lost=True), {}, CRITICAL, "gpu-lost",
     "GPU 0 (GPU-a) has fallen off the bus (NVML: GPU_IS_LOST)", "Xid 79"),
    (GpuFact(0, "GPU-a", compute_mode="EXCLUSIVE_PROCESS", mig_current=True, mig_pending=True),
     {}, WARNING, "mig-on-mps-gpu", "GPU 0 (GPU-a) has MIG enabled but MPS is configured to "
     "serve it", "gpu.mig: allow"),
    (GpuFact(0, "GPU-a", compute_mode="EXCLUSIVE_PROCESS", mig_current=False, mig_pending=True),
     {}, WARNING, "mig-change-pending", "GPU 0 (GPU-a) has a MIG mode change pending (off -> "
     "on) until it is reset", "nvidia-smi -i 0 -r"),
    (GpuFact(0, "GPU-a", compute_mode="EXCLUSIVE_PROCESS"), {"mps_gpus": [0, 3]}, CRITICAL,
     "mps-gpu-missing", "MPS is configured to serve GPU 3, but NVML sees no such GPU (1 GPUs: "
     "0)", "fix mps.gpus / gpu.mps_gpus"),
])
def test_each_code_on_a_made_gpu(gpu: GpuFact, cfg: Dict[str, Any], state: int, code: str,
                                 wording: str, action: str) -> None:
    found = made.run(compute_mode, {"nvml": NvmlFacts(True, gpus=(gpu,))}, (), {"gpu": cfg})
    (r,) = [r for r in found if r.code == code]
    assert r.state == state and r.message.startswith(wording) and action in r.action


def test_nvml_unavailable_says_what_to_do() -> None:
    found = made.run(compute_mode, {"nvml": NvmlFacts(False, "PYNVML_MISSING", "no pynvml")},
                     (), {"gpu": {}})
    assert made.codes(found) == [("", UNKNOWN, "nvml-unavailable")]
    assert found[0].message == "NVML: no pynvml" and found[0].action == "pip install nvidia-ml-py"


def test_a_gpu_as_expected_is_ok() -> None:
    gpu = GpuFact(0, "GPU-a", compute_mode="EXCLUSIVE_PROCESS")
    (r,) = made.run(compute_mode, {"nvml": NvmlFacts(True, gpus=(gpu,))}, (), {"gpu": {}})
    assert (r.instance, r.state, r.code) == ("gpu0", OK, "ok")
    assert r.message == "GPU 0 (GPU-a) is in compute mode EXCLUSIVE_PROCESS (served by MPS)"

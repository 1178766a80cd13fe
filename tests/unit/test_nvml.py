"""NVML facts from recorded device answers, and from the real library where there is none."""

import json
import shutil

import pytest
from conftest import fixture_text
from mps_health.probes.nvml import (
    NvmlError,
    ProcessUse,
    PynvmlApi,
    RecordedApi,
    load_record,
    read_nvml,
    record,
)

MIXED = "nvml__HANDWRITTEN_8gpu-h200-mixed.json"


def facts(name: str):
    return read_nvml(load_record(fixture_text(name), name))


def test_mixed_8gpu_node() -> None:
    nvml = facts(MIXED)
    assert nvml.available and nvml.driver_version == "580.159.04"
    assert [g.gpu_index for g in nvml.gpus] == list(range(8))
    assert [g.compute_mode for g in nvml.gpus] == ["EXCLUSIVE_PROCESS"] * 4 + ["DEFAULT"] * 4
    assert [g.minor for g in nvml.gpus] == [0, 1, 3, 2, 4, 5, 6, 7]
    g0 = nvml.gpus[0]
    assert g0.processes == (ProcessUse(5100, 524288000), ProcessUse(5201, 1073741824),
                            ProcessUse(5202, 1073741824))
    assert g0.mps_processes == (ProcessUse(5201, 1073741824), ProcessUse(5202, 1073741824))
    assert (nvml.gpus[5].mig_current, nvml.gpus[5].mig_pending) == (True, True)
    assert (nvml.gpus[6].mig_current, nvml.gpus[6].mig_pending) == (False, True)
    assert nvml.gpus[4].processes == (ProcessUse(6100, None),)  # memory hidden
    assert nvml.gpus[7].mps_processes is None
    assert nvml.gpus[7].errors == ("mps_processes: NOT_SUPPORTED",)
    assert nvml.gpus[0].persistence is True


def test_lost_gpu_and_denied_field() -> None:
    nvml = facts("nvml__HANDWRITTEN_8gpu-h200-gpu-lost.json")
    lost = nvml.gpus[3]
    assert lost.lost and lost.uuid is None and lost.compute_mode is None
    assert lost.errors == ("uuid: GPU_IS_LOST",)  # stops asking a lost GPU
    assert nvml.gpus[7].compute_mode is None
    assert "compute_mode: NO_PERMISSION" in nvml.gpus[7].errors
    assert not nvml.gpus[2].lost


def test_recorded_no_driver_is_one_fact_level_line() -> None:
    nvml = facts("nvml__cpu-vm_no-driver.json")
    assert not nvml.available and nvml.gpus == ()
    assert nvml.error_code == "LIBRARY_NOT_FOUND"
    assert nvml.error == "libnvidia-ml.so.1 not found: no NVIDIA driver is installed on this node"


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_real_pynvml_without_driver_says_so() -> None:
    nvml = read_nvml(PynvmlApi())
    assert not nvml.available
    assert nvml.error_code in ("LIBRARY_NOT_FOUND", "PYNVML_MISSING", "DRIVER_NOT_LOADED")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_recorder_on_this_machine_matches_the_stored_recording() -> None:
    stored = json.loads(fixture_text("nvml__cpu-vm_no-driver.json"))
    assert record(PynvmlApi())["init_error"] == stored["init_error"]


def test_every_init_error_becomes_a_line() -> None:
    for code in ("DRIVER_NOT_LOADED", "NO_PERMISSION", "LIB_RM_VERSION_MISMATCH", "UNKNOWN"):
        nvml = read_nvml(RecordedApi({"format": "mps-health-nvml-record", "format_version": 1,
                                      "init_error": code, "devices": []}))
        assert not nvml.available and nvml.error and "\n" not in nvml.error
        assert nvml.error_code == code


def test_device_count_failure_and_bad_shapes() -> None:
    base = {"format": "mps-health-nvml-record", "format_version": 1, "init_error": None}
    nvml = read_nvml(RecordedApi({**base, "device_count": {"error": "GPU_IS_LOST"},
                                  "devices": []}))
    assert nvml.error_code == "GPU_IS_LOST"
    nvml = read_nvml(RecordedApi({**base, "device_count": 1,
                                  "devices": [{"minor": "zero", "compute_mode": [3]}]}))
    assert nvml.available
    assert nvml.gpus[0].errors[-1] == "recording: an answer has the wrong shape"


def test_bad_recordings_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match=r"^x\.json: Expecting"):
        load_record("{", "x.json")
    with pytest.raises(ValueError, match="not an NVML recording"):
        load_record("[]", "x.json")
    with pytest.raises(ValueError, match="format 2 is not supported"):
        load_record('{"format": "mps-health-nvml-record", "format_version": 2}', "x.json")


def test_recorded_api_replays_errors_as_nvml_errors() -> None:
    api = load_record(fixture_text(MIXED), MIXED)
    with pytest.raises(NvmlError) as e:
        api.query(7, "mps_processes")
    assert e.value.name == "NOT_SUPPORTED"
    with pytest.raises(NvmlError):
        api.query(8, "uuid")


def test_record_then_replay_round_trips() -> None:
    api = load_record(fixture_text(MIXED), MIXED)
    again = RecordedApi(record(api))
    assert read_nvml(again) == read_nvml(api)


def h200_recording() -> RecordedApi:
    """The real H200 capture (tests/gpu/dump_nvml.py's format) as a recording of ours."""
    dump = json.loads(fixture_text("nvml_dump__h200-driver580.json"))

    def procs(value):
        return value if isinstance(value, str) else [[p["pid"], p["used_memory"]] for p in value]

    devices = [{"uuid": g["uuid"], "minor": g["minor"], "name": g["name"],
                "compute_mode": g["compute_mode"], "mig_mode": g["mig_mode"],
                "persistence_mode": g["persistence"],
                "compute_processes": procs(g["compute_processes"]),
                "mps_processes": procs(g["mps_processes"])} for g in dump["gpus"]]
    return RecordedApi({"format": "mps-health-nvml-record", "format_version": 1,
                        "init_error": None, "driver_version": dump["driver"],
                        "device_count": len(devices), "devices": devices})


def test_real_h200_capture() -> None:
    nvml = read_nvml(h200_recording())
    assert nvml.available and nvml.driver_version == "580.159.04"
    (gpu,) = nvml.gpus
    assert (gpu.gpu_index, gpu.minor, gpu.name) == (0, 0, "NVIDIA H200")
    assert gpu.uuid == "GPU-15679ef6-f0ce-236f-4585-607064cf111a"
    assert gpu.compute_mode == "DEFAULT"  # as seen on the H200
    assert (gpu.mig_current, gpu.mig_pending, gpu.persistence) == (False, False, True)
    assert gpu.processes == () and gpu.mps_processes == () and gpu.errors == ()

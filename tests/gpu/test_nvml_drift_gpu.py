"""Real-GPU proof for NVML facts, compute-mode and gres-drift.

On the GPU node (root): ``python3 -m pytest -m gpu tests/gpu -v -s``. Nothing here
changes the GPU: the compute mode (Default on the H200) is read, and the expectation
is configured both ways to see both verdicts. With ``MPS_HEALTH_GPU_FAKE=1`` on a
machine without a GPU the same tests run on the recorded 2-GPU facts instead of live
NVML (the CLI parts, which need the live driver, are skipped).
"""

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from clirun import mps_health
from mps_health.config.load import from_mapping
from mps_health.engine import registry
from mps_health.engine import run as engine
from mps_health.probes.context import Context
from mps_health.probes.nvml import NvmlFacts, PynvmlApi, RecordedApi, read_nvml, record
from paths import FIXTURES

FAKE = os.environ.get("MPS_HEALTH_GPU_FAKE") == "1"


def real_gpu() -> bool:
    control = shutil.which("nvidia-cuda-mps-control")
    if not (control and shutil.which("nvidia-smi")):
        return False
    with open(control, "rb") as f:
        return f.read(4) == b"\x7fELF"  # our fake is a script


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (real_gpu() or FAKE),
                                 reason="needs an NVIDIA GPU (or MPS_HEALTH_GPU_FAKE=1)")]


def api() -> Any:
    if FAKE:
        return RecordedApi(json.loads((FIXTURES / "nvml__HANDWRITTEN_2gpu-test-node.json")
                                      .read_text()))
    return PynvmlApi()


def nvml_facts() -> NvmlFacts:
    return read_nvml(api())


def test_live_nvml_facts_parse() -> None:
    t0 = time.monotonic()
    facts = nvml_facts()
    elapsed = time.monotonic() - t0
    recording = record(api())
    print("\nNVML recording (tests/gpu/record_nvml.py format):")
    print(json.dumps(recording, indent=1))
    print(f"facts: {facts}")
    print(f"read_nvml took {elapsed * 1000:.1f} ms")
    assert facts.available, facts.error
    assert facts.gpus, "NVML sees no GPU"
    for gpu in facts.gpus:
        assert gpu.uuid and gpu.uuid.startswith("GPU-")
        assert gpu.minor is not None and gpu.compute_mode is not None
        assert not gpu.lost
        assert gpu.processes is not None
    replayed = read_nvml(RecordedApi(recording))
    strip = [g._replace(processes=None, mps_processes=None) for g in facts.gpus]
    assert [g._replace(processes=None, mps_processes=None) for g in replayed.gpus] == strip


def _judge(raw: Dict[str, Any], facts: NvmlFacts) -> List[Any]:
    from mps_health.model.facts import Facts

    f = Facts("gpu-node", time.time(), "/", (), {"nvml": facts}, {}, {})
    (run,) = engine.judge(f, from_mapping(raw, "gpu-test.yaml"), [registry.checks()["compute-mode"]])
    return list(run.results)


def test_compute_mode_expected_both_ways(tmp_path: Path) -> None:
    facts = nvml_facts()
    gpu0 = facts.gpus[0]
    actual = gpu0.compute_mode
    other = "EXCLUSIVE_PROCESS" if actual != "EXCLUSIVE_PROCESS" else "DEFAULT"
    print(f"\nGPU 0 compute mode is {actual} (not changed by this test)")
    for want, verdict in ((actual, "ok"), (other, "compute-mode-mismatch")):
        raw = {"gpu": {"compute_mode": {"0": want}}}
        (first, *_) = [r for r in _judge(raw, facts) if r.instance == "gpu0"]
        print(f"expect {want}: {first.code}: {first.message}")
        assert first.code == verdict
    if FAKE:
        return
    for want, code in ((actual, 0), (other, 1)):
        cfg = tmp_path / f"expect-{want}.yaml"
        cfg.write_text(f"run_dir: {tmp_path}/run\ngpu:\n  compute_mode:\n    mps: any\n"
                       f"    other: any\n    '0': {want}\n")
        r = mps_health("check", "--config", str(cfg), "--only", "compute-mode", "-v")
        print(f"$ mps-health check --only compute-mode -v  (gpu 0 expected {want})\n"
              f"{r.stdout}{r.stderr}exit {r.returncode}")
        assert r.returncode == code


def test_gres_drift_devices_against_live_minors(tmp_path: Path) -> None:
    facts = nvml_facts()
    minors = [g.minor for g in facts.gpus]
    dev = Path("/dev")
    if FAKE:  # no /dev/nvidiaN here: device nodes with the recorded minors stand in
        dev = tmp_path / "dev"
        dev.mkdir()
        try:
            for m in minors:
                os.mknod(dev / f"nvidia{m}", 0o644 | 0o020000, os.makedev(195, m or 0))
        except OSError:
            pytest.skip("mknod not allowed here")
    good = "".join(f"Name=gpu File={dev}/nvidia{m}\n" for m in minors)
    missing = max(m for m in minors if m is not None) + 1
    bad = good + f"Name=gpu File={dev}/nvidia{missing}\n"
    for name, text, expect in (("good", good, set()), ("bad", bad, {"gres-file-missing"})):
        conf = tmp_path / f"gres-{name}.conf"
        conf.write_text(text)
        raw = {"node_name": "gpu-node", "run_dir": f"{tmp_path}/run",
               "slurm": {"gres_conf": str(conf), "timeout_s": 2},
               "commands": {"scontrol": str(tmp_path / "no-scontrol-here")}}
        cfg = from_mapping(raw, "gpu-test.yaml")
        needs = [n for n in registry.checks()["gres-drift"].needs if n != "nvml"]
        gathered = engine.gather(Context(cfg, "/", time.monotonic() + 20), needs)
        gathered.sources["nvml"] = facts
        (run,) = engine.judge(gathered, cfg, [registry.checks()["gres-drift"]])
        codes = {r.code for r in run.results if r.state != 0}
        print(f"\ngres.conf {name}:\n{text}-> " + "; ".join(
            f"{r.code}: {r.message}" for r in run.results if r.state != 0))
        assert codes - {"slurm-unavailable"} == expect  # no Slurm on the GPU node: UNKNOWN
        assert "slurm-unavailable" in codes

#!/usr/bin/env python3
"""Print what NVML says about every GPU, as JSON (a raw capture for fixtures)."""

import json

import pynvml


def safe(fn, *args):  # type: ignore[no-untyped-def]
    try:
        value = fn(*args)
        return value.decode() if isinstance(value, bytes) else value
    except pynvml.NVMLError as e:
        return f"NVMLError: {e}"


pynvml.nvmlInit()
out = {"driver": safe(pynvml.nvmlSystemGetDriverVersion),
       "nvml": safe(pynvml.nvmlSystemGetNVMLVersion),
       "cuda_driver": safe(pynvml.nvmlSystemGetCudaDriverVersion), "gpus": []}
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    procs = safe(pynvml.nvmlDeviceGetComputeRunningProcesses, h)
    mps = safe(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, h)
    out["gpus"].append({
        "index": i, "name": safe(pynvml.nvmlDeviceGetName, h),
        "uuid": safe(pynvml.nvmlDeviceGetUUID, h),
        "minor": safe(pynvml.nvmlDeviceGetMinorNumber, h),
        "compute_mode": safe(pynvml.nvmlDeviceGetComputeMode, h),
        "mig_mode": safe(pynvml.nvmlDeviceGetMigMode, h),
        "persistence": safe(pynvml.nvmlDeviceGetPersistenceMode, h),
        "pci_bus_id": safe(lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId, h),
        "compute_processes": procs if isinstance(procs, str) else
        [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs],
        "mps_processes": mps if isinstance(mps, str) else
        [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in mps],
    })
pynvml.nvmlShutdown()
print(json.dumps(out, indent=1))

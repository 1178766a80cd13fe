"""The CUDA canary: a tiny client that proves MPS serves work, run as its own process.

Driver API through ctypes (libcuda.so.1): cuInit, cuDeviceGet, cuCtxCreate, cuMemAlloc;
then it writes "PID SECONDS" to MPS_HEALTH_CANARY_READY and holds its context until the
checker, having read the servers' client lists, removes that file (or
MPS_HEALTH_CANARY_HOLD_S passes); then cuMemFree, cuCtxDestroy. The checker's
CUDA_MPS_PIPE_DIRECTORY points it at the instance. The last stdout line is the verdict:

    mps-health-canary ok context_s=0.081234
    mps-health-canary cuda-error step=cuCtxCreate code=805 name=CUDA_ERROR_MPS_CONNECTION_FAILED
    mps-health-canary no-libcuda libcuda.so.1 not found: ...

Exit status 0, 2 and 3 respectively. Standard library only, and run with ``python -I
-S`` so it starts fast and reads nothing of the user it runs as.
"""

import ctypes
import os
import sys
import time

TAG = "mps-health-canary"


class CudaError(Exception):
    def __init__(self, step: str, code: int, name: str) -> None:
        super().__init__(f"step={step} code={code} name={name}")


def call(lib: ctypes.CDLL, step: str, versioned: str, *args) -> None:
    """``step`` by the ``versioned`` symbol the headers map it to ("": none), if present."""
    names = [versioned, step] if versioned else [step]
    fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
    if fn is None:
        raise AttributeError(names[0])
    code = fn(*args)
    if code != 0:
        text = ctypes.c_char_p()
        name = "CUDA_ERROR_UNKNOWN_CODE"
        if hasattr(lib, "cuGetErrorName") and lib.cuGetErrorName(code, ctypes.byref(text)) == 0 \
                and text.value:
            name = text.value.decode("ascii", "replace")
        raise CudaError(step, code, name)


def hold(ready: str, hold_s: float, context_s: float) -> None:
    """Tell the checker the context is up, then wait until it has looked."""
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()} {context_s:.6f}\n")
    os.rename(tmp, ready)
    end = time.monotonic() + hold_s
    while os.path.exists(ready) and time.monotonic() < end:
        time.sleep(0.005)


def run(env: dict) -> int:
    t0 = time.monotonic()
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(f"{TAG} no-libcuda libcuda.so.1 not found: {e}", flush=True)
        return 3
    device = int(env.get("MPS_HEALTH_CANARY_DEVICE", "0"))
    size = int(env.get("MPS_HEALTH_CANARY_BYTES", str(1 << 20)))
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    ptr = ctypes.c_uint64()
    try:
        call(lib, "cuInit", "", 0)
        call(lib, "cuDeviceGet", "", ctypes.byref(dev), device)
        call(lib, "cuCtxCreate", "cuCtxCreate_v2", ctypes.byref(ctx), 0, dev)
        call(lib, "cuMemAlloc", "cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
        context_s = time.monotonic() - t0
        if env.get("MPS_HEALTH_CANARY_READY"):
            hold(env["MPS_HEALTH_CANARY_READY"],
                 float(env.get("MPS_HEALTH_CANARY_HOLD_S", "10")), context_s)
        call(lib, "cuMemFree", "cuMemFree_v2", ptr)
        call(lib, "cuCtxDestroy", "cuCtxDestroy_v2", ctx)
    except CudaError as e:
        print(f"{TAG} cuda-error {e}", flush=True)
        return 2
    except AttributeError as e:
        print(f"{TAG} cuda-error step=dlsym code=-1 name=missing symbol {e}", flush=True)
        return 2
    print(f"{TAG} ok context_s={context_s:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(dict(os.environ)))

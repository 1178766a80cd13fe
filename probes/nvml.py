"""NVML facts: every GPU's identity, compute mode, MIG and persistence mode, processes.

NVML is asked through :class:`PynvmlApi` (pynvml, imported only when this source runs)
or :class:`RecordedApi` (a JSON recording), so the same interpretation runs on both.
Every NVML error becomes data (``NvmlFacts.error``, ``GpuFact.errors``); nothing raises.
"""

import contextlib
import json
import warnings
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from mps_health.probes.context import Context

RECORD_FORMAT = "mps-health-nvml-record"
RECORD_VERSION = 1

# nvmlDeviceGetComputeMode values (NVML_COMPUTEMODE_*); 1 is obsolete but still named.
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}

# What a fact-level NVML error means for the admin, by NVML_ERROR_* name.
INIT_ERRORS = {
    "PYNVML_MISSING": "the nvidia-ml-py package (module pynvml) is not installed: "
                      "pip install nvidia-ml-py",
    "LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found: no NVIDIA driver is installed "
                         "on this node",
    "DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded (modprobe nvidia, or "
                         "look at dmesg)",
    "NO_PERMISSION": "no permission to use NVML (/dev/nvidiactl): run as root",
    "LIB_RM_VERSION_MISMATCH": "the NVIDIA library and kernel driver versions differ: "
                               "reload the nvidia module or reboot",
    "GPU_IS_LOST": "a GPU fell off the bus (GPU_IS_LOST): the node needs a reset",
    "INVALID_ANSWER": "NVML gave an answer of the wrong shape (a damaged recording?)",
}


class NvmlError(Exception):
    """One NVML failure, named as NVML names it (``NOT_SUPPORTED``, ``GPU_IS_LOST``...)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class ProcessUse(NamedTuple):
    pid: int
    used_memory_bytes: Optional[int]  # None where NVML cannot tell (e.g. no permission)


class GpuFact(NamedTuple):
    """One GPU as NVML sees it. A field NVML could not answer is None (see ``errors``)."""

    gpu_index: int
    uuid: Optional[str] = None
    minor: Optional[int] = None  # N of /dev/nvidiaN
    name: Optional[str] = None
    compute_mode: Optional[str] = None  # a COMPUTE_MODES value, or "UNKNOWN(n)"
    mig_current: Optional[bool] = None  # None: MIG not supported on this GPU
    mig_pending: Optional[bool] = None
    persistence: Optional[bool] = None
    processes: Optional[Tuple[ProcessUse, ...]] = None  # compute processes (MPS server too)
    mps_processes: Optional[Tuple[ProcessUse, ...]] = None  # MPS clients only
    lost: bool = False  # GPU_IS_LOST on some question
    errors: Tuple[str, ...] = ()  # "field: NVML_ERROR_NAME"


class NvmlFacts(NamedTuple):
    available: bool
    error_code: Optional[str] = None  # NVML_ERROR_* name (or PYNVML_MISSING) when unavailable
    error: Optional[str] = None  # the one line an admin reads
    driver_version: Optional[str] = None
    gpus: Tuple[GpuFact, ...] = ()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _uses(value: Any) -> List[List[Any]]:
    # pynvml gives None (or NVML_VALUE_NOT_AVAILABLE, 2**64-1) where memory is hidden.
    return [[int(p.pid), m if isinstance(m := getattr(p, "usedGpuMemory", None), int)
             and m < 2**63 else None] for p in value]


# The questions asked of each GPU, in the order they are recorded: pynvml's function and
# how its answer is kept.
QUERIES: Dict[str, Tuple[str, Callable[[Any], Any]]] = {
    "uuid": ("nvmlDeviceGetUUID", _text),
    "minor": ("nvmlDeviceGetMinorNumber", int),
    "name": ("nvmlDeviceGetName", _text),
    "compute_mode": ("nvmlDeviceGetComputeMode", int),
    "mig_mode": ("nvmlDeviceGetMigMode", lambda v: [int(x) for x in v]),
    "persistence_mode": ("nvmlDeviceGetPersistenceMode", int),
    "compute_processes": ("nvmlDeviceGetComputeRunningProcesses", _uses),
    "mps_processes": ("nvmlDeviceGetMPSComputeRunningProcesses", _uses),
}
FIELDS = tuple(QUERIES)


class PynvmlApi:
    """The real NVML through pynvml; answers are plain values, failures NvmlError."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: Dict[int, Any] = {}
        self._names: Dict[int, str] = {}

    def init(self) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the deprecated 'pynvml' shim warns on import
                import pynvml
        except ImportError:
            raise NvmlError("PYNVML_MISSING") from None
        self._nvml = pynvml
        self._names = {getattr(pynvml, n): n[len("NVML_ERROR_"):]
                       for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
        self._call("nvmlInit")

    def shutdown(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(NvmlError):
                self._call("nvmlShutdown")

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, name, None)
        if fn is None:  # an nvidia-ml-py too old for this question
            raise NvmlError("FUNCTION_NOT_FOUND")
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            value = getattr(e, "value", -1)
            raise NvmlError(self._names.get(value, f"ERROR_{value}")) from None

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def query(self, index: int, field: str) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        name, keep = QUERIES[field]
        return keep(self._call(name, self._handles[index]))


class RecordedApi:
    """Replays a recording made by :func:`record` (tests, and support cases)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        if not isinstance(data, Mapping) or data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not an NVML recording (no format '{RECORD_FORMAT}')")
        if data.get("format_version") != RECORD_VERSION:
            raise ValueError(f"NVML recording format {data.get('format_version')!r} is not "
                             f"supported (this version reads {RECORD_VERSION})")
        devices = data.get("devices", [])
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ValueError("NVML recording: 'devices' must be a list of mappings")
        self.data = data

    @staticmethod
    def _answer(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"error"}:
            raise NvmlError(str(value["error"]))
        return value

    def init(self) -> None:
        if self.data.get("init_error"):
            raise NvmlError(str(self.data["init_error"]))

    def shutdown(self) -> None:
        pass

    def driver_version(self) -> str:
        return str(self._answer(self.data.get("driver_version", {"error": "NOT_SUPPORTED"})))

    def device_count(self) -> int:
        return self._answer(self.data.get("device_count", len(self.data["devices"])))

    def query(self, index: int, field: str) -> Any:
        devices = self.data["devices"]
        if not 0 <= index < len(devices):
            raise NvmlError("INVALID_ARGUMENT")
        return self._answer(devices[index].get(field, {"error": "FUNCTION_NOT_FOUND"}))


def _asked(ask: Callable[..., Any], *args: Any) -> Any:
    """``ask(*args)``, or ``{"error": NAME}`` where NVML failed: as a recording keeps it."""
    try:
        return ask(*args)
    except NvmlError as e:
        return {"error": e.name}


def record(api: Any) -> Dict[str, Any]:
    """Ask ``api`` every question and keep the raw answers and errors as JSON-able data."""
    out: Dict[str, Any] = {"format": RECORD_FORMAT, "format_version": RECORD_VERSION,
                           "init_error": None, "devices": []}
    try:
        api.init()
    except NvmlError as e:
        out["init_error"] = e.name
        return out
    try:
        out["driver_version"] = _asked(api.driver_version)
        out["device_count"] = count = _asked(api.device_count)
        out["devices"] = [{field: _asked(api.query, index, field) for field in FIELDS}
                          for index in range(count if isinstance(count, int) else 0)]
    finally:
        api.shutdown()
    return out


def _processes(value: Any) -> Tuple[ProcessUse, ...]:
    if not isinstance(value, list) or not all(
            isinstance(i, list) and len(i) == 2 and isinstance(i[0], int) for i in value):
        raise NvmlError("INVALID_ANSWER")
    return tuple(ProcessUse(pid, mem if isinstance(mem, int) else None) for pid, mem in value)


def read_gpu(api: Any, index: int) -> GpuFact:
    """One GPU's facts; a question that fails leaves its field None and a note."""
    values: Dict[str, Any] = {}
    errors: List[str] = []
    for field in FIELDS:
        try:
            values[field] = api.query(index, field)
        except NvmlError as e:
            errors.append(f"{field}: {e.name}")
            if e.name == "GPU_IS_LOST":
                break  # every other question would fail the same way, slowly
    fact = GpuFact(index, lost=bool(errors) and errors[-1].endswith(": GPU_IS_LOST"))
    try:
        fact = _interpret(fact, values)
    except (NvmlError, TypeError, ValueError, LookupError):
        errors.append("recording: an answer has the wrong shape")
    return fact._replace(errors=tuple(errors))


def _interpret(fact: GpuFact, v: Mapping[str, Any]) -> GpuFact:
    mode = v.get("compute_mode")
    mig = v.get("mig_mode")
    persistence = v.get("persistence_mode")
    return fact._replace(
        uuid=str(v["uuid"]) if "uuid" in v else None,
        minor=int(v["minor"]) if "minor" in v else None,
        name=str(v["name"]) if "name" in v else None,
        compute_mode=None if mode is None else COMPUTE_MODES.get(int(mode), f"UNKNOWN({mode})"),
        mig_current=None if mig is None else bool(mig[0]),
        mig_pending=None if mig is None else bool(mig[1]),
        persistence=None if persistence is None else bool(persistence),
        processes=_processes(v["compute_processes"]) if "compute_processes" in v else None,
        mps_processes=_processes(v["mps_processes"]) if "mps_processes" in v else None,
    )


def read_nvml(api: Any) -> NvmlFacts:
    """Every GPU through ``api``; never raises for an NVML problem."""
    try:
        api.init()
    except NvmlError as e:
        return unavailable(e.name)
    try:
        count = api.device_count()
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 1024:
            return unavailable("INVALID_ANSWER")
        driver = _asked(api.driver_version)  # {"error": NAME} where NVML could not say
        gpus = tuple(read_gpu(api, i) for i in range(count))
    except NvmlError as e:  # the count (each GPU's questions note their own failures)
        return unavailable(e.name)
    finally:
        api.shutdown()
    return NvmlFacts(True, driver_version=None if isinstance(driver, dict) else driver,
                     gpus=gpus)


def unavailable(code: str) -> NvmlFacts:
    return NvmlFacts(False, code, INIT_ERRORS.get(code, f"NVML failed: {code}"))


def load_record(text: str, where: str) -> RecordedApi:
    """A RecordedApi from JSON text; ValueError with ``where`` on bad input."""
    try:
        return RecordedApi(json.loads(text))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def gather(ctx: Context, instances: object) -> NvmlFacts:
    return read_nvml(PynvmlApi())


VALUE_TYPE = NvmlFacts

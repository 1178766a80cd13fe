"""Made facts for the checks' unit tests: the few records every check file builds.

A check is a pure function of ``Facts`` and the config; these build both by hand, so a
test names only what its case is about.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from mps_health.config.load import Config, from_mapping
from mps_health.model.facts import DirFact, Facts, Instance, ProcessFact
from mps_health.model.results import OK, Result

NOW = 1_000_000.0
NODE = Instance("node", "node", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
GPU0 = Instance("gpu0", "per-gpu", "/tmp/nvidia-mps-gpu0", "/var/log/nvidia-mps-gpu0", gpu="0")
JOB = Instance("job77", "per-job", "/tmp/nvidia-mps_job77", "/tmp/nvidia-log_job77", job_id="77")


def config(mapping: Optional[Mapping[str, Any]] = None) -> Config:
    return from_mapping(dict(mapping or {}), "site.yaml")


def facts(sources: Mapping[str, object], instances: Iterable[Instance] = (NODE,),
          **extra: Any) -> Facts:
    return Facts("n1", NOW, "/", tuple(instances), dict(sources), {}, {}, **extra)


def run(module: Any, sources: Mapping[str, object], instances: Iterable[Instance] = (NODE,),
        cfg: Optional[Mapping[str, Any]] = None, **extra: Any) -> List[Result]:
    """``module.check`` over made facts and a config made from ``cfg``."""
    return list(module.check(facts(sources, instances, **extra), config(cfg)))


def codes(results: Iterable[Result]) -> List[Tuple[str, int, str]]:
    """(instance, state, code) of each result, in order."""
    return [(r.instance, r.state, r.code) for r in results]


def problems(results: Iterable[Result]) -> List[Result]:
    return [r for r in results if r.state != OK]


def one(results: Iterable[Result], code: str) -> Result:
    """The one result of ``code`` (fails when there is none or more than one)."""
    found = [r for r in results if r.code == code]
    assert len(found) == 1, f"{code}: {[(r.code, r.message) for r in results]}"
    return found[0]


def proc(pid: int, role: str = "control", *, uid: int = 0, state: str = "S", ppid: int = 1,
         pipe_dir: Optional[str] = NODE.pipe_dir, genuine: Optional[bool] = True,
         environ_readable: bool = True, traced: bool = False,
         start: Optional[int] = None) -> ProcessFact:
    """An nvidia-cuda-mps-* process: a daemon (``-d``), a server or a client."""
    name = "nvidia-cuda-mps-server" if role == "server" else "nvidia-cuda-mps-control"
    argv = (name, "-d") if role == "control" else (name,)
    return ProcessFact(pid, ppid, state, uid, role, argv, pid * 10 if start is None else start,
                       pipe_dir, environ_readable, genuine, traced)


def pipe_dir(path: str = NODE.pipe_dir, *, kind: str = "dir", mode: int = 0o777,
             uid: int = 0, **kw: Any) -> DirFact:
    return DirFact(path, kind, mode, uid, 0, "root" if uid == 0 else None, **kw)


def dirs_of(*instances: Instance, pipe_mode: int = 0o777, log_mode: int = 0o755,
            **by_path: DirFact) -> Dict[str, DirFact]:
    """Healthy pipe and log dirs of ``instances`` (root's), with ``by_path`` over them."""
    out = {}
    for inst in instances:
        out[inst.pipe_dir] = pipe_dir(inst.pipe_dir, mode=pipe_mode)
        out[inst.log_dir] = pipe_dir(inst.log_dir, mode=log_mode)
    out.update(by_path)
    return out

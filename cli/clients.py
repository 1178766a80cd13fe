"""``mps-health clients``: who MPS serves on this node (instances, servers, their clients
and jobs), as a table or JSON, from check's facts within the run's budget or a
snapshot's (``--replay``). Everything taken from users' processes is escaped before it
is printed.
"""

import argparse
import json
from typing import Any, Callable, Dict, List, Optional

from mps_health.checks import blockers
from mps_health.checks.clients import attribute, ceiling
from mps_health.checks.limits import default_percentage
from mps_health.cli.check import replayed
from mps_health.cli.common import add_common, budget, load_config
from mps_health.config.load import Config
from mps_health.engine import run as engine
from mps_health.model.exitcodes import Failure
from mps_health.model.facts import Facts
from mps_health.model.printable import escape as e
from mps_health.probes.jobs import gres_count

SOURCES = ("servers", "jobs", "nvml", "control", "processes", "dirs", "blockers")
HELD_BY = {"connection": "an idle connection to the control socket",
           "server": "the instance's own MPS server, stopped",
           "foreign-server": "an MPS server binary the daemon did not start, stopped",
           "daemon": "the control daemon itself, stopped"}


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    add_common(p)
    p.add_argument("instance", nargs="*", metavar="INSTANCE",
                   help="only these instances (node, gpu0, job1234; default: every one)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text: a table per server (default); json: the same data")
    p.add_argument("--replay", metavar="FILE", help="read a saved snapshot instead of this node")
    p.add_argument("--budget", type=budget, metavar="SECONDS",
                   help="time allowed for gathering (default: the config's budget_s)")
    return run


def view(facts: Facts, config: Config) -> Dict[str, Any]:
    """The plain data both formats print (raw strings: escaped by the text format,
    by JSON's own escaping in the other)."""
    servers: Any = facts.sources.get("servers")
    jobs: Any = facts.sources.get("jobs")
    control: Any = facts.sources.get("control") or {}
    nv: Any = facts.sources.get("nvml")
    by_id = {j.job_id: j for j in (getattr(jobs, "jobs", None) or ())}
    memory: Dict[int, int] = {}  # client PID -> GPU memory over all GPUs (NVML's MPS lists)
    for gpu in getattr(nv, "gpus", ()) or ():
        for p in gpu.mps_processes or ():
            if p.used_memory_bytes is not None:
                memory[p.pid] = memory.get(p.pid, 0) + p.used_memory_bytes
    out: Dict[str, Any] = {"node": facts.node, "taken_at": facts.taken_at, "instances": [],
                           "errors": dict(facts.errors)}
    if jobs is not None and jobs.error:
        out["errors"]["jobs"] = jobs.error
    if nv is not None and not nv.available:
        out["errors"]["nvml"] = nv.error
    for inst in facts.instances:
        cur = servers.instances.get(inst.name) if servers is not None else None
        answer = control.get(inst.name) if isinstance(control, dict) else None
        entry: Dict[str, Any] = {
            "name": inst.name, "pipe_dir": inst.pipe_dir, "gpu": inst.gpu,
            "query": cur.query if cur else "not-gathered", "detail": cur.detail if cur else "",
            "daemon_pid": cur.daemon_pid if cur else None,
            # read as the limits check reads it
            "default_thread_percentage": default_percentage(answer),
            "default_pinned_mem_limits": {str(o): v for o, v in
                                          (cur.default_pinned_mem_limits if cur else ())},
            "servers": [], "held_by": held_by(facts, inst)}
        for s in (cur.servers if cur else ()):
            server: Dict[str, Any] = {
                "pid": s.pid, "user": s.user, "uid": s.uid, "status": s.status,
                "detail": s.detail, "thread_percentage": s.thread_percentage,
                "devices": [d._asdict() for d in s.devices],
                "errors": list(s.detail_errors), "clients": []}
            for c in s.clients:
                # The job squeue gives to the client's uid; a job of another uid is only
                # what the client claims (the check's client-job-mismatch).
                job, mismatch = attribute(c, by_id)
                known = c.environ in ("read", "truncated")
                server["clients"].append({
                    "pid": c.pid, "user": c.user, "uid": c.uid, "command": c.command,
                    "job_id": None if mismatch else (c.job_id or None),
                    "job_from": c.job_from or None, "job_mismatch": mismatch or None,
                    "job_claimed": c.job_id if mismatch else None,
                    "job_gres": job.gres if job else None,
                    "job_mps": gres_count(job, "mps") if job else None,
                    "environ": c.environ or None, "env_thread_percentage": c.thread_percentage,
                    "thread_ceiling": ceiling(c, s)[0] if known else None,
                    "env_pinned_mem_limit": c.pinned_mem_limit or None, "env_pipe_dir": c.pipe_dir,
                    "gpus": list(c.gpus), "pid_namespace": c.namespace or None,
                    "gpu_memory_bytes": memory.get(c.pid)})
            entry["servers"].append(server)
        out["instances"].append(entry)
    return out


def only(data: Dict[str, Any], wanted: List[str]) -> Dict[str, Any]:
    """The view of the instances named (all when none is); a name the node has not is
    one line, exit 3."""
    known = [i["name"] for i in data["instances"]]
    for name in wanted:
        if name not in known:
            raise Failure(f"no MPS instance named '{e(name, 60)}' on this node (known: "
                          f"{', '.join(map(e, known)) or 'none'})")
    if not wanted:
        return data
    return {**data, "instances": [i for i in data["instances"] if i["name"] in wanted]}


def held_by(facts: Facts, inst: Any) -> List[Dict[str, Any]]:
    """What holds the instance's daemon (the blockers check's rule), where it is known."""
    found: Any = facts.sources.get("blockers")
    procs: Any = facts.sources.get("processes")
    dirs: Any = facts.sources.get("dirs") or {}
    if found is None or procs is None:
        return []
    out = []
    for b in blockers.find(inst, procs, dirs.get(inst.pipe_dir), found.waiting.get(inst.name),
                           facts.root):
        h = b.holder
        out.append({"pid": b.pid, "uid": b.uid, "user": h.user if h else None,
                    "job_id": h.job_id if h else None, "kind": b.kind, "state": b.state,
                    "started_at": h.started_at if h else None, "remedy": b.remedy,
                    "shown": blockers.who(b)})
    return out


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:g}%"


def render_text(data: Dict[str, Any]) -> str:
    lines: List[str] = [f"MPS clients on {e(data['node'])}"]
    for inst in data["instances"]:
        limits = ", ".join(f"{o}={e(v) or 'none'}" for o, v in
                           inst["default_pinned_mem_limits"].items()) or "-"
        daemon = inst["daemon_pid"] if inst["daemon_pid"] is not None else "none"
        lines.append(f"instance {e(inst['name'])}: pipe dir {e(inst['pipe_dir'])}, daemon "
                     f"{daemon}, default threads {_pct(inst['default_thread_percentage'])}, "
                     f"default pinned memory {limits}")
        for b in inst["held_by"]:  # who() escaped what it took from the system
            step = "kill -CONT" if b["remedy"] == "cont" else "mps-health remediate unblock" \
                if b["remedy"] else "a person (a process of root's)"
            lines.append(f"  HELD by {b['shown']}: {HELD_BY[b['kind']]}; freed by {step}")
        if inst["query"] not in ("ok", "idle"):
            lines.append(f"  servers not listed: {e(inst['query'])}: {e(inst['detail'])}")
            continue
        if not inst["servers"]:  # idle: the control daemon has no server process
            lines.append("  no server runs")
        for s in inst["servers"]:
            gpus = "; ".join(f"{e(d['uuid'])} (dev {d['ordinal']}: pinned "
                             f"{e(d['pinned_mem_limit']) or 'no limit'}, "
                             f"{'?' if d['contexts'] is None else d['contexts']} contexts)"
                             for d in s["devices"]) or "GPUs unknown"
            lines.append(f"  server {s['pid']} {e(s['user'] or str(s['uid']))} {e(s['status'])}"
                         f" threads {_pct(s['thread_percentage'])} on {gpus}")
            lines += [f"    note: {e(err)}" for err in s["errors"][:3]]
            if not s["clients"]:
                lines.append("    no client")
                continue
            lines.append(f"    {'PID':<8} {'USER':<12} {'JOB':<9} {'ASKED':<12} {'THREADS':<14}"
                         f" {'PINNED':<8} {'GPU MEM':<9} COMMAND")
            for c in s["clients"]:
                if c["job_mismatch"]:  # "!" and the job it names: not its own
                    job, asked = "!" + e(c["job_claimed"], 8), "not theirs"
                else:
                    job = e(c["job_id"] or "-", 9)
                    asked = e(c["job_gres"] or ("?" if c["job_id"] else "-"), 12)
                if c["environ"] in ("read", "truncated"):
                    env = c["env_thread_percentage"]
                    threads = _pct(c["thread_ceiling"]) + ("" if env is None else f" (env {env:g})")
                else:
                    threads = f"? ({c['environ'] or 'unread'})"
                mem = c["gpu_memory_bytes"]
                mib = "-" if mem is None else f"{mem / 2**20:.0f} MiB"
                lines.append(f"    {c['pid']:<8} {e(c['user'] or str(c['uid']), 12):<12} "
                             f"{job:<9} {asked:<12} {threads:<14} "
                             f"{e(c['env_pinned_mem_limit'] or '-', 8):<8} "
                             f"{mib:<9} {e(c['command'] or '?', 60)}")
    for source, why in sorted(data["errors"].items()):
        lines.append(f"note: {e(source)}: {e(why or '')}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.replay:  # a snapshot's facts, else this node's within the budget
        facts, config = replayed(args)
    else:
        config = load_config(args)
        facts = engine.facts_within(config, args.root, SOURCES, args.budget or config.budget_s)
    data = only(view(facts, config), args.instance)
    if args.format == "json":
        print(json.dumps(data, indent=1, sort_keys=True))
    else:
        print(render_text(data))
    # UNKNOWN when any instance's servers could not be listed (the view says why).
    listed = all(i["query"] in ("ok", "idle") for i in data["instances"])
    return 0 if "servers" in facts.sources and listed else 3

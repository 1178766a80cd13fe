"""gres.conf and slurm.conf lines from the GPUs (templates/*.j2), and how they differ
from what is installed.

Compared by meaning, not text, read by the probes' readers (one reader per input: the
gres.conf probe's, the hostlist's): comments, continuations and blank lines as slurmd
reads them, keys matched case-insensitively, ``File=/dev/nvidia[0-1]`` ranges expanded,
only lines for this node (no NodeName=, or one whose host list holds it). Pure: no file
reads here but through the ``read_include`` given.
"""

import difflib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mps_health.probes.gres_conf import GresLine, logical_lines, parse_gres_conf
from mps_health.probes.hostlist import ParseError, expand
from mps_health.slurm.gpus import GresGpu

# Hook -> its slurm.conf key; the script is named mps-health-HOOK.
HOOK_KEYS = {"prolog": "Prolog", "task-prolog": "TaskProlog", "epilog": "Epilog"}
# GRES whose Count is shared out over their files (each device gets Count / files).
SHARED = ("mps", "shard")


def template(name: str):  # -> jinja2.Template
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mps_health.slurm", "templates"),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False)
    return env.get_template(name)


def gres_value(gpus: Sequence[GresGpu], count: int) -> str:
    """The node's ``Gres=`` in slurm.conf: ``gpu:2,mps:200``."""
    mps = sum(count for g in gpus if g.mps)
    return f"gpu:{len(gpus)}" + (f",mps:{mps}" if mps else "")


def render_gres_conf(gpus: Sequence[GresGpu], node: str, driver: Optional[str], count: int,
                     dev_dir: str = "/dev", node_prefix: bool = False) -> str:
    by_index = sorted(gpus, key=lambda g: g.gpu_index)
    mps = [str(g.gpu_index) for g in by_index if g.mps]
    return template("gres.conf.j2").render(
        gpus=gpus, node=node, driver=driver or "unknown", count=count,
        dev_dir=dev_dir.rstrip("/") or "", prefix=f"NodeName={node} " if node_prefix else "",
        mps_names=("GPU " + ",".join(mps)) if mps else "no GPU",
        in_pci_order=[g.minor for g in by_index] == sorted(g.minor for g in by_index))


def hook_paths(prefix: str) -> Dict[str, str]:
    return {hook: f"{prefix.rstrip('/')}/mps-health-{hook}" for hook in HOOK_KEYS}


def render_slurm_conf(gpus: Sequence[GresGpu], node: str, count: int, layout: str,
                      hooks_prefix: str, health_check_program: str,
                      health_check_interval: int, no_gpus: str = "",
                      health_check_note: str = "") -> str:
    """The lines; without GPUs (``no_gpus`` says why: no NVML here) all but the node's
    Gres=, which needs them. ``health_check_note``: a comment above HealthCheckProgram=
    (why it is not the README's path)."""
    paths = hook_paths(hooks_prefix)
    return template("slurm.conf.j2").render(
        gpus=gpus, node=node, mps_count=sum(1 for g in gpus if g.mps), layout=layout,
        per_job=layout == "per-job", prolog=paths["prolog"],
        task_prolog=paths["task-prolog"], epilog=paths["epilog"],
        health_check_program=health_check_program,
        health_check_interval=health_check_interval, health_check_note=health_check_note,
        gres=gres_value(gpus, count) if gpus else "", no_gpus=no_gpus)


def render_hook(hook: str, python: str, config: Optional[str], path: str) -> str:
    return template("hook.j2").render(hook=hook, python=python, path=path,
                                      key=HOOK_KEYS[hook], hook_literal=repr(hook),
                                      config_literal=repr(config))


# --- comparing with what is installed ---------------------------------------------------
def on_node(hosts: str, node: str) -> bool:
    """Whether Slurm's host list ``hosts`` names ``node``; a malformed one names none."""
    try:
        return node in expand(hosts)
    except ParseError:
        return False


def device_lines(line: GresLine) -> List[str]:
    """One gres.conf record as one canonical line per device file: ``Name= [Type=]
    [Count=] [File=]``; Count only where it says more than the files do (a gpu's is one
    per file), a shared GRES's spread evenly over its files, as slurmd does."""
    head = f"Name={line.name}" + (f" Type={line.type}" if line.type else "")
    if not line.files:
        return [head + (f" Count={line.quantity}" if line.quantity != 1 else "")]
    shared = line.name in SHARED
    if shared:
        count = f" Count={line.quantity // len(line.files)}"
    else:
        count = f" Count={line.quantity}" if line.quantity != len(line.files) else ""
    return [f"{head}{count} File={f}" for f in line.files]


def gres_lines(text: str, node: str, where: str = "gres.conf",
               read_include: Optional[Callable[[str], str]] = None) -> List[str]:
    """The gres.conf lines that apply to ``node``, one device each, in a canonical form, as
    the gres.conf probe reads them; a line it cannot read is said as ``# FILE:LINE: why``
    (so it shows in a diff)."""
    conf = parse_gres_conf(text, node, where, read_include)
    out = [f"AutoDetect={conf.autodetect}"] if conf.autodetect else []
    out += [dev for line in conf.lines for dev in device_lines(line)]
    return out + [f"# {error}" for error in conf.errors]


def unified(expected: Sequence[str], installed: Sequence[str], installed_name: str,
            expected_name: str) -> str:
    return "".join(difflib.unified_diff([x + "\n" for x in installed],
                                        [x + "\n" for x in expected],
                                        fromfile=installed_name, tofile=expected_name))


def _natural(line: str) -> Tuple[Tuple[str, int], ...]:
    """Sort key: 'Name=gpu File=/dev/nvidia10' after '.../nvidia9'."""
    heads = [(word, word.rstrip("0123456789")) for word in line.split()]
    return tuple((head, int(word[len(head):] or -1)) for word, head in heads)


def diff_gres_conf(expected: str, installed: str, node: str, installed_name: str,
                   read_include: Optional[Callable[[str], str]] = None) -> str:
    """"" when the installed gres.conf says the same for ``node``, else a unified diff.
    Line order does not count (gpu lines first, or each GPU's gpu and mps lines together,
    describe the same node): both sides are sorted. ``read_include`` reads the installed
    file's ``Include`` files (none read without it: each is then a difference)."""
    want = sorted(gres_lines(expected, node, "from NVML"), key=_natural)
    have = sorted(gres_lines(installed, node, installed_name, read_include), key=_natural)
    return "" if want == have else unified(want, have, installed_name, "from NVML")


# --- slurm.conf ---------------------------------------------------------------------------
def conf_settings(rendered: str) -> List[Tuple[str, str]]:
    """(key, value) of our rendered Key=Value lines, and ("Gres", value) of the node's
    Gres from the comment."""
    out: List[Tuple[str, str]] = []
    for raw in rendered.splitlines():
        line = raw.strip()
        key, sep, value = line.lstrip("#").strip().partition("=")
        if sep and (key == "Gres" or not line.startswith("#")):
            out.append((key, value))
    return out


def parse_slurm_conf(text: str, node: str) -> Tuple[Dict[str, str], Optional[str]]:
    """Global settings (keys lower-cased, last one wins) and ``node``'s Gres= (None: none)."""
    settings: Dict[str, str] = {}
    gres: Optional[str] = None
    for _, line in logical_lines(text):  # comments and continuations as slurmd reads them
        words = line.split()
        first_key, _, first_value = words[0].partition("=")
        if first_key.lower() == "nodename":
            if on_node(first_value, node):
                found = {k.lower(): v for k, _, v in (w.partition("=") for w in words[1:])}
                gres = found.get("gres", gres)
            continue
        if first_key.lower() in ("partitionname", "nodeset", "frontendname",
                                 "downnodes", "switchname"):
            continue
        for w in words:
            k, sep, v = w.partition("=")
            if sep:
                settings[k.lower()] = v
    return settings, gres


def diff_slurm_conf(rendered: str, installed: str, node: str, installed_name: str) -> str:
    """"" when slurm.conf has every rendered setting, else a unified diff of those lines."""
    settings, gres = parse_slurm_conf(installed, node)
    want: List[str] = []
    have: List[str] = []
    for key, value in conf_settings(rendered):
        if key == "Gres":
            want.append(f"NodeName={node} Gres={value}")
            have.append(f"NodeName={node} Gres={gres}" if gres is not None
                        else f"NodeName={node} (no Gres=)")
            continue
        want.append(f"{key}={value}")
        found = settings.get(key.lower())
        have.append(f"{key}={found}" if found is not None else f"({key} not set)")
    return "" if want == have else unified(want, have, installed_name, "mps-health slurm conf")


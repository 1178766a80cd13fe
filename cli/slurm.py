"""``mps-health slurm``: gres.conf and slurm.conf lines from NVML (``gres-conf``, ``conf``),
and the per-job layout's hook scripts (``install``). ``--diff`` compares with the installed
file: exit 0 when it says the same, 1 with a unified diff when not, 3 when it cannot tell
(as every other failure here).
"""

import argparse
import contextlib
import errno
import os
import sys
import sysconfig
from typing import Any, Callable, Tuple

from mps_health.cli.common import add_config, load_config
from mps_health.config.load import Config, mps_gpu_ids
from mps_health.config.slurm import settings
from mps_health.hostio.safefiles import read_small
from mps_health.model.exitcodes import ExitCode, Failure
from mps_health.probes.context import node_name
from mps_health.slurm import gpus as nvml
from mps_health.slurm import render
from mps_health.slurm.install import InstallError, conf_lines, hooks_for, plan, written_before
from mps_health.slurm.install import install as write

DEFAULT_PREFIX = "/etc/slurm"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def register(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    sub = p.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", parser_class=type(p))

    g = sub.add_parser("gres-conf", help="gres.conf lines for this node's GPUs, from NVML")
    c = sub.add_parser("conf", help="slurm.conf lines: GresTypes, Gres=, hooks, health check")
    i = sub.add_parser("install", help="write the Prolog, TaskProlog and Epilog scripts "
                       "(the per-job layout's; none for the node and per-gpu layouts)")
    for q in (g, c, i):
        add_config(q)
    for q in (g, c):  # the GPUs, from NVML
        q.add_argument("--mps-gpus", metavar="all|none|0,1",
                       help="GPUs (indices or UUIDs) that get Name=mps lines (default: the "
                            "config's gpu.mps_gpus, else every GPU)")
        q.add_argument("--count", type=int, metavar="N",
                       help="mps Count per GPU (default: slurm.mps_per_gpu, else 100)")
        q.add_argument("--nvml-record", metavar="FILE",
                       help="read the GPUs from an NVML recording instead of NVML")
        q.add_argument("--node-name", metavar="NAME",
                       help="this node's Slurm name (default: SLURMD_NODENAME, node_name, "
                            "the short hostname)")
    g.add_argument("--dev-dir", default="/dev", metavar="DIR",
                   help="where the nvidiaN device files are (default /dev)")
    g.add_argument("--with-node-name", action="store_true",
                   help="start each line with NodeName=NODE (for a cluster-wide gres.conf)")
    c.add_argument("--prefix", default=DEFAULT_PREFIX, metavar="DIR",
                   help="where `mps-health slurm install` put the hooks (default /etc/slurm)")
    c.add_argument("--health-check-program", metavar="PATH",
                   help="default: /usr/local/sbin/mps-health-healthcheck (or /usr/sbin's), "
                   "where the README links it, when it is this installation's; else the one "
                   "beside this Python's scripts")
    c.add_argument("--health-check-interval", type=int, default=300, metavar="SECONDS",
                   help="HealthCheckInterval: how often slurmd runs it (default 300)")
    # --diff against the installed file, and --gres-conf/--slurm-conf naming it.
    for q, installed, default in ((g, "gres.conf", "slurm.gres_conf, else beside slurm.conf"),
                                  (c, "slurm.conf", "$SLURM_CONF, else /etc/slurm/slurm.conf")):
        q.add_argument("--diff", action="store_true",
                       help=f"compare with the installed {installed}; exit 1 when it differs")
        q.add_argument("--" + installed.replace(".", "-"), metavar="FILE",
                       help=f"the installed {installed} (default: {default})")
    i.add_argument("--prefix", default=DEFAULT_PREFIX, metavar="DIR",
                   help="directory for mps-health-{prolog,task-prolog,epilog} (default "
                        "/etc/slurm)")
    i.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="interpreter the scripts run with (default: this one)")
    i.add_argument("--force", action="store_true", help="replace files we did not write")
    i.add_argument("--dry-run", action="store_true", help="print the scripts, write nothing")
    g.set_defaults(slurm_handler=gres_conf)
    c.set_defaults(slurm_handler=conf)
    i.set_defaults(slurm_handler=install)

    def run(args: argparse.Namespace) -> int:
        handler = getattr(args, "slurm_handler", None)
        if handler is None:
            p.print_help()
            return ExitCode.UNKNOWN
        return int(handler(args))

    return run


# --- settings shared with the checks' config --------------------------------------------
def mps_count(args: argparse.Namespace, config: Config) -> int:
    count = args.count if args.count is not None else settings(config).mps_per_gpu
    if count < 1:
        raise ValueError(f"mps Count must be a whole number of at least 1 (got {count!r})")
    return int(count)


def _gpus(args: argparse.Namespace, config: Config) -> Tuple[Tuple[nvml.GresGpu, ...], Any]:
    """(the GPUs gres.conf names, with Name=mps on the chosen ones; NVML's driver version)."""
    facts = nvml.nvml_facts(args.nvml_record)
    choice = nvml.parse_choice(args.mps_gpus) if args.mps_gpus is not None else mps_gpu_ids(config)
    return nvml.gres_gpus(facts, choice), facts.driver_version


def _read_file(path: str) -> str:
    """A config file's text; OSError if it cannot be read (a gres.conf Include's reader)."""
    data = read_small(path, 64 << 20, follow=True)  # slurm.conf may be a link
    if data is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    return data.decode("utf-8", "replace")


def _read(path: str) -> str:
    try:
        return _read_file(path)
    except OSError as e:
        raise Failure(f"{path}: cannot read: {e.strerror}") from None


def gres_conf(args: argparse.Namespace) -> int:
    config = load_config(args)
    try:
        gpus, driver = _gpus(args, config)
        count = mps_count(args, config)
    except (nvml.GpusError, ValueError) as e:
        raise Failure(str(e)) from None
    if not gpus:
        raise Failure("NVML sees no GPU on this node: nothing to write")
    node = args.node_name or node_name(config)
    text = render.render_gres_conf(gpus, node, driver, count, args.dev_dir, args.with_node_name)
    if not args.diff:
        sys.stdout.write(text)
        return ExitCode.OK
    path = args.gres_conf or settings(config).gres_conf or os.path.join(
        os.path.dirname(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF), "gres.conf")
    return _report_diff(render.diff_gres_conf(text, _read(path), node, path, _read_file),
                        f"{path} differs from NVML for {node}", f"{path} matches NVML for {node}")


def _report_diff(diff: str, differs: str, same: str) -> int:
    """A --diff's end: the unified diff and what is wrong (exit 1), or that it is right."""
    if diff:
        sys.stdout.write(diff)
        print(f"mps-health: {differs} (- installed, + expected)", file=sys.stderr)
        return ExitCode.DIFFERS
    print(same)
    return ExitCode.OK


HEALTH_CHECK = "mps-health-healthcheck"
# Where the README's "Install on a node" links the health check (the first), and where
# the RPM and the Debian package put it: slurm.conf names it there, as the README does.
LINK_DIRS = ("/usr/local/sbin", "/usr/sbin")


def health_check_default(link_dirs: Tuple[str, ...] = LINK_DIRS) -> Tuple[str, str]:
    """(HealthCheckProgram's path, a note when it is not the README's): the link to this
    installation's ``mps-health-healthcheck`` in the first of ``link_dirs`` that has one,
    else the script itself, beside this Python."""
    own = os.path.join(sysconfig.get_path("scripts"), HEALTH_CHECK)
    for where in link_dirs:
        linked = os.path.join(where, HEALTH_CHECK)
        with contextlib.suppress(OSError):
            if os.path.samefile(linked, own):
                return linked, ""
    return own, (f"{HEALTH_CHECK} of this installation is not linked into "
                 f"{' or '.join(link_dirs)} (README, Install on a node): its own path")


def conf(args: argparse.Namespace) -> int:
    if not 1 <= args.health_check_interval <= 86400:
        raise Failure("--health-check-interval must be between 1 and 86400 seconds")
    config = load_config(args)
    # Only the node's Gres= needs the GPUs: without NVML (the controller, a login node)
    # every other line is still written, and the missing one is named.
    try:
        count = mps_count(args, config)
        gpus, _ = _gpus(args, config)
        no_gpus = "" if gpus else "NVML sees no GPU on this node"
    except nvml.NvmlUnavailable as e:
        gpus, no_gpus = (), str(e).rstrip(".")
    except (nvml.GpusError, ValueError) as e:
        raise Failure(str(e)) from None
    if no_gpus:
        print(f"mps-health: note: {no_gpus}: the node's Gres= is left out", file=sys.stderr)
    node = args.node_name or node_name(config)
    program, note = (args.health_check_program, "") if args.health_check_program \
        else health_check_default()
    text = render.render_slurm_conf(gpus, node, count, config.mps.layout, args.prefix, program,
                                    args.health_check_interval, no_gpus, note)
    if not args.diff:
        sys.stdout.write(text)
        return ExitCode.OK
    path = args.slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF
    return _report_diff(render.diff_slurm_conf(text, _read(path), node, path),
                        f"{path} lacks settings mps-health needs",
                        f"{path} has every setting mps-health needs for {node}")


def install(args: argparse.Namespace) -> int:
    config = os.path.abspath(args.config) if args.config else None
    # The hooks would refuse a bad one at every job: say so now. Its layout says
    # whether Slurm needs our hooks at all.
    layout = load_config(args).mps.layout
    if not hooks_for(layout):
        return _no_hooks(args.prefix, layout)
    if args.dry_run:
        for w in plan(args.prefix, args.python, config):
            print(f"==> {w.path} (mode 0755)\n{w.text}")
        return ExitCode.OK
    try:
        scripts = write(args.prefix, args.python, config, args.force)
    except (InstallError, OSError) as e:
        raise Failure(f"install: {e}") from None
    for w in scripts:
        print(f"wrote {w.path}")
    print("slurm.conf (every node and the controller), then `scontrol reconfigure`:")
    sys.stdout.write(conf_lines(scripts))
    return ExitCode.OK


def _no_hooks(prefix: str, layout: str) -> int:
    """``slurm install`` for a layout whose daemons are the node's: nothing to write."""
    print(f"mps.layout is {layout}: its MPS daemons are the node's (systemd units), not the "
          "jobs', so Slurm needs no Prolog, TaskProlog or Epilog of mps-health: wrote nothing")
    for path in written_before(prefix):
        print(f"note: {path} is from an earlier `mps-health slurm install`: take its line out "
              "of slurm.conf (`scontrol reconfigure`), then remove it")
    program, note = health_check_default()
    print("slurm.conf (every node and the controller), then `scontrol reconfigure`: the "
          "lines of `mps-health slurm conf`, no hooks" + (f" ({note})" if note else ""))
    print(f"HealthCheckProgram={program}")
    return ExitCode.OK

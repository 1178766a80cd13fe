"""The full argparse interface of ``mps-health`` (``check``'s fast path skips it)."""

import argparse
import importlib
import os
from typing import NoReturn, Sequence

from . import __version__
from .cli import COMMANDS, UsageError


class Formatter(argparse.HelpFormatter):
    """Help at $COLUMNS (or 100) wide: argparse's own default imports shutil at start-up."""

    def __init__(self, prog: str) -> None:
        columns = os.environ.get("COLUMNS", "")
        super().__init__(prog, width=int(columns) if columns.isdigit() else 100)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} -h)")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="config file (default /etc/mps-health/config.yaml if it exists)")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="read every system path under DIR (fixture trees, containers)")


def build(argv: Sequence[str]) -> Parser:
    parser = Parser(prog="mps-health", description="Keep NVIDIA MPS healthy on Slurm GPU nodes.")
    parser.add_argument("-V", "--version", action="version", version=f"mps-health {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        if chosen in COMMANDS and name != chosen:
            continue  # only the chosen subcommand is built: each costs start-up time
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            p.set_defaults(handler=importlib.import_module(module).register(p))
    return parser

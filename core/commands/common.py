"""Helpers the subcommands share: loading the config, reporting a failure in one line."""

import sys
from typing import TYPE_CHECKING, List, Optional

from ..config import Config, ConfigError, load

EXIT_UNKNOWN = 3

if TYPE_CHECKING:
    import argparse


def fail(message: str, code: int = EXIT_UNKNOWN) -> int:
    print(f"mps-health: {message}", file=sys.stderr)
    return code


def load_config(args: "argparse.Namespace") -> Optional[Config]:
    """The config, or None after printing why it is bad (the caller exits 3)."""
    try:
        return load(getattr(args, "config", None))
    except ConfigError as e:
        fail(str(e))
        return None


def names(value: str) -> List[str]:
    """argparse type for 'a,b,c' lists."""
    return [n.strip() for n in value.split(",") if n.strip()]

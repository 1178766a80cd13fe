"""Exit codes, named once, and the one exception that carries an expected failure.

Every command exits with a Nagios code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). Commands
that act (remediate, unit, slurm --diff) read the same numbers as: 0 done or nothing to
do, 1 refused or differs (nothing changed), 2 acted but failed, 3 could not start (bad
config or arguments, not root, ...).
"""

from enum import IntEnum


class ExitCode(IntEnum):
    """The codes, ints to ``sys.exit``, Nagios and slurmd (an IntEnum is an int: JSON
    writes it as a number)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3
    # The same numbers, as commands that act read them.
    DONE = 0
    REFUSED = 1
    DIFFERS = 1
    FAILED = 2
    CANNOT = 3

    __str__ = int.__repr__  # "2", as from 3.11 on: not "ExitCode.CRITICAL" on 3.9 and 3.10


class Failure(Exception):
    """An expected failure: one line for the user and its exit code. The command edge
    prints it and exits with ``code``: library code never prints errors or exits itself."""

    def __init__(self, message: str, code: int = ExitCode.UNKNOWN) -> None:
        super().__init__(message)
        self.code = int(code)

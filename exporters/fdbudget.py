"""Open files: how many connections the exporter may hold and still leave room for the checks.

The checks run in the same process; connections are capped so that a flood can never take
the fds a check run needs: a run during an attack judges the node as it would without one.
"""

import os
import resource
from typing import NamedTuple

RESERVE_FDS = 256  # kept for the checks; a run uses well under 100 at once


class FdBudget(NamedTuple):
    cap: int  # connections the server may hold
    limit: int  # the soft RLIMIT_NOFILE it ran with (after raising it, if it could)


def connection_budget(wanted: int) -> FdBudget:
    """The cap that fits ``wanted`` connections, the reserve and the fds in use in the
    open-file limit. The soft limit is raised toward the hard one when it is too low
    (as Go programs do at start); the cap is lowered when even that is not enough.
    One more fd than the cap: a connection is accepted before the oldest is closed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64  # no /proc: a generous guess of what the interpreter holds
    need = wanted + 1 + RESERVE_FDS + in_use
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return FdBudget(wanted, -1)
    return FdBudget(max(0, min(wanted, soft - 1 - RESERVE_FDS - in_use)), soft)

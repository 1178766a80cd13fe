"""Fitting the control query inside a run's budget, for the monitoring outputs.

The engine stops waiting for a blocking source at the run's deadline. If the control
query's own timeout ends at (or after) that deadline, a wedged daemon is lost to the
deadline and reported as UNKNOWN facts-unavailable instead of CRITICAL control-wedged.
check_mps (-t) and the exporter (--interval) choose budgets that can be shorter than the
configured control.timeout_s, so they shorten the query to end a margin before it.
"""

from mps_health.config import Config

MARGIN_S = 0.3  # killing the client and collecting its answer, with room to spare


def within_budget(config: Config, budget_s: float) -> Config:
    """``config`` with control.timeout_s ending ``MARGIN_S`` before ``budget_s``."""
    limit = round(max(0.1, budget_s - MARGIN_S), 3)
    if config.control.timeout_s <= limit:
        return config
    return config._replace(control=config.control._replace(timeout_s=limit))

"""mps-health: health checks, monitoring and careful repair for NVIDIA MPS on Slurm nodes.

The repository root is the ``mps_health`` package: ``core/`` holds the engine, facts and
commands; ``checks/``, ``exporters/``, ``remediation/`` and ``slurm/`` sit beside it.
Every import inside the package is relative.
"""

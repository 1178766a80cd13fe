"""mps-health: health checks, monitoring and careful repair for NVIDIA MPS on Slurm nodes.

The repository root is the ``mps_health`` package; its folders are its layers (see
docs/DEVELOPING.md, "Layout"). Imports inside the package are absolute
(``from mps_health.model.facts import Facts``).
"""

__version__ = "0.1.0"

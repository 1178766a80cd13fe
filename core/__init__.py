"""mps-health: health checks, monitoring and careful repair for NVIDIA MPS on Slurm nodes."""

__version__ = "0.1.0"

"""Slurm integration: prolog/epilog helpers, gres.conf reading and rendering."""

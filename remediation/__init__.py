"""Careful repair: dry-run plan first, act on verified PIDs, never follow symlinks."""

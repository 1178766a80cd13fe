"""Remediation stage: careful repair of MPS instances (dry-run plan first, verified PIDs).

Nothing here runs on the plain check path; every action prints its plan, acts only
without --dry-run, goes through the node's remediation lock and the audit log.
"""

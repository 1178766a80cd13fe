"""Presentation stage: outputs only format a Report; they never probe or judge."""

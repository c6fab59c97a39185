"""Internals of the Spark integration (executor-side task, working copies)."""

"""The conformance suite (TCK) every dstl storage must pass, and its runner.

Lands with its issue.
"""

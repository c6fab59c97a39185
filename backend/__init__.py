"""The changelog keyed-state backend (engine-agnostic) and ``dstl.backend.spark``.

Lands with its issue.
"""

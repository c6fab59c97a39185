"""Local-disk changelog storage (identifier ``local``), the embedded default.

Lands with its issue; until then ``dstl.storage=local`` reports an unknown storage.
"""

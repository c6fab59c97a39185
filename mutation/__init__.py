"""Mutation testing of the conformance suite: ``python -m mutation.run`` (``make mutation``)."""

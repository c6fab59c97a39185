"""Helpers shared by the backend tests."""


def owns_key(backend, key) -> bool:
    """Whether ``key`` belongs to the backend's key groups (and make it current if so)."""
    try:
        backend.set_current_key(key)
    except ValueError:
        return False
    return True

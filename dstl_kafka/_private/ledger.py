"""Which offsets of a data partition this storage's producer wrote: fencing without a round trip.

Every claim also leaves a marker record in its log's data partition, produced
only after the claim is committed. So if every offset between the last one
accounted for and a persist's last record was written by this storage's own
producer, no marker, hence no claim, can have arrived in between, and the
persist needs no claims request at all. A foreign offset (another process's
records, a claim marker, a transaction marker) is a gap: only then do the claims
have to be asked for.
"""

from __future__ import annotations

import threading


class PartitionLedger:
    """Offsets of one data partition: those this storage wrote, and how far all are accounted for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Every claim whose marker sits at or below this offset is known to the claims tracker.
        self._covered = -1
        self._ours: set[int] = set()
        self._highest = -1
        # Ask for the claims while a persist's records are in flight: right after a gap
        # (foreign writers share the partition, another is likely), never in steady state.
        self.speculate = True

    def delivered(self, offset: int) -> None:
        """Record an offset this storage's producer wrote (called from delivery reports)."""
        with self._lock:
            if offset > self._covered:
                self._ours.add(offset)
            self._highest = max(self._highest, offset)

    @property
    def highest(self) -> int:
        """The greatest offset delivered to this storage so far (-1 before the first)."""
        return self._highest

    def follows(self, last: int) -> bool:
        """Whether every offset up to ``last`` is accounted for or was written here (advances)."""
        with self._lock:
            while self._covered + 1 in self._ours:
                self._covered += 1
                self._ours.discard(self._covered)
            return self._covered >= last

    def cover(self, upto: int) -> None:
        """Every claim with a marker at or below ``upto`` is now known to the claims tracker."""
        with self._lock:
            if upto > self._covered:
                self._covered = upto
                self._ours = {offset for offset in self._ours if offset > upto}

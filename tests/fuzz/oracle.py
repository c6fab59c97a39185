"""The fuzz oracle: only DstlError escapes, within bounded time and memory.

Each fuzz test runs its parser on many generated documents. A document may be
refused, but only with a :class:`~dstl.spi.DstlError`; any other exception is an
escape. Address space is capped while the fuzzers run, so an input that makes a
parser allocate gigabytes shows up as a ``MemoryError`` escape, not a slow test.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from hypothesis import HealthCheck, settings

from dstl.spi import DstlError

#: Documents per parser: 20,000 in CI; ``make fuzz`` runs ten times more.
EXAMPLES = int(os.environ.get("DSTL_FUZZ_EXAMPLES", "20000"))
#: Each document hypothesis draws is also parsed in this many cheap byte-level variants
#: (generation, not parsing, is what costs): the parsers see EXAMPLES documents in all.
VARIANTS = 10
#: Extra address space a parser may take while fuzzed.
MEMORY_HEADROOM = 1 << 30

FUZZ_SETTINGS = settings(
    max_examples=-(-EXAMPLES // VARIANTS),
    deadline=timedelta(seconds=5),
    database=None,
    derandomize=os.environ.get("DSTL_FUZZ_SEED") is None,
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Tally:
    """What one fuzzer saw: documents run, refused (DstlError) and accepted."""

    name: str
    runs: int = 0
    refused: int = 0
    accepted: int = 0
    escapes: list[str] = field(default_factory=list)

    def check(self, parse: Callable[[], object]) -> None:
        """Run ``parse()``, counting its outcome; anything but DstlError is an escape."""
        self.runs += 1
        try:
            parse()
        except DstlError:
            self.refused += 1
        except Exception as exc:
            self.escapes.append(f"{type(exc).__name__}: {exc}"[:300])
            raise
        else:
            self.accepted += 1

    def report(self) -> str:
        """One line for the test log and the closing note."""
        return (
            f"fuzz {self.name}: {self.runs} documents, {self.refused} refused with DstlError, "
            f"{self.accepted} accepted, {len(self.escapes)} escapes"
        )


def variants(document: bytes | str, seed: int, count: int = VARIANTS - 1) -> list[bytes]:
    """``count`` byte-level mutations of ``document`` (flips, cuts, duplicated runs), seeded."""
    import random

    rng = random.Random(seed)
    data = document.encode("utf-8", "surrogatepass") if isinstance(document, str) else bytes(document)
    out = []
    for _ in range(count):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            if not mutated:
                mutated += bytes([rng.randrange(256)])
                continue
            position = rng.randrange(len(mutated))
            kind = rng.randrange(4)
            if kind == 0:
                mutated[position] ^= 1 << rng.randrange(8)
            elif kind == 1:
                del mutated[position : position + rng.randint(1, 32)]
            elif kind == 2:
                mutated[position:position] = mutated[position : position + rng.randint(1, 32)]
            else:
                mutated[position] = rng.choice(b'{}[]",:0\\ ')
        out.append(bytes(mutated))
    return out


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@contextmanager
def bounded_memory() -> Iterator[None]:
    """Cap the address space at its current size plus :data:`MEMORY_HEADROOM`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_size() + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

"""The changelog paper's two workloads, run on the backend under one configuration.

- **value**: a ValueState per key; most records create a new key, the rest
  update a random existing one (state grows all run).
- **window**: processing-time sliding windows; every record is counted in each
  of the ``window / slide`` windows that contain its time, and windows are purged
  as time passes them (lots of state created and removed).

A configuration is a storage for the log plus a checkpoint mode: ``changelog``
(persist the log; materialize in the background when the log outgrows a share of
the state, ``state.changelog.materialization.max-log-ratio``), ``full``
or ``incremental`` (changelog off: every checkpoint is a snapshot).
"""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import restore_probe
from bench.checkpointing import entry_count, take_checkpoint
from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)
PAYLOAD = "x" * 48


@dataclass(frozen=True)
class Preset:
    """Sizes of one run: records per checkpoint, checkpoints, window length/slide (in checkpoints)."""

    records_per_checkpoint: int
    checkpoints: int
    max_log_ratio: float = 0.1  # changelog: materialize when the log exceeds this share of the state
    squash_updates: bool = True  # changelog, workloads that update keys often (window): see Workload.squashes
    new_key_share: float = 0.8
    window_keys: int = 2000
    window: int = 10
    slide: int = 2
    recovery_repeat: int = 3  # fresh-process restores per configuration (the median is reported)


PRESETS = {
    "small": Preset(records_per_checkpoint=2_000, checkpoints=20, window_keys=500, recovery_repeat=1),
    "medium": Preset(records_per_checkpoint=12_500, checkpoints=40, window_keys=2000),
    "large": Preset(records_per_checkpoint=62_500, checkpoints=20, window_keys=5000),
}


@dataclass
class RunResult:
    """What one workload under one configuration measured."""

    workload: str
    configuration: str
    durations_ms: list[float] = field(default_factory=list)
    checkpointed: list[int] = field(default_factory=list)
    full_sizes: list[int] = field(default_factory=list)
    recovery_s: float = 0.0
    records_per_s: float = 0.0
    state_entries: int = 0
    state_bytes: int = 0  # a full snapshot of the final state: the "size of the state"
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)  # min-max over repeats


class ValueWorkload:
    """Mostly new keys, ValueState."""

    name = "value"
    # Squashing keeps a key's last update back until the checkpoint; with mostly new keys there
    # is nothing to squash and the appends would only move into the checkpoint's duration.
    squashes = False

    def __init__(self, preset: Preset) -> None:
        self.preset = preset
        self.rng = random.Random(1)
        self.next_key = 0

    def register(self, backend: ChangelogKeyedStateBackend) -> None:
        """Register the state."""
        self.state = backend.value_state("value")

    def run_interval(self, backend: ChangelogKeyedStateBackend, interval: int) -> int:
        """Process one checkpoint interval's records; returns how many."""
        for _ in range(self.preset.records_per_checkpoint):
            if self.next_key == 0 or self.rng.random() < self.preset.new_key_share:
                key = self.next_key
                self.next_key += 1
            else:
                key = self.rng.randrange(self.next_key)
            backend.set_current_key(key)
            self.state.update(f"{PAYLOAD}{interval}")
        return self.preset.records_per_checkpoint


class WindowWorkload:
    """Processing-time sliding windows counting records per key (each record in several windows)."""

    name = "window"
    squashes = True  # a record adds to window/slide counts: the same keys, many times per interval

    def __init__(self, preset: Preset) -> None:
        self.preset = preset
        self.rng = random.Random(2)
        self.open: dict[int, set[int]] = defaultdict(set)  # window start -> keys with state (the timers)

    def register(self, backend: ChangelogKeyedStateBackend) -> None:
        """Register the state: one count per (key, window)."""
        self.count = backend.reducing_state("count", lambda a, b: a + b)

    def run_interval(self, backend: ChangelogKeyedStateBackend, now: int) -> int:
        """Records at time ``now``; then fire and purge the windows that ended."""
        window, slide = self.preset.window, self.preset.slide
        starts = [s for s in range(now - window + 1, now + 1) if s >= 0 and s % slide == 0]
        per_interval = self.preset.records_per_checkpoint // 4  # each record touches window/slide windows
        for _ in range(per_interval):
            key = self.rng.randrange(self.preset.window_keys)
            for start in starts:
                backend.set_current_key((key, start))
                self.count.add(1)
                self.open[start].add(key)
        for start in [s for s in self.open if s + window <= now + 1]:
            for key in self.open.pop(start):
                backend.set_current_key((key, start))
                self.count.clear()
        return per_interval


WORKLOADS: dict[str, Callable[[Preset], Any]] = {"value": ValueWorkload, "window": WindowWorkload}


def run(
    workload_name: str,
    configuration: str,
    storage_config: dict[str, str],
    snapshot_dir: str,
    preset: Preset,
    workdir: Path,
    progress: Callable[[], None] = lambda: None,
) -> RunResult:
    """Run ``workload_name`` under ``configuration`` (``changelog-*``, ``full`` or ``incremental``)."""
    mode = configuration.split("-", 1)[0]
    result = RunResult(workload_name, configuration)
    workload = WORKLOADS[workload_name](preset)
    job = f"paper-{uuid.uuid4().hex[:8]}"
    full_every = {"changelog": 5, "full": 1, "incremental": 10**6}[mode]
    with load_storage(storage_config, job_id=job) as storage:
        backend = ChangelogKeyedStateBackend(
            storage,
            "op",
            ALL,
            snapshot_dir=snapshot_dir,
            full_materialization_every=full_every,
            max_log_ratio=preset.max_log_ratio if mode == "changelog" else 0.0,
            squash_updates=preset.squash_updates and workload.squashes and mode == "changelog",
        )
        workload.register(backend)
        processing = 0.0
        records = 0
        snapshot: BackendSnapshot | None = None
        for checkpoint_id in range(1, preset.checkpoints + 1):
            began = time.perf_counter()
            records += workload.run_interval(backend, checkpoint_id)
            processing += time.perf_counter() - began
            if mode == "changelog":
                # The materialization trigger runs on the task thread like a timer, before the
                # checkpoint: its synchronous part counts in records/s, not in checkpoint duration.
                began = time.perf_counter()
                backend.maybe_materialize()
                processing += time.perf_counter() - began
            figures = take_checkpoint(backend, checkpoint_id, mode)
            snapshot, elapsed = figures.snapshot, figures.seconds
            result.checkpointed.append(figures.checkpointed)
            result.full_sizes.append(figures.full_size)
            processing += elapsed
            result.durations_ms.append(elapsed * 1000)
            progress()
        result.records_per_s = records / processing
        backend.materializer.close()
        result.state_entries = entry_count(backend.delegate)
        backend.close()
        assert snapshot is not None
        # Recovery: fresh processes restore the last checkpoint from the storages (median); the
        # first also writes the restored state as one full snapshot: the size of the state.
        restored = restore_probe.measure(
            snapshot, storage_config, snapshot_dir, ALL, workdir, job_id=job, repeat=preset.recovery_repeat
        )
        if restored.entries != result.state_entries:
            msg = f"{configuration}: a fresh process restored {restored.entries}, not {result.state_entries}"
            raise AssertionError(msg)
        result.recovery_s, result.state_bytes = restored.seconds, restored.state_bytes
    return result

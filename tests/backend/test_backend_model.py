"""Property test: the backend against a model, with checkpoints, materializations and crashes.

Random state operations over several states and keys are interleaved with
checkpoints (completed by the coordinator), materializations that succeed or
fail, confirmations and crashes (the backend dropped without close, the
coordinator recovered from its directory). After each crash the restored state
must equal the model's state at the latest completed checkpoint, exactly.
"""

from __future__ import annotations

import copy
import itertools
import operator
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from dstl.backend import CheckpointCoordinator
from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, StorageError, load_storage

KEY_VALUES = ["alice", "bob", "carol", 7, 42, ("eu", 3)]
KEYS = st.sampled_from(KEY_VALUES)
MAP_KEYS = st.sampled_from(["a", "b", "c"])
VALUES = st.integers(-5, 5)


class _FailingFilesystem:
    """Stands in for the snapshot filesystem: every write fails (a materialization failure)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def pipe_file(self, *args, **kwargs):
        raise OSError("injected: snapshot store unavailable")


class BackendModel(RuleBasedStateMachine):
    """Backend ops vs a dict model; crash = restore the latest completed checkpoint."""

    def __init__(self, config: dict, workdir):
        super().__init__()
        self.config = config
        self.snapshots = (workdir / f"chk-{uuid.uuid4().hex}").as_uri()
        self.job = f"model-{uuid.uuid4().hex[:8]}"
        self.storage = load_storage(config, job_id=self.job)
        self.epochs = itertools.count()
        self.model: dict[tuple, object] = {}
        self.completed_models: dict[int, dict] = {}
        self.next_checkpoint = 1
        self.coordinator = CheckpointCoordinator(self.snapshots, self.job, num_retained=2, config=config)
        self.backend = self._new_backend()

    def _new_backend(self) -> ChangelogKeyedStateBackend:
        backend = ChangelogKeyedStateBackend(
            self.storage,
            "op",
            KeyGroupRange(0, 128),
            epoch=next(self.epochs),
            snapshot_dir=self.snapshots,
            max_failures_allowed=1000,
            full_materialization_every=3,
        )
        self.value = backend.value_state("value")
        self.items = backend.list_state("items")
        self.counts = backend.map_state("counts")
        self.total = backend.reducing_state("total", operator.add)
        return backend

    @initialize()
    def start(self):
        pass

    # -- state operations ------------------------------------------------------------------------
    @rule(key=KEYS, value=VALUES)
    def put_value(self, key, value):
        self.backend.set_current_key(key)
        self.value.update(value)
        self.model[("value", key)] = value

    @rule(key=KEYS)
    def clear_value(self, key):
        self.backend.set_current_key(key)
        self.value.clear()
        self.model.pop(("value", key), None)

    @rule(key=KEYS, value=VALUES)
    def add_item(self, key, value):
        self.backend.set_current_key(key)
        self.items.add(value)
        self.model[("items", key)] = [*self.model.get(("items", key), []), value]

    @rule(key=KEYS)
    def keep_last_item(self, key):
        self.backend.set_current_key(key)
        last = self.items.get()[-1:]
        self.items.update(last)
        if last:
            self.model[("items", key)] = last
        else:
            self.model.pop(("items", key), None)

    @rule(key=KEYS, map_key=MAP_KEYS, value=VALUES)
    def put_count(self, key, map_key, value):
        self.backend.set_current_key(key)
        self.counts.put(map_key, value)
        self.model[("counts", key)] = {**self.model.get(("counts", key), {}), map_key: value}

    @rule(key=KEYS, map_key=MAP_KEYS)
    def remove_count(self, key, map_key):
        self.backend.set_current_key(key)
        self.counts.remove(map_key)
        entry = {k: v for k, v in self.model.get(("counts", key), {}).items() if k != map_key}
        if entry:
            self.model[("counts", key)] = entry
        else:
            self.model.pop(("counts", key), None)

    @rule(key=KEYS, value=VALUES)
    def add_total(self, key, value):
        self.backend.set_current_key(key)
        self.total.add(value)
        self.model[("total", key)] = self.model.get(("total", key), 0) + value

    # -- checkpoints, materialization, crashes ------------------------------------------------------
    @rule()
    def checkpoint(self):
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        snapshot = self.backend.checkpoint(checkpoint_id).result(timeout=60)
        self.coordinator.complete(checkpoint_id, {"op": snapshot})
        self.completed_models[checkpoint_id] = copy.deepcopy(self.model)

    @rule()
    def confirm_latest(self):
        latest = self.coordinator.latest()
        if latest is not None:
            self.backend.notify_checkpoint_complete(latest.snapshots["op"])

    @rule(fail=st.booleans())
    def materialize(self, fail):
        materializer = self.backend.materializer
        materializer._filesystem()
        real = materializer._fs
        if fail:
            materializer._fs = _FailingFilesystem(real)
        try:
            future = self.backend.materialize()
            if fail:
                with pytest.raises(StorageError, match="injected"):
                    future.result(timeout=60)
            else:
                future.result(timeout=60)
        finally:
            materializer._fs = real

    @rule()
    def crash_and_restore(self):
        self.backend = None  # dropped, never closed
        self.coordinator = CheckpointCoordinator(self.snapshots, self.job, num_retained=2, config=self.config)
        latest = self.coordinator.recover()
        self.backend = self._new_backend()
        if latest is None:
            self.model = {}
        else:
            self.backend.restore(latest.snapshots["op"], self.config)
            self.model = copy.deepcopy(self.completed_models[latest.checkpoint_id])
        self.assert_state_equals_model()

    @invariant()
    def state_equals_model(self):
        self.assert_state_equals_model()

    def assert_state_equals_model(self):
        actual = {}
        for key in KEY_VALUES:
            self.backend.set_current_key(key)
            for name, value in (
                ("value", self.value.value()),
                ("items", self.items.get() or None),
                ("counts", dict(self.counts.items()) or None),
                ("total", self.total.get()),
            ):
                if value is not None:
                    actual[(name, key)] = value
        assert actual == self.model

    def teardown(self):
        if self.backend is not None:
            self.backend.close()
        self.storage.close()


SETTINGS = settings(
    max_examples=12,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_restore_equals_model_at_latest_checkpoint(storage_config, tmp_path):
    run_state_machine_as_test(lambda: BackendModel(storage_config, tmp_path), settings=SETTINGS)


def test_restore_equals_model_on_service_storages(service_storage_config, tmp_path):
    run_state_machine_as_test(
        lambda: BackendModel(service_storage_config, tmp_path),
        settings=settings(SETTINGS, max_examples=4, stateful_step_count=30),
    )

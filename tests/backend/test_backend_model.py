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
from tests.backend.helpers import failing_snapshot_store

KEY_VALUES = ["alice", "bob", "carol", 7, 42, ("eu", 3)]
KEYS = st.sampled_from(KEY_VALUES)
MAP_KEYS = st.sampled_from(["a", "b", "c"])
VALUES = st.integers(-5, 5)
OPERATIONS = [
    "put_value",
    "clear_value",
    "add_item",
    "keep_last_item",
    "put_count",
    "remove_count",
    "add_total",
]


class BackendModel(RuleBasedStateMachine):
    """Backend ops vs a dict model; crash = restore the latest completed checkpoint."""

    def __init__(self, config: dict, workdir, squash: bool = False):
        super().__init__()
        self.config = config
        self.squash = squash
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
            squash_updates=self.squash,
        )
        self.value = backend.value_state("value")
        self.items = backend.list_state("items")
        self.counts = backend.map_state("counts")
        self.total = backend.reducing_state("total", operator.add)
        return backend

    @initialize()
    def start(self):
        pass

    # -- state operations (a few per step, so that sequences reach checkpoints and crashes) -----
    @rule(
        operations=st.lists(
            st.tuples(st.sampled_from(OPERATIONS), KEYS, MAP_KEYS, VALUES), min_size=1, max_size=4
        )
    )
    def mutate(self, operations):
        for name, key, map_key, value in operations:
            self.backend.set_current_key(key)
            getattr(self, f"_{name}")(key, map_key, value)

    def _put_value(self, key, map_key, value):
        self.value.update(value)
        self.model[("value", key)] = value

    def _clear_value(self, key, map_key, value):
        self.value.clear()
        self.model.pop(("value", key), None)

    def _add_item(self, key, map_key, value):
        self.items.add(value)
        self.model[("items", key)] = [*self.model.get(("items", key), []), value]

    def _keep_last_item(self, key, map_key, value):
        last = self.items.get()[-1:]
        self.items.update(last)
        self._set_or_drop(("items", key), last)

    def _put_count(self, key, map_key, value):
        self.counts.put(map_key, value)
        self.model[("counts", key)] = {**self.model.get(("counts", key), {}), map_key: value}

    def _remove_count(self, key, map_key, value):
        self.counts.remove(map_key)
        entry = self.model.get(("counts", key), {})
        self._set_or_drop(("counts", key), {k: v for k, v in entry.items() if k != map_key})

    def _add_total(self, key, map_key, value):
        self.total.add(value)
        self.model[("total", key)] = self.model.get(("total", key), 0) + value

    def _set_or_drop(self, model_key, value):
        if value:
            self.model[model_key] = value
        else:
            self.model.pop(model_key, None)

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
        if fail:
            with failing_snapshot_store(self.backend), pytest.raises(StorageError, match="injected"):
                self.backend.materialize().result(timeout=60)
        else:
            self.backend.materialize().result(timeout=60)

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
    max_examples=20,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("squash", [False, True], ids=["log-every-update", "squash-updates"])
def test_restore_equals_model_at_latest_checkpoint(storage_config, tmp_path, squash):
    run_state_machine_as_test(lambda: BackendModel(storage_config, tmp_path, squash), settings=SETTINGS)


def test_restore_equals_model_on_service_storages(service_storage_config, tmp_path):
    run_state_machine_as_test(
        lambda: BackendModel(service_storage_config, tmp_path),
        settings=settings(SETTINGS, max_examples=4, stateful_step_count=30),
    )

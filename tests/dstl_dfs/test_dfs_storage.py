"""filesystem storage specifics: batching, hedging, retries, back-pressure, cache, S3."""

import json
import logging
import os
import threading
import time

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.dfs.testing import free_port
from dstl.spi import ChangelogHandle, Config, CorruptedError, KeyGroupRange, StorageError, load_storage

KG = KeyGroupRange(0, 8)


@pytest.fixture
def file_config(tmp_path):
    return {"dstl.storage": "filesystem", "dstl.dfs.base-path": (tmp_path / "dfs").as_uri()}


def test_writers_persisting_together_share_one_object(file_config):
    with load_storage({**file_config, "dstl.dfs.batch.persist-delay": "50ms"}, job_id="job") as storage:
        writers = [storage.create_writer(f"op{n}", KG) for n in range(10)]
        for n, writer in enumerate(writers):
            writer.append(n % 8, f"w{n}".encode())
        futures = [w.persist(0, 1) for w in writers]  # all within a few ms
        handles = [f.result(timeout=30) for f in futures]
        assert len(storage.list_objects()) == 1
        assert len({h.location_dicts[0]["object"] for h in handles}) == 1
        for n, handle in enumerate(handles):
            assert read_data(storage, handle) == [f"w{n}".encode()]


def test_size_threshold_drains_without_waiting_for_the_delay(file_config):
    config = {
        **file_config,
        "dstl.dfs.batch.persist-delay": "10s",
        "dstl.dfs.batch.persist-size-threshold": "1kb",
    }
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, os.urandom(2048))  # incompressible: stored as 2 KB, over the threshold
        started = time.monotonic()
        persist(writer, 0, 1, timeout=5)
        assert time.monotonic() - started < 2


def test_preemptive_upload_before_the_checkpoint(file_config):
    config = {**file_config, "dstl.dfs.preemptive-persist-threshold": "10kb"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        for _ in range(30):
            writer.append(0, b"p" * 1000)
        deadline = time.monotonic() + 5
        while storage.metrics.counter("uploads") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert storage.metrics.counter("preemptive_uploads") >= 1
        handle = persist(writer, 0, 1)
        assert handle.size == 30_000
        assert handle.incremental_size < handle.size, "the persist re-uploaded what was uploaded ahead"
        assert read_data(storage, handle) == [b"p" * 1000] * 30


def test_compression_round_trip_and_smaller_objects(tmp_path):
    sizes = {}
    for compressed in (False, True):
        config = {
            "dstl.storage": "filesystem",
            "dstl.dfs.base-path": (tmp_path / str(compressed)).as_uri(),
            "dstl.changelog.compression": "zstd" if compressed else "none",
        }
        with load_storage(config, job_id="job") as storage:
            writer = storage.create_writer("op", KG)
            for i in range(100):
                writer.append(i % 8, b"compressible " * 20)
            handle = persist(writer, 0, 1)
            assert read_data(storage, handle) == [b"compressible " * 20] * 100
            sizes[compressed] = storage.metrics.counter("uploaded_bytes")
    assert sizes[True] < sizes[False] / 5


def test_truncated_object_is_corrupted_error(file_config, tmp_path):
    with load_storage(file_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"a" * 500)
        handle = persist(writer, 0, 1)
    path = tmp_path / "dfs" / handle.location_dicts[0]["object"]
    path.write_bytes(path.read_bytes()[:-100])
    with load_storage(file_config, job_id="job") as fresh, pytest.raises(CorruptedError):
        read_data(fresh, handle)


def test_concurrent_readers_download_an_object_once(file_config):
    with load_storage(file_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        for i in range(50):
            writer.append(i % 8, b"r" * 100)
        handle = persist(writer, 0, 1)
    with load_storage(file_config, job_id="job") as fresh:
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(read_data(fresh, handle))) for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 8 and all(r == results[0] for r in results)
        assert fresh.metrics.counter("downloads") == 1


def test_discard_deletes_an_object_only_when_all_its_change_sets_are_discarded(file_config):
    with load_storage({**file_config, "dstl.dfs.batch.persist-delay": "50ms"}, job_id="job") as storage:
        a, b = storage.create_writer("a", KG), storage.create_writer("b", KG)
        a.append(0, b"a")
        b.append(0, b"b")
        handle_a, handle_b = (f.result(timeout=30) for f in [a.persist(0, 1), b.persist(0, 1)])
        a.close()
        b.close()
    with load_storage(
        file_config, job_id="job"
    ) as driver:  # another process's view: index read from the object
        driver.discard([handle_a])
        assert len(driver.list_objects()) == 1
        assert read_data(driver, handle_b) == [b"b"]
        driver.discard([handle_b])
        assert driver.list_objects() == []


# -- S3 (moto) -------------------------------------------------------------------------------------


def test_s3_round_trip_and_conditional_epoch_markers(s3_config):
    with load_storage(s3_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG, epoch=3)
        writer.append(1, b"on s3")
        handle = persist(writer, 0, 1)
        markers = storage.markers.list(f"{storage.job_id}/epochs/")
        assert len(markers) == 1 and markers[0].split("/")[-1].startswith(f"{3:020d}-")
        from dstl.dfs._private.object_store import ObjectExistsError

        with pytest.raises(ObjectExistsError):
            storage.markers.put_new(markers[0], b"")  # If-None-Match: * refuses an overwrite
    with load_storage(s3_config, job_id="other") as fresh:
        assert read_data(fresh, ChangelogHandle.from_json(handle.to_json())) == [b"on s3"]


def test_s3_through_s3fs_when_fast_path_is_off(s3_config):
    with load_storage({**s3_config, "dstl.dfs.s3.fast-path": "false"}, job_id="job") as storage:
        from dstl.dfs._private.object_store import FsspecStore, S3Store

        assert isinstance(storage.store, FsspecStore) and isinstance(storage.markers, S3Store)
        writer = storage.create_writer("op", KG)
        writer.append(1, b"via s3fs")
        assert read_data(storage, persist(writer, 0, 1)) == [b"via s3fs"]


def test_unreachable_endpoint_fails_within_timeout_times_attempts(s3_config):
    config = {
        **s3_config,
        "dstl.dfs.s3.endpoint-url": f"http://127.0.0.1:{free_port()}",
        "dstl.dfs.upload.timeout": "300ms",
        "dstl.dfs.upload.next-attempt-delay": "20ms",
    }
    started = time.monotonic()
    with pytest.raises(StorageError), load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x")
        writer.persist(0, 1).result(timeout=30)
    assert time.monotonic() - started <= 0.3 * 3 + 1.0


def test_hedging_races_a_stalled_put_and_deletes_the_loser(s3_endpoint, s3_config, s3_proxy_factory):
    proxy = s3_proxy_factory(stall_seconds=1.5)
    config = {**s3_config, "dstl.dfs.s3.endpoint-url": proxy.url, "dstl.dfs.upload.timeout": "200ms"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"first")
        persist(writer, 0, 1)
        proxy.stall_next = 1  # the first attempt stalls; its hedge goes through
        writer.append(0, b"hedged")
        started = time.monotonic()
        handle = persist(writer, 0, 2, timeout=30)
        elapsed = time.monotonic() - started
        assert storage.metrics.counter("upload_hedges") >= 1
        assert elapsed < 1.5 + 0.5, elapsed
        assert read_data(storage, handle) == [b"first", b"hedged"]
        time.sleep(2.0)  # let the losing attempts land
        assert storage.metrics.counter("hedge_losers_deleted") >= 1
        keys = {loc["object"] for loc in handle.location_dicts}
        assert set(storage.list_objects()) == keys, "a losing attempt's object was left behind"


def test_failed_puts_are_retried(s3_config, s3_proxy_factory):
    proxy = s3_proxy_factory(fail_fraction=0.5, seed=3)
    config = {
        **s3_config,
        "dstl.dfs.s3.endpoint-url": proxy.url,
        "dstl.dfs.upload.next-attempt-delay": "10ms",
    }
    proxy.fail_fraction = 0.0
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        proxy.fail_fraction = 0.5
        for round_ in range(10):
            writer.append(0, f"r{round_}".encode())
            persist(writer, 0, round_ + 1)
        assert proxy.failed >= 1 and storage.metrics.counter("upload_failures") >= 1
        proxy.fail_fraction = 1.0
        writer.append(0, b"doomed")
        with pytest.raises(StorageError, match="3 attempt"):
            persist(writer, 0, 99)


def test_backpressure_blocks_and_recovers(s3_config, s3_proxy_factory):
    proxy = s3_proxy_factory()
    config = {
        **s3_config,
        "dstl.dfs.s3.endpoint-url": proxy.url,
        "dstl.dfs.upload.max-in-flight": "4kb",
        "dstl.dfs.upload.retry-policy": "none",
    }
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        proxy.stall_fraction, proxy.stall_seconds = 1.0, 1.0
        writer.append(0, os.urandom(8000))  # incompressible: more than the 4 KB in flight
        slow = writer.persist(0, 1)
        time.sleep(0.2)
        assert not storage.available()
        assert storage.wait_available(timeout=0.1) is False
        proxy.stall_fraction = 0.0
        slow.result(timeout=10)
        assert storage.wait_available(timeout=5) is True and storage.available()


def test_secrets_are_never_logged(s3_config, caplog):
    caplog.set_level(logging.DEBUG)
    config = {**s3_config, "dstl.dfs.s3.secret-access-key": "sUp3r-s3cret-value"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x")
        persist(writer, 0, 1)
    assert "sUp3r-s3cret-value" not in repr(Config(config))
    assert "sUp3r-s3cret-value" not in caplog.text
    assert "PUT /" in caplog.text or storage.metrics.counter("uploads") == 1  # the run did log and upload


def test_download_cache_expires_idle_objects_and_bounds_its_size(file_config):
    from dstl.dfs._private.cache import DownloadCache
    from dstl.spi import StorageMetrics

    with load_storage(file_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x" * 1000)
        handle = persist(writer, 0, 1)
        key = handle.location_dicts[0]["object"]
        metrics = StorageMetrics()
        expiring = DownloadCache(storage.store.get, idle_timeout=0.0, max_bytes=1 << 20, metrics=metrics)
        for _ in range(2):
            expiring.acquire(key)
            expiring.release(key)
            time.sleep(0.01)
        assert metrics.counter("downloads") == 2, "an idle object past its timeout must be downloaded again"
        small = DownloadCache(storage.store.get, idle_timeout=3600, max_bytes=10, metrics=metrics)
        small.acquire(key)
        small.release(key)
        assert metrics.gauges()["download_cache_bytes"] == 0, "an object above max_bytes must not stay cached"
        keeping = DownloadCache(
            storage.store.get, idle_timeout=3600, max_bytes=1 << 20, metrics=StorageMetrics()
        )
        for _ in range(3):
            keeping.acquire(key)
            keeping.release(key)
        assert keeping._metrics.counter("downloads") == 1


@pytest.mark.parametrize("fast_path", ["true", "false"])
@pytest.mark.parametrize("fault", ["flip", "truncate", "reset", "fail", "stall"])
def test_damaged_failed_or_stalled_gets_are_retried_and_only_dstl_errors_escape(
    s3_config, s3_proxy_factory, fast_path, fault
):
    proxy = s3_proxy_factory(stall_seconds=3.0)
    config = {
        **s3_config,
        "dstl.dfs.s3.endpoint-url": proxy.url,
        "dstl.dfs.s3.fast-path": fast_path,
        "dstl.dfs.download.timeout": "1s",
    }
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"z" * 5000)
        handle = persist(writer, 0, 1)
    with load_storage(config, job_id="job") as reader:  # an empty download cache
        proxy.get_faults = [fault]
        started = time.monotonic()
        assert read_data(reader, handle) == [b"z" * 5000]
        assert time.monotonic() - started < 2.5
        assert not proxy.get_faults, "the fault was not injected"
        # (aiohttp itself retries a GET on a reset connection: the s3fs path may not need dstl's retry)
        assert reader.metrics.counter("read_retries") >= 1 or (fault == "reset" and fast_path == "false")
        proxy.get_faults = [fault] * 10  # every attempt fails: a clear, retriable StorageError
        reader.cache.clear()
        with pytest.raises(StorageError) as info:
            read_data(reader, handle)
        assert info.value.retriable and "after 3 attempt(s)" in str(info.value)


def test_every_get_stalled_fails_within_the_read_bound(s3_config, s3_proxy_factory):
    proxy = s3_proxy_factory(stall_seconds=30.0)
    config = {
        **s3_config,
        "dstl.dfs.s3.endpoint-url": proxy.url,
        "dstl.dfs.s3.fast-path": "false",
        "dstl.dfs.download.timeout": "500ms",
    }
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x")
        handle = persist(writer, 0, 1)
        storage.cache.clear()
        proxy.stall_gets = True
        started = time.monotonic()
        with pytest.raises(StorageError, match="took longer than"):
            read_data(storage, handle)
        assert time.monotonic() - started < 3 * 0.5 + 1.0
        proxy.stall_gets = False


@pytest.mark.parametrize("where", ["file", "s3"])
def test_epoch_markers_stay_bounded_under_writer_churn(file_config, s3_config, where):
    config = file_config if where == "file" else s3_config
    with load_storage(config, job_id="job") as storage:
        handles = []
        for epoch in range(1, 201):
            for instance in range(2):  # two instances, a new writer epoch per batch, as Spark does
                writer = storage.create_writer(f"op{instance}", KG, epoch=epoch)
                writer.append(0, f"batch {epoch}".encode())
                handles.append(persist(writer, 0, epoch))
                writer.close()
            storage.discard(handles[:-2])
            handles = handles[-2:]
        markers = storage.markers.list(f"{storage.job_id}/epochs/")
        assert len(markers) == 2, markers
        assert len(storage.list_objects()) <= 2
        assert read_data(storage, handles[-1]) == [b"batch 200"]


def test_fsspec_path_puts_are_not_serialized_so_a_hedge_can_win(tmp_path, monkeypatch):
    """On memory:// (the fsspec path) a stalled put must not hold up its hedge."""
    import uuid

    from fsspec.implementations.memory import MemoryFileSystem

    real_pipe = MemoryFileSystem.pipe_file
    stalled = threading.Event()

    def slow_first_data_put(self, path, value, mode="overwrite", **kwargs):
        if "/data/" in path and not stalled.is_set():
            stalled.set()
            time.sleep(2.0)
        return real_pipe(self, path, value, mode=mode, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", slow_first_data_put)
    config = {
        "dstl.storage": "filesystem",
        "dstl.dfs.base-path": f"memory://dstl-{uuid.uuid4().hex}",
        "dstl.dfs.upload.timeout": "200ms",
    }
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"hedged")
        started = time.monotonic()
        handle = persist(writer, 0, 1, timeout=30)
        assert time.monotonic() - started < 1.5, "the hedge waited behind the stalled attempt"
        assert storage.metrics.counter("upload_hedges") >= 1
        assert read_data(storage, handle) == [b"hedged"]


def test_storage_options_pass_through_to_fsspec(tmp_path):
    """dstl.dfs.storage-options.* (also under Flink's state.changelog.dstl.dfs.*) reach the file system."""
    from dstl.dfs._private.object_store import open_store

    for key in ("dstl.dfs.storage-options.auto_mkdir", "state.changelog.dstl.dfs.storage-options.auto_mkdir"):
        config = Config({"dstl.dfs.base-path": tmp_path.as_uri(), key: "true"})
        store = open_store(config)
        assert store.fs.auto_mkdir is True, key


@pytest.mark.parametrize("fast_path", ["true", "false"])
def test_orphan_age_is_measured_by_the_stores_clock_not_the_writers(s3_config, monkeypatch, fast_path):
    import dstl.dfs._private.storage as dfs_storage

    with load_storage({**s3_config, "dstl.dfs.s3.fast-path": fast_path}, job_id="job") as storage:
        old = storage.create_writer("old", KG)
        old.append(0, b"failed attempt, long ago")
        orphan = persist(old, 0, 1)
        old.close()
        time.sleep(3.2)  # S3 dates objects to the second: older than the 2 s grace however it rounds
        # A writer whose clock runs an hour behind stamps its object key an hour old.
        behind = time.time_ns() - 3_600 * 10**9
        monkeypatch.setattr(dfs_storage.time, "time_ns", lambda: behind)
        late = storage.create_writer("late", KG)
        late.append(0, b"in flight: its checkpoint is not complete yet")
        in_flight = persist(late, 0, 1)
        monkeypatch.undo()
        assert storage.collect_orphans([], older_than=time.time() - 2.0) == 1
        assert read_data(storage, in_flight) == [b"in flight: its checkpoint is not complete yet"]
        with pytest.raises(StorageError):
            read_data(storage, orphan)
        assert storage.longest_upload == pytest.approx(1.0 * 3 + 0.5 * 2)


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_handle_naming_another_logs_or_jobs_change_set_frees_nothing(file_config, s3_config, where):
    from dstl.spi import InvalidHandleError

    config = {"file": file_config, "s3": s3_config}[where]
    with load_storage(config, job_id="job") as storage, load_storage(config, job_id="other") as other:
        victim, thief = storage.create_writer("victim", KG), storage.create_writer("thief", KG)
        victim.append(0, b"live data of another log")
        thief.append(1, b"the thief's own")
        live = persist(victim, 0, 1)
        own = persist(thief, 0, 1)
        foreign = other.create_writer("victim", KG)
        foreign.append(0, b"another job's live data")
        foreign_live = persist(foreign, 0, 1)

        def forged(handle, **changes):
            doc = json.loads(handle.to_json())
            doc.update(changes)
            return ChangelogHandle.from_json(json.dumps(doc))

        with load_storage(config, job_id="job") as fresh:  # objects it did not upload: read from the store
            for discarding in (storage, fresh):
                discarding.discard([forged(live, log_id="thief.kg0-8")])  # the thief names the victim's spot
                discarding.discard([forged(live, epoch=live.epoch + 1)])
                with pytest.raises(InvalidHandleError, match="does not belong to job 'job'"):
                    discarding.discard([forged(live, locations=foreign_live.location_dicts)])
                assert read_data(discarding, live) == [b"live data of another log"]
                assert discarding.metrics.counter("refused_discards") == 2
        assert read_data(other, foreign_live) == [b"another job's live data"]
        victim.close()
        thief.close()  # open writers pin what they may reuse
        storage.discard([live, own])  # the real handles still free their object
        with pytest.raises(StorageError):
            read_data(storage, live)


def test_reading_through_a_closed_storage_is_a_closed_error(file_config):
    from dstl.spi import ClosedError

    storage = load_storage(file_config, job_id="job")
    writer = storage.create_writer("op", KG)
    writer.append(0, b"x")
    handle = persist(writer, 0, 1)
    reader = storage.create_reader()
    storage.close()
    with pytest.raises(ClosedError, match="closed"):
        list(reader.read(handle))

"""kafka storage specifics: chunking, zombie fencing across processes, broker restart."""

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.kafka.testing import BOOTSTRAP_ENV, TansuBroker, kafka_broker
from dstl.spi import ChangelogHandle, ConfigError, FencedError, KeyGroupRange, StorageError, load_storage

ROOT = Path(__file__).resolve().parents[2]
KG = KeyGroupRange(0, 4)


def raw_values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """Every record value in a partition (the backdoor: no dstl filtering)."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": bootstrap, "group.id": "raw", "enable.partition.eof": True}
    consumer = Consumer({**settings, "fetch.wait.max.ms": 5})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values, deadline = [], time.monotonic() + 15
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is None:
            continue
        if message.error():
            if message.error().code() == -191:
                break
            continue
        values.append(message.value())
    consumer.close()
    return values


def test_large_change_sets_are_chunked_and_reassembled(kafka_config):
    config = {**kafka_config, "dstl.kafka.max-message-size": "2kb"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        big = random.Random(7).randbytes(10_000)  # incompressible: stored as 10 KB
        writer.append(1, big)
        writer.append(2, b"small")
        handle = persist(writer, 0, 1)
        assert read_data(storage, handle) == [big, b"small"]
        loc = handle.location_dicts[0]
        records = raw_values(kafka_config["dstl.kafka.bootstrap.servers"], loc["topic"], loc["partition"])
        assert len(records) >= 5 and max(len(r) for r in records) <= 2048


def test_missing_bootstrap_and_missing_topic_are_config_errors(kafka_config):
    with pytest.raises(ConfigError, match="bootstrap.servers is not set"):
        load_storage({"dstl.storage": "kafka"}, job_id="job")
    with pytest.raises(ConfigError, match="does not exist and dstl.kafka.topic.create is false"):
        load_storage({**kafka_config, "dstl.kafka.topic.create": "false"}, job_id="job")


def test_zombie_in_another_process_is_fenced_and_never_read(kafka_config):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.dstl_kafka.zombie_child", json.dumps(kafka_config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = json.loads(child.stdout.readline())
        assert first["event"] == "persisted", child.stderr.read()
        assert first["steady_requests"] == 0  # fencing below comes from the marker, not from asking
        with load_storage(kafka_config, job_id="zombie-job") as storage:
            newer = storage.create_writer("shared", KG, epoch=2)
            child.stdin.write("go\n")
            child.stdin.flush()
            outcome = json.loads(child.stdout.readline())
            assert outcome["event"] == "fenced", outcome
            newer.append(0, b"owner write")
            handle = persist(newer, 0, 1)
            assert read_data(storage, handle) == [b"owner write"]
            # The zombie's produce raced its fencing check, so its record is in the
            # partition: only the reader's (log, epoch, writer, SQN) filter keeps it out.
            loc = handle.location_dicts[0]
            raw = raw_values(kafka_config["dstl.kafka.bootstrap.servers"], loc["topic"], loc["partition"])
            assert any(b"zombie write" in value for value in raw)
            old = ChangelogHandle.from_json(first["handle"])
            assert read_data(storage, old) == [b"before fencing"]
    finally:
        child.communicate(timeout=30)
    assert child.returncode == 0


def test_handles_survive_a_broker_restart(s3_endpoint):
    broker = TansuBroker(s3=s3_endpoint)
    broker.start()
    config = {"dstl.storage": "kafka", "dstl.kafka.bootstrap.servers": broker.bootstrap}
    try:
        with load_storage(config, job_id="restart") as storage:
            writer = storage.create_writer("op", KG)
            handles = []
            for round_ in range(5):
                writer.append(round_ % 4, f"round {round_}".encode())
                handles.append(persist(writer, 0, round_ + 1).to_json())
        broker.stop()
        broker.start()
        with load_storage(config, job_id="restart") as fresh:
            for round_, text in enumerate(handles):
                expected = [f"round {r}".encode() for r in range(round_ + 1)]
                assert read_data(fresh, ChangelogHandle.from_json(text)) == expected
    finally:
        broker.stop()


def test_external_bootstrap_is_used_when_set(monkeypatch):
    monkeypatch.setenv(BOOTSTRAP_ENV, "kafka.example:9092")
    with kafka_broker() as bootstrap:
        assert bootstrap == "kafka.example:9092"


def test_logs_sharing_a_partition_ask_for_claims_and_are_still_fenced(kafka_config):
    config = {**kafka_config, "dstl.kafka.topic.partitions": "1"}  # every log in one partition
    with (
        load_storage(config, job_id="shared") as first,
        load_storage(config, job_id="shared") as second,
        load_storage(config, job_id="shared") as takeover,
    ):
        mine = first.create_writer("mine", KG, epoch=1)
        theirs = second.create_writer("theirs", KG, epoch=1)
        for checkpoint in range(1, 5):
            for writer in (mine, theirs):
                writer.append(0, f"{writer.log_id} {checkpoint}".encode())
                persist(writer, 0, checkpoint)
        # The other storage's records land between each of this one's persists.
        assert first.metrics.counter("fencing_requests") >= 4
        takeover.create_writer("mine", KG, epoch=2)
        mine.append(0, b"zombie")
        with pytest.raises(FencedError):
            mine.persist(0, 9).result(timeout=30)
        theirs.append(0, b"unaffected")
        assert read_data(second, persist(theirs, 0, 9))[-1] == b"unaffected"


def test_a_kept_claim_producer_saves_init_and_still_fences(kafka_config):
    """The next writer of a log commits its claim on the kept producer; a foreign claim fences it."""
    config = {**kafka_config, "dstl.kafka.claims.kept-producers": "2"}
    with load_storage(config, job_id="kept") as here, load_storage(config, job_id="kept") as there:
        for epoch in (1, 2, 3):
            writer = here.create_writer("op", KG, epoch=epoch)
            writer.append(0, f"epoch {epoch}".encode())
            persist(writer, 0, epoch)
            writer.close()
        assert here.claims.producers_initialised == 1  # epochs 2 and 3 reused the first producer

        zombie = here.create_writer("op", KG, epoch=4)
        newer = there.create_writer("op", KG, epoch=5)  # its init fences the kept producer's id
        zombie.append(0, b"zombie")
        with pytest.raises(FencedError, match="epoch 5"):
            zombie.persist(0, 9).result(timeout=30)
        zombie.close()

        latest = here.create_writer("op", KG, epoch=6)  # the kept producer is fenced: a fresh one claims
        assert here.claims.producers_initialised == 2
        newer.append(0, b"now a zombie")
        with pytest.raises(FencedError, match="epoch 6"):
            newer.persist(0, 10).result(timeout=30)
        latest.append(0, b"owner")
        assert read_data(here, persist(latest, 0, 11)) == [b"owner"]

        for log_id in ("a", "b", "c", "op"):  # least recently used out: never more than two kept
            here.create_writer(log_id, KG, epoch=7).close()
            assert here.claims.kept <= 2


def test_no_claim_producer_is_kept_when_asked_not_to(kafka_config):
    with load_storage({**kafka_config, "dstl.kafka.claims.kept-producers": "0"}, job_id="unkept") as storage:
        for epoch in (1, 2):
            storage.create_writer("op", KG, epoch=epoch).close()
        assert (storage.claims.producers_initialised, storage.claims.kept) == (2, 0)


def test_a_claim_committed_behind_an_open_transaction_is_waited_for(kafka_config):
    """read_committed stops at the open transaction; the committed claim behind it still fences."""
    from confluent_kafka import Producer

    config = {**kafka_config, "dstl.kafka.request.timeout": "10s"}
    with load_storage(config, job_id="lso") as storage:
        writer = storage.create_writer("op", KG, epoch=1)
        writer.append(0, b"before")
        persist(writer, 0, 1)
        claims, partition = storage.claims, storage.claims_partition("op")
        settings = storage.factory.producer_config()

        def transactional(log_id: str) -> Producer:
            producer = Producer({**settings, "transactional.id": f"dstl.lso.{log_id}"})
            producer.init_transactions(10)
            producer.begin_transaction()
            producer.produce(
                storage.claims_topic, key=f"lso/{log_id}".encode(), value=b"7 x", partition=partition
            )
            producer.flush(10)
            return producer

        stalled = transactional("other")  # another log's claim, still open
        transactional("op").commit_transaction(10)  # a newer claim of this log, committed behind it
        committer = threading.Timer(1.0, stalled.commit_transaction, args=(10,))
        committer.start()
        try:
            with pytest.raises(FencedError, match="epoch 7"):
                claims.check(partition, "op", 1, "token", claims.watermarks(partition))
        finally:
            committer.join()


def _retrying(call, budget=60.0):
    """``call()`` as a caller makes it: a retriable StorageError is retried, within ``budget`` seconds.

    On the S3 engine a claim may not be visible yet, or reading the claims may time
    out behind a slow transaction: both are retriable, and neither may hand out a
    writer or acknowledge a persist. Returns the result and the number of retries.
    """
    deadline = time.monotonic() + budget
    attempt = 0
    while True:
        try:
            return call(), attempt
        except StorageError as exc:
            if isinstance(exc, FencedError) or not exc.retriable or time.monotonic() > deadline:
                raise
            assert "not visible" in str(exc) or "timed out" in str(exc), exc
            attempt += 1


def _s3_engine_broker(s3_endpoint, timeout):
    """A Tansu broker on the S3 engine (started) and a kafka storage config for it."""
    broker = TansuBroker(s3=s3_endpoint)
    broker.start()
    config = {
        "dstl.storage": "kafka",
        "dstl.kafka.bootstrap.servers": broker.bootstrap,
        "dstl.kafka.request.timeout": timeout,
    }
    return broker, config


def test_fencing_never_runs_backwards_on_the_s3_engine(s3_endpoint):
    """A writer is created only on a claim it can see: the newer epoch always wins (Tansu on S3).

    On this engine a claim or a claims read may lag: every call may fail with a
    retriable StorageError, which a caller retries. What may never happen is a
    zombie's persist succeeding, or a newer writer being refused for good.
    """
    broker, config = _s3_engine_broker(s3_endpoint, "4s")
    retries = 0
    try:
        with (
            load_storage(config, job_id="fence") as old_side,
            load_storage(config, job_id="fence") as new_side,
        ):
            for run in range(6):
                op = f"op{run}"
                old, tries = _retrying(lambda op=op: old_side.create_writer(op, KG, epoch=1))
                old.append(0, b"old")
                _retrying(lambda old=old: persist(old, 0, 1))
                new, more = _retrying(lambda op=op: new_side.create_writer(op, KG, epoch=2))
                retries += tries + more
                new.append(0, b"new")
                handle, _ = _retrying(lambda new=new: persist(new, 0, 2))
                assert read_data(new_side, handle) == [b"new"], f"run {run}"
                old.append(0, b"zombie")
                with pytest.raises(FencedError, match=r"newer writer \(epoch 2\)"):
                    _retrying(lambda old=old: persist(old, 0, 3))
                new.append(0, b"still mine")
                _retrying(lambda new=new: persist(new, 0, 4))
    finally:
        broker.stop()
    print(f"retried calls over 6 runs: {retries}")


def test_the_claims_topic_is_compacted_by_log(kafka_config):
    from confluent_kafka.admin import AdminClient, ConfigResource

    with load_storage(kafka_config, job_id="compact") as storage:
        admin = AdminClient({"bootstrap.servers": kafka_config["dstl.kafka.bootstrap.servers"]})
        resource = ConfigResource(ConfigResource.Type.TOPIC, storage.claims_topic)
        (future,) = admin.describe_configs([resource]).values()
        entries = future.result(timeout=30)
        assert entries["cleanup.policy"].value == "compact"


def test_a_broker_killed_mid_stream_loses_nothing_acknowledged(s3_endpoint):
    """SIGKILL of Tansu (S3 engine): persists fail within their bound, then the same writer goes on."""
    broker, config = _s3_engine_broker(s3_endpoint, "3s")
    try:
        with load_storage(config, job_id="kill") as storage:
            writer = storage.create_writer("op", KG)
            acknowledged, expected = [], []
            for round_ in range(3):
                expected.append(f"before {round_}".encode())
                writer.append(0, expected[-1])
                acknowledged.append((persist(writer, 0, round_ + 1), list(expected)))
            broker.stop()  # SIGKILL
            expected.append(b"during the outage")
            writer.append(0, expected[-1])
            started = time.monotonic()
            with pytest.raises(StorageError):
                persist(writer, 0, 4, timeout=60)
            assert time.monotonic() - started < 3 * 3 + 5, "the failed persist was not bounded"
            broker.start()
            for round_ in range(3):
                expected.append(f"after {round_}".encode())
                writer.append(0, expected[-1])
                for attempt in range(5):  # the client reconnects: a retriable failure may come first
                    try:
                        acknowledged.append((persist(writer, 0, 5 + round_, timeout=60), list(expected)))
                        break
                    except StorageError as exc:
                        assert exc.retriable, exc
                        assert attempt < 4, exc
            for handle, data in acknowledged:
                assert read_data(storage, handle) == data
    finally:
        broker.stop()


def test_jobs_and_operators_whose_dotted_names_concatenate_alike_do_not_fence_each_other(kafka_config):
    # job "a.x" / operator "y" and job "a" / operator "x.y" once had one transactional id
    with load_storage(kafka_config, job_id="a.x") as first, load_storage(kafka_config, job_id="a") as second:
        one = first.create_writer("y", KG, epoch=1)
        other = second.create_writer("x.y", KG, epoch=1)  # its own log: must not fence the first job's claim
        one.append(0, b"job a.x")
        other.append(0, b"job a")
        assert read_data(first, persist(one, 0, 1)) == [b"job a.x"]
        assert read_data(second, persist(other, 0, 1)) == [b"job a"]
        one.close()
        first.create_writer("y", KG, epoch=2).close()
        assert first.claims.producers_initialised == 1  # its kept claim producer was never fenced


def test_a_read_only_open_creates_no_topic_and_needs_none(kafka_config):
    from confluent_kafka.admin import AdminClient

    from dstl.spi import ReadOnlyError, storage_for_handle

    with load_storage(kafka_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"read me")
        handle = persist(writer, 0, 1)
    admin = AdminClient({"bootstrap.servers": kafka_config["dstl.kafka.bootstrap.servers"]})
    before = set(admin.list_topics(timeout=10).topics)
    no_creation = {**kafka_config, "dstl.kafka.topic.create": "false"}
    with storage_for_handle(handle, no_creation, job_id="inspect", read_only=True) as reader_only:
        assert read_data(reader_only, handle) == [b"read me"]
        with pytest.raises(ReadOnlyError):
            reader_only.create_writer("op", KG)
    assert set(admin.list_topics(timeout=10).topics) == before


def test_a_job_id_is_bound_to_its_first_owner_on_the_broker(kafka_config):
    from dstl.spi import JobConflictError

    with load_storage(kafka_config, job_id="team") as first:
        first.bind_job("s3://bucket/jobs/a/dstl-state/team/checkpoints")
        first.bind_job("s3://bucket/jobs/a/dstl-state/team/checkpoints")  # the same owner again: fine
    with load_storage(kafka_config, job_id="team") as second:
        with pytest.raises(JobConflictError) as refused:
            second.bind_job("s3://bucket/jobs/b/dstl-state/team/checkpoints")
        assert "jobs/a/" in str(refused.value) and "jobs/b/" in str(refused.value)
    with load_storage(kafka_config, job_id="other") as third:
        third.bind_job("s3://bucket/jobs/b/dstl-state/other/checkpoints")

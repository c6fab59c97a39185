"""Snapshots encoded by an encoder process from a spooled copy: the same object, failures retried."""

import io
import os
import subprocess
import sys
import textwrap

import msgpack
import pytest

from dstl.backend.changelog import child_output, snapshot_encoding
from dstl.backend.changelog.materializer import Materializer
from dstl.backend.changelog.snapshot_encoding import EncodeRequest, SnapshotEncoding
from dstl.backend.delegate import HeapDelegate, LmdbDelegate
from dstl.spi import StorageError

from .helpers import FakeTarget, stored_state

KEYS = 3_000


def _filled(tmp_path, name):
    target = FakeTarget(LmdbDelegate(tmp_path / name))
    for i in range(KEYS):
        target.delegate.put("v", i % 8, b"k%05d" % i, b"value %d" % i)
    target.delegate.put("m", 3, b"map", {b"a": b"1", b"b": b"2"})
    return target


def _spools(tmp_path):
    return [entry.name for entry in tmp_path.iterdir() if ".spool-" in entry.name]


def test_snapshots_encoded_apart_are_the_objects_encoded_in_process(tmp_path, spawned):
    objects = {}
    for apart_from in (0, 1, 1 << 40):  # in process; apart; a spool below the size: in process
        target = _filled(tmp_path, f"lmdb-{apart_from}")
        snapshots = tmp_path / f"snap-{apart_from}"
        materializer = Materializer(
            target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", apart_from)
        )
        full = materializer.start().result(timeout=60)
        for i in range(0, KEYS, 3):  # a third of the keys: the incremental reads a copy too
            target.delegate.put("v", i % 8, b"k%05d" % i, b"changed %d" % i)
            materializer.changed("v", i % 8, b"k%05d" % i)
        incremental = materializer.start().result(timeout=60)
        materializer.close()
        assert full.entries == KEYS + 1 and "-incr-" in incremental.path and incremental.entries == KEYS // 3
        objects[apart_from] = [(snapshots / ref.path).read_bytes() for ref in (full, incremental)]
        assert [full.size, incremental.size] == [len(data) for data in objects[apart_from]]
        copy = FakeTarget(HeapDelegate())
        for ref in (full, incremental):
            Materializer(copy, snapshots.as_uri(), 3).load(ref)
        assert stored_state(copy.delegate) == stored_state(target.delegate)
        assert _spools(tmp_path) == []  # the copies, and the files encoded in them, went with the views
    assert [command[1:3] for command in spawned] == [["-m", snapshot_encoding.ENCODER_MODULE]] * 2
    assert objects[1] == objects[0] == objects[1 << 40]


#: An encoder process whose sections fail as the test says (it runs the real encoder otherwise).
FAULTY_ENCODER = """
import os, signal, sys, time
from dstl.backend.changelog.encoder_process import main
from dstl.backend.materialization import SnapshotWriter

def broken(self, key_group, entries):
    how = {how!r}
    if how == "prints":
        sys.stdout.buffer.write(bytes([0xc1]))  # never a msgpack byte
        sys.stdout.flush()
        return
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hangs":
        time.sleep(600)
    try:
        os.fstat({held})
        inherited = "kept"
    except OSError:
        inherited = "closed"
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    raise OSError(f"no room (niceness {{niceness}}, the parent's file {{inherited}})")

SnapshotWriter.add_section = broken
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("how", ["raises", "killed", "hangs", "prints"])
def test_a_failed_encoder_process_fails_the_materialization_and_the_next_one_succeeds(
    tmp_path, monkeypatch, spawned, how
):
    target = _filled(tmp_path, "lmdb")
    snapshots = tmp_path / "snap"
    materializer = Materializer(target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", 1, 7))
    held = (tmp_path / "held-by-the-parent").open("wb")  # e.g. a lock file, or the socket to Spark
    os.set_inheritable(held.fileno(), True)  # even so, the encoder does not get it
    script = tmp_path / "faulty_encoder.py"
    script.write_text(textwrap.dedent(FAULTY_ENCODER.format(how=how, held=held.fileno())))
    real_command = snapshot_encoding.encoder_command
    monkeypatch.setattr(
        snapshot_encoding, "encoder_command", lambda request: [sys.executable, str(script), str(request)]
    )
    monkeypatch.setattr(child_output, "STALL_SECONDS", 3.0)
    expected = {
        "raises": "OSError: no room",
        "killed": "it ended with exit code -9",
        "hangs": "it finished no section for 3 s and was stopped",
        "prints": "its messages did not decode",
    }[how]
    with pytest.raises(StorageError, match=f"snapshot encoder process failed: {expected}") as failed:
        materializer.start().result(timeout=60)
    if how == "raises":
        niceness = min(os.getpriority(os.PRIO_PROCESS, 0) + 7, 19)  # as asked
        assert f"niceness {niceness}, the parent's file closed" in str(failed.value)
    held.close()
    materializer.close()  # the view (and its copy) closes after the future fails
    assert failed.value.retriable and materializer.failures == 1
    assert list(snapshots.rglob("*.snap")) == [] and _spools(tmp_path) == []

    monkeypatch.setattr(snapshot_encoding, "encoder_command", real_command)
    ref = materializer.start().result(timeout=60)  # a full one again: the failed one was full
    materializer.close()
    assert materializer.failures == 0 and "-full-" in ref.path and ref.entries == KEYS + 1
    assert [path.name for path in snapshots.rglob("*.snap")] == [ref.path.rsplit("/", 1)[1]]
    assert len(spawned) == 2


def test_an_encoder_process_gives_up_when_the_requesting_process_is_gone(tmp_path):
    target = _filled(tmp_path, "lmdb")
    view = target.delegate.view()
    view.detach()
    spool = view.hand_over_copy()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    requested = tmp_path / "request"
    requested.write_bytes(EncodeRequest(spool, range(8), "zstd", {}, {}, 0.0, 10, gone.pid, None).encode())
    ended = subprocess.run(
        snapshot_encoding.encoder_command(requested), capture_output=True, timeout=60, check=False
    )
    assert ended.returncode == 1
    messages = list(msgpack.Unpacker(io.BytesIO(ended.stdout), raw=False))
    assert messages == [{"sections": 0}, {"error": "RuntimeError: the materializing process ended"}]
    view.close()
    assert _spools(tmp_path) == []


def test_an_encoder_is_followed_when_the_process_holds_more_than_fd_setsize_descriptors(tmp_path):
    """A Spark worker may hold over 1024 descriptors: the encoder's pipe is then beyond select()'s reach."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    target = _filled(tmp_path, "lmdb")
    snapshots = tmp_path / "snap"
    materializer = Materializer(target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", 1))
    with (tmp_path / "many").open("wb") as held:
        duplicates = [os.dup(held.fileno()) for _ in range(1100)]  # the encoder's pipe comes after them
    try:
        ref = materializer.start().result(timeout=60)
    finally:
        for descriptor in duplicates:
            os.close(descriptor)
        materializer.close()
        if soft < 1200:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "-full-" in ref.path and ref.entries == KEYS + 1


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (["-m", "dstl_has_no_such_module"], "No module named dstl_has_no_such_module"),
        (["-c", "import sys; sys.stdout.buffer.write(bytes([0xc1])); sys.exit(0)"], "did not decode"),
        (["-c", "import time; time.sleep(600)"], "finished no section for 2 s"),
    ],
    ids=["cannot import", "garbles its stdout", "hangs at start"],
)
def test_an_encoder_process_that_does_not_start_leaves_the_snapshot_to_the_task_s_process(
    tmp_path, monkeypatch, spawned, caplog, command, why
):
    target = _filled(tmp_path, "lmdb")
    snapshots = tmp_path / "snap"
    if "time.sleep" in command[-1]:  # only the hung one waits for the bound (the others end by themselves)
        monkeypatch.setattr(child_output, "STALL_SECONDS", 2.0)
    monkeypatch.setattr(snapshot_encoding, "encoder_command", lambda request: [sys.executable, *command])
    materializer = Materializer(target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", 1))
    with caplog.at_level("WARNING"):
        apart = materializer.start().result(timeout=60)
    materializer.close()
    assert (
        "did not start" in caplog.text
        and why in caplog.text
        and "encoded in the task's process" in caplog.text
    )
    assert materializer.failures == 0 and apart.entries == KEYS + 1 and len(spawned) == 1
    copy = FakeTarget(HeapDelegate())
    Materializer(copy, snapshots.as_uri(), 3).load(apart)
    assert stored_state(copy.delegate) == stored_state(target.delegate)
    assert _spools(tmp_path) == []


def test_an_encoder_process_whose_interpreter_prints_text_first_still_encodes(tmp_path, monkeypatch, spawned):
    target = _filled(tmp_path, "lmdb")
    snapshots = tmp_path / "snap"
    script = tmp_path / "greeting_encoder.py"  # as a sitecustomize that prints at every start would
    script.write_text(
        "import sys\nprint('hello from sitecustomize', flush=True)\n"
        "from dstl.backend.changelog.encoder_process import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    monkeypatch.setattr(
        snapshot_encoding, "encoder_command", lambda request: [sys.executable, str(script), str(request)]
    )
    materializer = Materializer(target, snapshots.as_uri(), 3, encoding=SnapshotEncoding("zstd", 1))
    ref = materializer.start().result(timeout=60)
    materializer.close()
    assert materializer.failures == 0 and ref.entries == KEYS + 1 and len(spawned) == 1


@pytest.mark.parametrize("where", ["local disk", "memory"])
def test_an_encoded_object_is_moved_into_a_local_snapshot_directory_and_copied_elsewhere(
    tmp_path, monkeypatch, spawned, where
):
    from fsspec import AbstractFileSystem
    from fsspec.implementations.local import LocalFileSystem

    copies = []
    for cls in (LocalFileSystem, AbstractFileSystem):
        real_put = cls.put_file

        def counted(self, source, destination, *args, _real=real_put, **kwargs):
            copies.append(destination)
            return _real(self, source, destination, *args, **kwargs)

        monkeypatch.setattr(cls, "put_file", counted)
    target = _filled(tmp_path, "lmdb")
    url = (
        (tmp_path / "snap").as_uri()
        if where == "local disk"
        else f"memory://snap-{os.getpid()}-{id(tmp_path)}"
    )
    materializer = Materializer(target, url, 3, encoding=SnapshotEncoding("zstd", 1))
    ref = materializer.start().result(timeout=60)
    materializer.close()
    assert len(spawned) == 1 and ref.entries == KEYS + 1
    assert len(copies) == (0 if where == "local disk" else 1)  # on a local disk: renamed, not written again
    copy = FakeTarget(HeapDelegate())
    Materializer(copy, url, 3).load(ref)
    assert stored_state(copy.delegate) == stored_state(target.delegate)
    assert _spools(tmp_path) == []

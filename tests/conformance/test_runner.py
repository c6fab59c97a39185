"""The conformance runner: passes on memory and the third-party example, catches broken storages."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fixtures.thirdparty import run_dstl

ROOT = Path(__file__).resolve().parents[2]
BROKEN_PLUGIN = "tests.conformance.broken_storages"
CATEGORIES = (
    "durability",
    "sqn_ranging",
    "truncation",
    "fencing",
    "lifecycle",
    "concurrency",
    "failures",
    "bad_input",
    "metrics",
    "model",
    "read_paths",
)


def repo_env():
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


@pytest.mark.parametrize(
    ("identifier", "backend"),
    [("memory", None), ("local", None), ("filesystem", "file"), ("filesystem", "s3"), ("kafka", None)],
    ids=["memory", "local", "filesystem-file", "filesystem-s3", "kafka-tansu"],
)
def test_built_in_storage_conforms(tmp_path, identifier, backend):
    report = tmp_path / "report.xml"
    env = {**os.environ, "DSTL_DFS_CONFORMANCE_BACKEND": backend} if backend else None
    result = run_dstl(["conformance", identifier, "--junitxml", str(report)], env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    for category in CATEGORIES:
        assert category in result.stdout
    suite = ET.parse(report).getroot().find("testsuite")
    assert int(suite.get("tests")) >= 80
    assert int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    if identifier in ("memory", "kafka"):
        # Inapplicable tests are reported as not supported, naming the capability.
        assert "not supported" in result.stdout
    else:
        assert int(suite.get("skipped")) == 0, (
            f"{identifier} declares every capability: nothing may be skipped"
        )


@pytest.mark.parametrize(
    ("identifier", "caught_by"),
    [
        ("broken-drops-last", "test_durability.py::test_last_change_of_every_change_set_is_kept"),
        (
            "broken-below-start",
            "test_sqn_ranging.py::test_persist_from_start_is_exact_with_shared_and_foreign_changes",
        ),
        ("broken-ignores-truncation", "test_truncation.py::test_persist_below_truncation_raises"),
        ("broken-no-fencing", "test_fencing.py::test_newer_epoch_fences_older_persist"),
        ("broken-hides-corruption", "test_failures.py::test_corrupted_bytes_are_reported_not_returned"),
        ("broken-loses-on-kill", "test_durability.py::test_readable_after_writer_process_sigkill"),
        # The blind spots of issue 23: each escaped the suite before its property was added.
        ("broken-epoch-as-text", "test_fencing.py::test_fencing_orders_epochs_of_any_size"),
        ("broken-epoch-32bit", "test_fencing.py::test_fencing_orders_epochs_of_any_size"),
        (
            "broken-packed-discard",
            "test_lifecycle.py::test_discards_interleaved_with_many_handles_sharing_many_objects",
        ),
        ("broken-empty-is-nothing", "test_sqn_ranging.py::test_boundary_rules"),
        ("broken-restore-filter", "test_read_paths.py::test_every_read_path_yields_the_same_changes"),
        (
            "broken-acks-before-sync",
            "test_durability.py::test_nothing_acknowledged_is_lost_when_the_power_fails",
        ),
        # Bytes are bytes (issue 34, class 3): typed views count bytes; the caller's buffer is copied.
        (
            "broken-items-not-bytes",
            "test_bad_input.py::test_bytes_like_data_is_framed_by_its_bytes_not_its_items",
        ),
        (
            "broken-keeps-caller-buffer",
            "test_bad_input.py::test_the_caller_may_reuse_its_buffer_once_append_returns",
        ),
        # Confirm and free (issue 34, class 5): a range past what was persisted frees nothing of it.
        (
            "broken-confirm-frees-unpersisted",
            "test_lifecycle.py::test_confirm_and_reset_never_free_what_is_not_persisted",
        ),
        # Sync failure semantics (issue 34, class 6): a retried sync does not bring dropped pages back.
        (
            "broken-retries-sync",
            "test_durability.py::test_a_sync_that_failed_is_not_made_good_by_a_later_one",
        ),
        # Attempt identity (issue 34, class 2): a retry's upload never replaces an earlier attempt's.
        (
            "broken-names-by-range",
            "test_fencing.py::test_two_attempts_of_one_range_never_overwrite_each_other",
        ),
        # Reads verify on every path (issue 34, class 4): a filtered read served unverified from a cache.
        ("broken-cached-filter", "test_read_paths.py::test_every_read_path_verifies_what_it_returns"),
        # Orphan collection, precisely (issue 34, class 1): ids that prefix others stay apart.
        ("broken-prefix-cleanup", "test_isolation.py::test_logs_whose_ids_prefix_each_other_stay_apart"),
        # ... a live handle keeps every object its change sets lie in, not only its newest upload's.
        (
            "broken-keeps-newest-object",
            "test_truncation.py::test_a_live_handle_keeps_every_object_its_change_sets_lie_in",
        ),
        # ... an object appended to after the cutoff, or held by an open writer, is not aged by its creation.
        (
            "broken-ages-by-creation",
            "test_truncation.py::test_an_object_appended_to_after_the_cutoff_is_aged_by_its_last_append",
        ),
        (
            "broken-ages-by-creation",
            "test_truncation.py::test_another_instances_collection_never_takes_an_open_writers_object",
        ),
        # Found by mutation testing: a discard checks the SQN the location claims, not only log and epoch.
        (
            "broken-ignores-sqn-on-discard",
            "test_isolation.py::test_a_handle_relabelling_its_own_change_sets_frees_none_of_them",
        ),
        # Found by mutation testing: errors about forged change sets must say where they lie.
        (
            "broken-misplaces-damage",
            "test_forgery.py::test_a_forged_change_set_is_reported_where_it_lies_and_nothing_of_it_returned",
        ),
    ],
)
def test_broken_storage_is_caught(identifier, caught_by):
    result = run_dstl(["conformance", identifier, "--plugin", BROKEN_PLUGIN], env=repo_env(), timeout=600)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED test_")]
    assert any(caught_by in line for line in failed), "\n".join(failed) or result.stdout[-3000:]
    assert f"storage {identifier!r} does not conform" in result.stdout


def test_a_storage_whose_reader_implements_only_read_conforms():
    """The SPI's defaults pass the suite: read_change_sets built on read is enough."""
    result = run_dstl(["conformance", "only-read", "--plugin", BROKEN_PLUGIN], env=repo_env(), timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert "storage 'only-read' conforms" in result.stdout
    assert "forgery_injection" not in result.stdout  # the forgery tests, empty change sets included, ran


def test_third_party_example_conforms_end_to_end(thirdparty_env):
    result = run_dstl(["conformance", "sqlite"], env=thirdparty_env, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert "storage 'sqlite' conforms" in result.stdout
    # The example declares process-level capabilities, so those tests really ran.
    assert "survives_process_kill" not in result.stdout


def test_unknown_storage_is_a_usage_error():
    result = run_dstl(["conformance", "no-such-storage"])
    assert result.returncode == 2
    assert "installed storages" in result.stdout and "memory" in result.stdout


def test_keyword_selecting_nothing_fails():
    result = run_dstl(["conformance", "memory", "-k", "no_test_has_this_name"])
    assert result.returncode == 1
    assert "no conformance test ran" in result.stdout


def test_pytest_plugin_mode(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "dstl.conformance",
            "--dstl-storage=memory",
            "-q",
            "-k",
            "boundary_rules",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # the ten boundary rules, each with tagged, empty and empty metadata changes
    assert "30 passed" in result.stdout

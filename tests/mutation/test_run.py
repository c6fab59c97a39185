"""The mutation runner: its scratch copy imports as dstl, survivors are explained, scores add up."""

import subprocess
import sys

from mutation.run import Mutant, by_the_suite_alone, explain, score, scratch_copy, unused_explanations


def _mutant(status, line="x = 1", file="spi/a.py", index=0):
    return Mutant(file, 3, line, index, status, "x = 2")


def test_the_scratch_copy_is_what_dstl_imports_there(tmp_path):
    source = scratch_copy(tmp_path)
    (source / "spi" / "kit" / "changeset_format.py").write_text(
        (source / "spi" / "kit" / "changeset_format.py").read_text() + "\nMUTATED_IN_SCRATCH = True\n"
    )
    probe = "import dstl.spi.kit.changeset_format as f; print(f.__file__, hasattr(f, 'MUTATED_IN_SCRATCH'))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=source,
        env={"PYTHONPATH": f"{tmp_path / 'shadow'}:{source}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    path, mutated = done.stdout.split()
    assert path.startswith(str(tmp_path)) and mutated == "True", done.stdout


def test_survivors_are_explained_by_entry_or_rule_and_leave_the_score():
    mutants = [
        _mutant("killed"),
        _mutant("timeout"),
        Mutant("spi/a.py", 3, 'msg = "bad"', 1, "survived", 'msg = "XXbadXX"'),
        Mutant("spi/a.py", 3, 'msg = "bad"', 2, "survived", "msg = None"),
        _mutant("survived", "_VERSION = 1"),
        _mutant("survived", "if a < b:"),
    ]
    explained = {
        "mutant": [{"file": "spi/a.py", "line": "_VERSION = 1", "kind": "equivalent", "reason": "r1"}],
        "rule": [{"pattern": r"^msg = ", "mutated": "XX", "kind": "wording", "reason": "r2"}],
    }
    out = explain(mutants, explained)
    assert [m.explanation for m in out] == [None, None, "wording: r2", None, "equivalent: r1", None]
    figures = score(out)
    assert figures == {
        "mutants": 6,
        "killed": 2,
        "survived": 4,
        "explained": 2,
        "equivalent": 1,
        "raw_score": round(2 / 6, 4),
        "score_without_equivalent": 0.4,
        "score": 0.5,
    }
    unused = {**explained, "rule": [*explained["rule"], {"pattern": "^never$", "kind": "k", "reason": "r"}]}
    assert unused_explanations(explain(mutants, unused), unused, ("spi/a.py",)) == ["^never$"]


def test_an_entry_for_another_index_or_file_does_not_explain():
    explained = {"mutant": [{"file": "spi/b.py", "line": "x = 1", "kind": "k", "reason": "r"}]}
    assert explain([_mutant("survived")], explained)[0].explanation is None
    explained = {"mutant": [{"file": "spi/a.py", "line": "x = 1", "index": 2, "kind": "k", "reason": "r"}]}
    assert explain([_mutant("survived")], explained)[0].explanation is None


def test_the_suite_alone_is_scored_without_what_only_the_codes_own_tests_killed():
    mutants = [
        Mutant("f.py", 1, "x", 0, "killed", "y", killed_by=0),
        Mutant("f.py", 2, "x", 0, "killed", "y", killed_by=2),  # the own tests' kill
        Mutant("f.py", 3, "x", 0, "timeout", "y"),
        Mutant("f.py", 4, "x", 0, "survived", "y"),
    ]
    alone = by_the_suite_alone(mutants, suite_commands=2)
    assert [m.status for m in alone] == ["killed", "survived", "timeout", "survived"]
    assert score(alone)["killed"] == 2
    assert score(mutants)["killed"] == 3

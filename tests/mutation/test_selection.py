"""Test selection for mutants: the map of which tests run each line, and the tests a mutant runs."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from mutation import coverage_map
from mutation.selection import NO_TEST, Statement, chosen_tests, code_lines, pre_mutation, statement_of

SOURCE = """import os

@staticmethod
def f(a,
      b=2):
    if (a and
        b):
        return {"k":
                 "v"}
    else:
        pass
    try:
        a = 1
    except (ValueError,
            KeyError):
        raise RuntimeError(
            "msg")
    finally:
        b = 2
class C:
    z = 3
    def g(self):
        return 4
"""


def test_a_line_belongs_to_its_innermost_statement_and_a_compound_one_to_its_header():
    spans = {line: statement_of(SOURCE, line) for line in range(1, 24)}
    assert spans[1] == Statement(1, 1, at_import=True)
    # decorators, the def line and its defaults run when the module loads
    assert spans[3] == spans[5] == Statement(3, 5, at_import=True)
    body = (6, 19)
    assert spans[7] == Statement(6, 7, at_import=False, body=body)  # an if's header, not its body
    assert spans[9] == Statement(8, 9, at_import=False, body=body)
    assert spans[10] == Statement(6, 7, at_import=False, body=body)  # `else:` is the if's
    assert spans[15] == Statement(14, 15, at_import=False, body=body)  # an except clause
    assert spans[17] == Statement(16, 17, at_import=False, body=body)  # inside a handler
    assert spans[21] == Statement(21, 21, at_import=True)  # a class body
    assert spans[23] == Statement(23, 23, at_import=False, body=(23, 23))


def test_lines_without_an_instruction_are_known():
    compiled = code_lines(SOURCE)
    assert {1, 6, 8, 13, 16} <= compiled
    assert 18 not in compiled, "`finally:` compiles to nothing of its own"


def _map(lines, spawning=()):
    return {"lines": {"m.py": {str(k): v for k, v in lines.items()}}, "spawning": list(spawning)}


def test_a_mutant_runs_the_tests_that_ran_its_statement_and_those_that_spawn():
    test_map = _map({8: ["t::a"], 9: ["t::b"], 13: ["t::c"]}, spawning=["t::child"])
    statement = Statement(8, 9, at_import=False, body=(6, 19))
    assert chosen_tests(test_map, "m.py", statement, frozenset({8, 9})) == ["t::a", "t::b", "t::child"]


def test_a_statement_no_test_ran_needs_no_test_and_one_run_at_import_needs_all():
    test_map = _map({8: ["t::a"], 1: [coverage_map.OUTSIDE_TESTS], 13: ["t::c", coverage_map.OUTSIDE_TESTS]})
    assert chosen_tests(test_map, "m.py", Statement(16, 17, False, (6, 19)), frozenset({16})) == []
    assert chosen_tests(test_map, "m.py", Statement(1, 1, True), frozenset({1})) is None
    assert chosen_tests(test_map, "m.py", Statement(13, 13, False, (6, 19)), frozenset({13})) is None
    assert chosen_tests(test_map, "other.py", Statement(8, 8, False, (6, 19)), frozenset({8})) is None


def test_a_statement_without_instructions_runs_the_tests_of_its_function():
    test_map = _map({8: ["t::a"], 16: ["t::b"]})
    assert chosen_tests(test_map, "m.py", Statement(18, 18, False, (6, 19)), frozenset({8, 16})) == [
        "t::a",
        "t::b",
    ]


def test_the_hook_writes_each_commands_selection(tmp_path, monkeypatch):
    module = tmp_path / "m.py"
    module.write_text(SOURCE)
    maps = []
    for index, lines in enumerate(({8: ["t::a"]}, {})):
        path = tmp_path / f"map-{index}.json"
        path.write_text(json.dumps(_map(lines)))
        maps.append(str(path))
    (tmp_path / "selection").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSTL_MUTATION_MAPS", os.pathsep.join(maps))
    monkeypatch.setenv("DSTL_MUTATION_SELECTION", str(tmp_path / "selection"))

    class Context:
        filename = "m.py"
        current_line_index = 8  # line 9, 0-based
        mutation_id = SimpleNamespace(line_number=8, index=2)

    from mutation import selection

    selection._maps.cache_clear()
    pre_mutation(Context())
    assert (tmp_path / "selection" / "0").read_text() == "t::a\n"
    assert (tmp_path / "selection" / "1").read_text() == NO_TEST
    (tmp_path / "selection" / selection.KILLER).write_text("1\n")  # the runner script's word
    Context.current_line_index = 0  # an import: every test of both commands
    Context.mutation_id = SimpleNamespace(line_number=0, index=0)
    pre_mutation(Context())
    assert not (tmp_path / "selection" / "0").exists()
    assert not (tmp_path / "selection" / "1").exists()
    selection.record_killer(tmp_path / "selection")  # the last mutant survived
    assert selection.killers(tmp_path / "selection") == {("m.py", 9, 2): 1}
    selection._maps.cache_clear()


def test_the_map_names_the_tests_that_ran_each_line_and_those_that_spawn(tmp_path):
    (tmp_path / "under_test.py").write_text(
        "import subprocess, sys\n"
        "def f():\n"
        "    return 1\n"
        "def g():\n"
        "    return subprocess.run([sys.executable, '-c', 'pass']).returncode\n"
    )
    (tmp_path / "test_code.py").write_text(
        "import under_test as c\ndef test_f():\n    assert c.f() == 1\ndef test_g():\n    assert c.g() == 0\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), str(tmp_path)])}
    [written] = coverage_map.build(
        tmp_path,
        env,
        ("-m pytest -q -p no:cacheprovider -p no:randomly test_code.py",),
        ("under_test.py",),
        tmp_path,
    )
    found = json.loads(written.read_text())
    lines = found["lines"]["under_test.py"]
    assert lines["3"] == ["test_code.py::test_f"]
    assert lines["5"] == ["test_code.py::test_g"]
    assert coverage_map.OUTSIDE_TESTS in lines["2"], "a def line runs at import"
    assert found["spawning"] == ["test_code.py::test_g"]
    rerun = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_code.py::test_g"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        check=False,
    )
    assert rerun.returncode == 0, "a test named in the map runs from the directory it was recorded in"

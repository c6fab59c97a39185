"""Every hook is documented in the README and exercised by a test (datasette's rule)."""

from pathlib import Path

from dstl.spi import hookspecs

ROOT = Path(__file__).resolve().parents[2]


def hook_names():
    return sorted(name for name in dir(hookspecs) if name.startswith("dstl_"))


def test_every_hook_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in hook_names() if f"`{name}(" not in readme]
    assert not missing, f"hooks without a README entry: {missing}"


def test_every_hook_has_an_implementation_under_test():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    missing = [name for name in hook_names() if f"def {name}(" not in sources]
    assert not missing, f"hooks no test plugin implements: {missing}"

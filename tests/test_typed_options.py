"""Options are read through their typed constants; text keys only where text comes in."""

from __future__ import annotations

import re
from pathlib import Path

from dstl.backend.options import CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO, CHECKPOINTS_DIR
from dstl.backend.spark.options import SPARK_PARALLELISM
from dstl.local.options import SEGMENT_SIZE
from dstl.spi import STORAGE_OPTION, Config, ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("spi", "dstl_local", "dstl_dfs", "dstl_kafka", "backend", "conformance_tests")
#: a declared option read by its text key: config["state.x"], cfg.get("dstl.y")
_TEXT_READ = re.compile(r"""(?:\[|\.get\()\s*["'](?P<key>(?:dstl|state)\.[a-z][\w.-]*)["']\s*[\],)]""")
#: where text comes in or goes out (the CLI's --config, the demo's flags)
_TEXT_ALLOWED = {"backend/spark/demo/run.py"}


def test_constants_read_typed_parsed_values_and_defaults():
    config = Config(
        {
            "state.changelog.materialization.max-log-ratio": "2.5",
            "dstl.spark.parallelism": "4",
            "dstl.local.segment-size": "1mb",
        }
    )
    assert config.get(CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO) == 2.5
    assert config.get(SPARK_PARALLELISM) == 4
    assert config.get(SEGMENT_SIZE) == 1 << 20
    assert config.get(STORAGE_OPTION) == "local"  # the default
    assert config.get(CHECKPOINTS_DIR) is None
    assert config.get("dstl.spark.parallelism") == 4  # text keys still work where text comes in


def _declared(key: str) -> bool:
    try:
        Config({}).option(key)
    except ConfigError:
        return False
    return True


def test_product_code_reads_no_declared_option_by_its_text_key():
    reads = []
    checked = 0
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            checked += 1
            if relative in _TEXT_ALLOWED or "/suite/" in relative:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found = _TEXT_READ.search(line)
                if found and _declared(found.group("key")) and not line.lstrip().startswith("#"):
                    reads.append(f"{relative}:{number}: {line.strip()}")
    assert checked > 100
    assert not reads, "\n".join(reads)

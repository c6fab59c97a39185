"""Runs the conformance child process and collects its events."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ..testing import DEFAULT_TIMEOUT


def child_request(
    sut: Any,
    *,
    mode: str,
    operator_id: str,
    key_groups: tuple[int, int],
    epoch: int,
    count: int,
    tag: str,
    size: int = 0,
) -> dict[str, Any]:
    """The JSON request for the child process (see ``child.py`` for the modes)."""
    return {
        "mode": mode,
        "config": sut.config,
        "job_id": sut.job_id,
        "operator_id": operator_id,
        "key_groups": list(key_groups),
        "epoch": epoch,
        "count": count,
        "size": size,
        "tag": tag,
        "timeout": sut.timeout,
    }


def run_child(
    request: dict[str, Any], env: dict[str, str], timeout: float = DEFAULT_TIMEOUT
) -> tuple[int, list[dict[str, Any]], str]:
    """Run one child request; returns ``(returncode, events, stderr)``."""
    proc = subprocess.run(
        [sys.executable, "-m", "dstl.conformance._private.child"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, events, proc.stderr

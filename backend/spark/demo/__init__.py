"""The main job: a PySpark streaming pipeline on the changelog backend (``dstl demo``)."""

from __future__ import annotations

from .pipeline import DemoProcessor, expected_state, start_pipeline
from .run import run_demo

__all__ = ["DemoProcessor", "expected_state", "run_demo", "start_pipeline"]

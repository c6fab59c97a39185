"""Starting a query of one or more dstl stateful steps: each checked, recorded and wired to the next.

The first step reads the stream; each later one reads the output of the one before
(after the per-row steps between them), in the same ``foreachBatch`` call and with
the same batch id, as Spark chains its stateful operators in one plan. Every step
has its own state: the first under the query's checkpoint location, step ``n``
under ``<location>/dstl-steps/<n>`` (its job id, record, state and working copies),
so steps are told apart by their position, as Spark tells operators apart by id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dstl.spi import Config, ConfigError

from ..job_identity import resolve_job_id
from ..processor import TimeMode
from ..pyspark_compat import PySparkProcessorFactory
from ..query_progress import ProgressBridge
from ..sinks import ParquetBatchSink
from ..stateful_query import StatefulQuery
from .call_checks import adapted, check_columns, job_config, output_struct, stream_watermark
from .chained_steps import ChainedStep
from .durations import processing_interval_s
from .idle_batches import NO_DATA_BATCHES_CONF, wants_idle_batches, with_heartbeat
from .input_chunks import InputChunks
from .ledgers import BatchLedger, RecordedLedger, RunnerLedger
from .listener_hub import hub_of
from .query_record import QueryShape, key_types, recorded_shape, settled_shape
from .runner import BatchRunner, NextStep, QuerySpec, Sink, checked_layout
from .server_runner import ProgressRecords, ServerSideRunner
from .sessions import connect_config, is_connect, spark_conf

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ..progress import BatchProgress

__all__ = ["StepRequest", "start_query", "step_location"]

#: Under the query's checkpoint location: the state of its second and later steps.
STEPS_DIR = "dstl-steps"


@dataclass(frozen=True)
class StepRequest:
    """One stateful step as the caller asked for it.

    :ivar frame: what it reads: the stream (first step), else an empty frame of the
        previous step's output after ``before`` (its columns and types, for the checks).
    :ivar operator: the keywords of ``transform_with_state`` that define the step.
    :ivar before: for a later step, the per-row steps run on the previous step's output.
    """

    frame: DataFrame
    operator: Mapping[str, Any]
    before: Callable[[DataFrame], DataFrame] | None = None


def step_location(checkpoint_location: str, index: int) -> str:
    """Where step ``index`` (0: the first) keeps its record, job id and default state directories."""
    if index == 0:
        return checkpoint_location
    return f"{checkpoint_location.rstrip('/')}/{STEPS_DIR}/{index}"


def _check_no_step_added(steps: Sequence[_Checked]) -> None:
    """Refuse a later step that the query at this location did not have when it ran before.

    Its state would have to start at the query's next batch, which continues from the
    checkpoint before it: as Spark, which finds no state for a new operator, dstl refuses.
    """
    first = steps[0]
    if recorded_shape(first.location, first.cfg) is None:
        return
    for index, step in enumerate(steps[1:], start=1):
        if recorded_shape(step.location, step.cfg) is None:
            msg = (
                f"stateful step {index + 1} of the query is new: the query at {first.location} ran "
                "without it, and a step cannot join a query's checkpoint (its state would start "
                "mid-stream). Start the query from a new checkpoint location (with a savepoint of the "
                "first step's state, if needed), or run the new step as a query of its own"
            )
            raise ConfigError(msg)


def _time_mode(operator: Mapping[str, Any], event_time_column: str | None) -> TimeMode:
    asked = operator.get("time_mode")
    mode = TimeMode.parse(asked if asked is not None else ("event" if event_time_column else "none"))
    if mode is TimeMode.EVENT and event_time_column is None:
        msg = "time_mode='event' needs an event_time_column (the watermark follows it)"
        raise ConfigError(msg)
    return mode


@dataclass(frozen=True)
class _Checked:
    """A step's keywords, checked and resolved at the call (nothing written yet)."""

    request: StepRequest
    location: str
    cfg: Config
    processor: Callable[[], Any]
    mode: TimeMode
    event_time_column: str | None
    delay_ms: int

    @property
    def operator(self) -> Mapping[str, Any]:
        return self.request.operator


def _checked(request: StepRequest, location: str, connect: bool) -> _Checked:
    operator = request.operator
    frame = request.frame
    event_time_column, delay_ms = stream_watermark(
        frame, operator.get("event_time_column"), operator.get("watermark_delay")
    )
    check_columns(frame, list(operator["key_columns"]), event_time_column)
    output_event = operator.get("output_event_time_column")
    if output_event is not None and output_event not in output_struct(operator["output_schema"]).fieldNames():
        msg = f"output_event_time_column {output_event!r} is not a column of the output schema"
        raise ConfigError(msg)
    spark = frame.sparkSession
    processor = adapted(operator["processor"], operator.get("processor_api", "pandas"), InputChunks.of(spark))
    cfg = job_config(spark_conf(spark), operator.get("config"), location)
    if connect:
        cfg = connect_config(cfg, operator.get("initial_state"))
    checked_layout(cfg)
    mode = _time_mode(operator, event_time_column)
    return _Checked(request, location, cfg, processor, mode, event_time_column, delay_ms)


@dataclass(frozen=True)
class _Prepared:
    """A step ready to run: its spec, and what its progress is read with."""

    cfg: Config
    spec: QuerySpec
    parallelism: int
    state_dir: str
    declared: Mapping[str, int]


def _prepared(
    step: _Checked, *, idle: bool, sink: Sink, next_step: NextStep | None, trigger_interval_s: float
) -> _Prepared:
    """Record (or check) the step's shape at its location and build its spec.

    :param idle: whether the query's batches may run on an idle stream (as wanted by the
        first step; later steps follow what the first recorded).
    :param trigger_interval_s: the query's processing-time trigger interval (0: none).
    """
    operator, cfg, processor = step.operator, step.cfg, step.processor
    parallelism, _, state_dir = checked_layout(cfg)
    job_id = resolve_job_id(step.location, operator.get("job_id"), cfg, legacy_state_dir=state_dir)
    declared = processor if isinstance(processor, PySparkProcessorFactory) else None
    wanted = QueryShape(
        key_types(step.request.frame, list(operator["key_columns"])),
        step.mode.value,
        idle,
        declared.schemas if declared is not None else {},
        state_kinds=declared.state_kinds if declared is not None else {},
        expiring_states=declared.expiring_states if declared is not None else frozenset(),
    )
    settled = settled_shape(step.location, wanted, cfg)
    if declared is not None:  # values name the schema they were written with
        processor = replace(
            declared, value_versions={name: settled.versions_of(name) for name in declared.schemas}
        )
    spec = QuerySpec(
        job_id,
        operator.get("operator_id", "stateful"),
        tuple(operator["key_columns"]),
        output_struct(operator["output_schema"]),
        processor,
        sink,
        step.mode,
        step.event_time_column,
        step.delay_ms,
        operator.get("initial_state"),
        settled.idle_batches and step.request.before is None,  # only the stream carries heartbeat rows
        settled.idle_batches,
        next_step,
        trigger_interval_s,
    )
    return _Prepared(cfg, spec, parallelism, state_dir, declared.state_counts if declared is not None else {})


def start_query(
    steps: Sequence[StepRequest],
    *,
    sink: Sink | str,
    checkpoint_location: str,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
) -> StatefulQuery:
    """Check every step at the call, record them, and start the query over the first step's stream.

    :raises ConfigError: when a step's keywords, columns or recorded shape do not fit.
    """
    source = steps[0].frame
    spark = source.sparkSession
    connect = is_connect(spark)
    checked = [
        _checked(request, step_location(checkpoint_location, i), connect) for i, request in enumerate(steps)
    ]
    _check_no_step_added(checked)
    no_data_batches = str(spark.conf.get(NO_DATA_BATCHES_CONF, "true")).strip().lower() == "true"
    # the stream gets the heartbeat when any step's timers can fire; the first step's record keeps it
    wanted_idle = any(
        wants_idle_batches(step.mode, trigger, no_data_batches=no_data_batches) for step in checked
    )
    final_sink: Sink = ParquetBatchSink(sink) if isinstance(sink, str) else sink
    interval = processing_interval_s(trigger)
    first = _prepared(
        checked[0], idle=wanted_idle, sink=final_sink, next_step=None, trigger_interval_s=interval
    )
    idle = first.spec.idle_batches
    # later steps are built from the last: each is the one before's next step
    downstream: list[tuple[_Prepared, ChainedStep]] = []
    next_step: ChainedStep | None = None
    for step in reversed(checked[1:]):
        prepared = _prepared(
            step, idle=idle, sink=final_sink, next_step=next_step, trigger_interval_s=interval
        )
        before = step.request.before or (lambda frame: frame)
        next_step = ChainedStep(prepared.cfg, prepared.spec, before, records_progress=connect)
        downstream.insert(0, (prepared, next_step))
    first = replace(first, spec=replace(first.spec, next_step=next_step))
    function: Sink
    ledger: BatchLedger
    operators: list[tuple[Callable[[int], BatchProgress | None], int]] = []
    if connect:  # the runner is built where Connect runs the function: on the server
        function = ServerSideRunner(first.cfg, first.spec)
        records = ProgressRecords(first.state_dir, first.spec.job_id, first.cfg)
        for prepared, _ in downstream:
            later = ProgressRecords(prepared.state_dir, prepared.spec.job_id, prepared.cfg)
            operators.append((later.read, prepared.parallelism))
        bridge = ProgressBridge(records.read, first.parallelism, first.declared, operators)
        ledger = RecordedLedger(bridge, first.state_dir, first.spec.job_id, first.cfg)
    else:
        runner = BatchRunner(first.cfg, first.spec)
        function, ledger = runner, RunnerLedger(runner)
        operators = [(chained.progress_of, prepared.parallelism) for prepared, chained in downstream]
        bridge = ProgressBridge(runner.progress_of, first.parallelism, first.declared, operators)
    stream = with_heartbeat(source) if idle else source
    writer = stream.writeStream.foreachBatch(function).option("checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    hub = hub_of(spark)
    hub.join(bridge)
    try:
        query = writer.start()
    except BaseException:
        hub.leave(bridge)
        raise
    bridge.bind(str(query.id), lambda: hub.leave(bridge))
    return StatefulQuery(ledger, query, bridge, lambda: hub.leave(bridge))

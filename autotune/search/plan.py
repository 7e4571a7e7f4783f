"""``autotune plan``: the predicted memory of a search space (or one configuration) on a number of
devices this machine need not have, in seconds and without running a step.

Only knobs that move memory are enumerated (``memory_model.MEMORY_FIELDS``, with DataLoader
workers for CPU ranks only); the others keep their defaults. Left at their defaults too:
``torch.compile`` (predicted as eager), the optimizer's implementation (the optimizer as
built), DDP's bucket size (a compressed bucket, tens of MiB at most) and the CUDA allocator's
setting (learnt from trials, not traced). Every number is a prediction
(``autotune.search.memory_model``) and is labelled as one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.runner.fake_memory import MODEL_AT_FAULT
from autotune.runner.planned_gpu import Properties
from autotune.runner.workload import WorkloadSpec, describe_optimizer
from autotune.search.calibration import Point, fit, prior_for
from autotune.search.memory_model import (
    MEMORY_FIELDS,
    MemoryModel,
    Prediction,
    config_kind,
)
from autotune.search.meta_build import configures_optimizer
from autotune.search.model_facts import (
    check_segments,
    every_block_at_one,
    idle_blocks,
    repeated_blocks,
)
from autotune.search.probe import blocks_phrase, every_block, idle_reason
from autotune.search.refusals import (
    check_refusals,
    dataset_refusals,
    fsdp_bf16_refusals,
    model_refusals,
)
from autotune.search.side_by_side import processes_here
from autotune.search.space import Param, SearchSpace, enumerate_configs
from autotune.search.step_traces import Kind

NOT_ENUMERATED = (
    "device",
    "compile",
    "optimizer_impl",
    "bucket_cap_mb",
    "expandable_segments",
    "optimizer_in_backward",
)
"""Memory knobs a table leaves at their defaults (``--config`` plans one set otherwise). The
optimizer stepped in backward holds no more than the same step after backward: enumerated, its
one-device rows (22 of 5,841 for ``gpt2_124m`` at 64 devices) took 12 traces more, two steps
each, and the default plan 66 s instead of 21 (Intel Xeon, 2 cores)."""
MEMORY_KNOBS = tuple(k for k in MEMORY_FIELDS if k not in NOT_ENUMERATED)
"""The knobs ``plan`` enumerates (accumulation is how the micro-batch is chosen; workers only
count on CPU)."""


@dataclass(frozen=True)
class PlanRow:
    config: TrainConfig
    prediction: Prediction

    def fits(self, limit_bytes: int) -> bool:
        return self.prediction.peak_bytes <= limit_bytes


def _rank(row: PlanRow) -> tuple[int, bool, int, bool, int]:
    """How a row ranks for the largest micro-batch that fits (higher is better): at the same
    micro-batch, without CPU offload before with less checkpointing (moving every step's shards,
    gradients and optimizer step over the host link costs more than recomputing activations),
    then the least checkpointing, selective before full (less recomputed), then the least
    memory."""
    c = row.config
    return (c.micro_batch_size, not c.fsdp_cpu_offload, -c.checkpoint_segments,
            c.checkpoint_policy == "selective", -row.prediction.peak_bytes)  # fmt: skip


@dataclass
class Plan:
    """The predicted peak per device of every configuration, against a limit."""

    devices: int
    device_type: str
    limit_bytes: int
    rows: list[PlanRow] = field(default_factory=list)
    trace_error: str | None = None
    assumption: str | None = None
    """What the trace assumed of the data (a mixture of experts' routing), or None."""
    calibration: str = ""
    left_out: list[str] = field(default_factory=list)
    """Choices of the space this model cannot take, each with why (one line each)."""
    added: list[str] = field(default_factory=list)
    """Choices added to the space for this model, each with why (``probe.every_block``)."""
    needs_find_unused_parameters: bool = False
    """The trace showed DDP to need ``find_unused_parameters`` (``TensorPeak``'s reasons)."""
    beyond: PlanRow | None = None
    """Where nothing in the space fits: its least-memory configuration with every repeated
    block checkpointed at micro-batch 1, predicted, where the space stops short of that
    (``_beyond_space``); None otherwise."""
    optimizer: str = ""
    """Whose optimizer's state the traces counted, in words (the default says how to give one)."""
    gpu: str = ""
    """The GPU a plan for CUDA is for, in words (``planned_gpu.gpu_words``); "" for CPU."""
    gpu_properties: Properties | None = None
    """Its name, capability and memory, as ``torch.cuda.get_device_properties`` gives them."""

    def fitting(self) -> list[PlanRow]:
        return [r for r in self.rows if r.fits(self.limit_bytes)]

    def largest_micro_batches(self) -> dict[tuple[str, str], PlanRow]:
        """Per (parallel mode, precision: AMP or FSDP's policy): the fitting row with the
        largest micro-batch (the least checkpointing among those, then without CPU offload,
        which costs time, where that fits too)."""
        best: dict[tuple[str, str], PlanRow] = {}
        for row in self.fitting():
            c = row.config
            precision = (
                f"amp={c.amp}"
                if c.fsdp_mixed_precision == "off"
                else f"fsdp-mp={c.fsdp_mixed_precision}"
            )
            key = (f"{c.parallel}x{c.world_size}", precision)
            held = best.get(key)
            if held is None or _rank(row) > _rank(held):
                best[key] = row
        return best

    def least_memory(self) -> PlanRow | None:
        return min(self.rows, key=lambda r: r.prediction.peak_bytes, default=None)

    def gpu_json(self) -> dict[str, Any] | None:
        """The GPU a plan for CUDA is for: name, capability, memory, and the plan's words."""
        gpu = self.gpu_properties
        if gpu is None:
            return None
        return {
            "name": gpu.name,
            "capability": f"{gpu.major}.{gpu.minor}",
            "total_memory_bytes": gpu.total_memory,
            "said": self.gpu,
        }

    def to_json(self) -> str:
        least = self.least_memory()
        return json.dumps(
            {
                "devices": self.devices,
                "device_type": self.device_type,
                "limit_bytes": self.limit_bytes,
                "predicted": True,
                "calibration": self.calibration,
                "optimizer": self.optimizer,
                "gpu": self.gpu_json(),
                "trace_error": self.trace_error,
                "assumption": self.assumption,
                "left_out": self.left_out,
                "added": self.added,
                "needs_find_unused_parameters": self.needs_find_unused_parameters,
                "configurations": [_row_json(r, self.limit_bytes) for r in self.rows],
                "largest_micro_batch": {
                    f"{mode} {precision}": _row_json(r, self.limit_bytes)
                    for (mode, precision), r in self.largest_micro_batches().items()
                },
                "least_memory": _row_json(least, self.limit_bytes) if least else None,
                "beyond_space": _row_json(self.beyond, self.limit_bytes) if self.beyond else None,
            },
            indent=2,
        )


def _row_json(row: PlanRow, limit_bytes: int) -> dict[str, Any]:
    return {
        "config": row.config.model_dump(mode="json"),
        "summary": row.config.summary(),
        **prediction_json(row.prediction, row.config),
        "fits": row.fits(limit_bytes),
    }


def prediction_json(prediction: Prediction, config: TrainConfig) -> dict[str, Any]:
    """A prediction as JSON: the peak and the parts it is made of, each a prediction, and what
    each covers: on CUDA both one device; on CPU the peak is every rank of the host together
    (as a budget there is), the parts one rank's."""
    on_cpu = config.device == "cpu"
    return {
        "predicted_peak_bytes": prediction.peak_bytes,
        "predicted_peak_covers": (
            f"all {config.processes} rank(s) of the host together" if on_cpu else "one device"
        ),
        "predicted_parts_bytes": dict(prediction.parts),
        "predicted_parts_cover": "one rank" if on_cpu else "one device",
        "source": prediction.source,
    }


def plan_space(space: SearchSpace, devices: int, device_type: str) -> SearchSpace:
    """``space`` cut down to the knobs that move memory, with world sizes up to ``devices``
    (``devices`` itself included) and accumulation as the space lists it."""
    params: dict[str, Param] = {}
    for name, param in space.params.items():
        if name not in MEMORY_KNOBS:
            continue
        if name == "num_workers" and device_type != "cpu":
            continue
        if name == "fsdp_cpu_offload" and device_type == "cpu":
            continue  # the host is the device: offloading moves nothing
        if name == "parallel" and device_type == "cpu":
            choices = tuple(c for c in param.choices if c != "dp")
            param = param.model_copy(update={"choices": choices})
        if name == "comm_hook" and device_type == "cpu":
            param = param.model_copy(
                update={"choices": tuple(c for c in param.choices if c != "bf16")}
            )
        if name == "world_size":
            sizes = {c for c in param.choices if isinstance(c, int) and c <= devices}
            param = param.model_copy(update={"choices": tuple(sorted(sizes | {devices}))})
        params[name] = param
    return SearchSpace(params=params)


def make_plan(
    workload: WorkloadSpec,
    *,
    devices: int,
    limit_bytes: int,
    device_type: str,
    global_batch_size: int,
    space: SearchSpace | None = None,
    config: TrainConfig | None = None,
    measure: Callable[[TrainConfig], int | None] | None = None,
    progress: Callable[[str], None] | None = None,
    gpu: Properties | None = None,
    gpu_said: str = "",
) -> Plan:
    """The plan of ``space`` (or of ``config`` alone) on ``devices`` devices (``gpu``: the GPU
    a plan for CUDA is for, ``gpu_said`` in words). ``measure`` (a
    short real trial on this machine, returning the peak one device measured) calibrates the
    process's share first, on the plan's least micro-batch on one device. ``progress`` is told
    what takes time, in words (each traced step: seconds each). A table's steps are traced one
    per core, where forking is safe (``side_by_side``)."""
    added: list[str] = []
    if config is not None:
        configs = [config]
    elif space is not None:
        found = repeated_blocks(workload)
        space, line = every_block(space, *(found or (None, "")))
        added += [line] if line else []
        fixed = {"global_batch_size": global_batch_size, "device": device_type}
        configs = [
            c
            for c in enumerate_configs(plan_space(space, devices, device_type), fixed)
            if c.world_size <= devices
        ]
    else:
        raise ConfigError("plan needs a search space or a configuration")
    configs, left_out = _checkpointable(workload, configs, config is not None)
    configs, left_out = _refused(workload, configs, config is not None, left_out)
    if config is None and space is not None:
        left_out += _unsplittable(plan_space(space, devices, device_type), global_batch_size)
        spread = sorted({c.parallel for c in configs if c.parallel != "single"})
        if devices == 1 and spread:  # as the search drops them: one process has no one to share
            configs = [c for c in configs if c.parallel == "single"]
            left_out.append(f"parallel {', '.join(spread)}: needs more than one device; 1 planned")
    if progress is not None and configs:
        progress(
            f"predicting {len(configs):,} configuration(s): each distinct training step traced "
            "once on this machine's CPU, no memory taken"
            + (", the others interpolated between them" if len(configs) > 1 else "")
        )
        if device_type == "cpu":
            progress("measuring what a rank process of this workload holds beyond its tensors")
    compiled = any(c.compile != "off" for c in configs)  # a configuration given alone, only
    model = MemoryModel(workload, device_type, prior_for(device_type, workload, (), compiled))
    model.tracing = progress
    if len(configs) > 1:
        model.interpolate_between(configs)
        model.trace_ahead(configs, processes_here())
    if measure is not None and configs:
        _calibrate(model, configs, measure, global_batch_size, device_type)
    rows, models = _predicted(model, configs), [model]
    # a failure of the model's own (not of fake tensors' limits, which hold for every step):
    # of one kind of step, or of every one?
    if model.trace_error and MODEL_AT_FAULT in model.trace_error and config is None:
        apart = _kinds_apart(model, configs)
        if apart is not None:
            rows, models, failing = apart
            left_out += failing
    model = models[0]  # a model that traced: its assumptions, and the steps beyond the space
    beyond = _beyond_space(model, rows, limit_bytes, workload) if config is None else None
    calibrated = model.calibration or model.prior
    copied = model.prior.epoch_copy
    copies = (
        f"; over an epoch each DataLoader worker also copies {copied} of the dataset's Python "
        "objects as it reads them, beyond these figures"
        if copied and any(c.num_workers for c in configs)
        else ""
    )
    return Plan(
        devices=devices,
        device_type=device_type,
        limit_bytes=limit_bytes,
        rows=rows,
        trace_error=model.trace_error,
        assumption="; ".join(dict.fromkeys(a for m in models if (a := m.assumption))) or None,
        left_out=left_out,
        added=added,
        needs_find_unused_parameters=any(m.needs_unused_parameters for m in models),
        beyond=beyond,
        optimizer=describe_optimizer(workload, configures_optimizer(workload.model)),
        gpu=gpu_said,
        gpu_properties=gpu,
        calibration=calibrated.describe()
        if calibrated.trials
        else (
            f"the tensors x{calibrated.scale:.2f} for the caching allocator's reserve (12-41% "
            "over them on an H200, GPT-2 small in bf16); trials that ran teach the rest"
            if device_type == "cuda"
            else f"a rank of this workload measured here without its tensors "
            f"({calibrated.offset_bytes / 2**20:,.0f} MiB), the tensors x"
            f"{calibrated.scale:.2f} for the heap's kept pages; each DataLoader worker "
            f"{calibrated.per_worker_bytes / 2**20:,.0f} MiB, measured beside that rank, and "
            f"together x{calibrated.forked_scale:.2f} the tensors their rank forks them from "
            "(its parameters for persistent workers, else its whole step)"
        )
        + copies,
    )


def _predicted(model: MemoryModel, configs: list[TrainConfig]) -> list[PlanRow]:
    """``configs`` predicted in turn, up to the first that cannot be (``trace_error``)."""
    rows = []
    for c in configs:
        prediction = model.predict(c)
        if prediction is None:
            break
        rows.append(PlanRow(c, prediction))
    return rows


def _kinds_apart(
    model: MemoryModel, configs: list[TrainConfig]
) -> tuple[list[PlanRow], list[MemoryModel], list[str]] | None:
    """Where a step of ``configs`` could not be traced, each kind of step (its precision, and
    whether it checkpoints) planned on its own: a kind whose step fails (attention whose code
    enables CUDA's flash kernel alone, in float32; checkpointing a model whose blocks the meta
    build could not see) is left out with a line saying why, not the whole plan. The rows, the
    models that traced, the lines; None where no kind traces (the model's own failure)."""
    kinds: dict[Kind, list[TrainConfig]] = {}
    for c in configs:
        kinds.setdefault(config_kind(c), []).append(c)
    if len(kinds) < 2:
        return None
    rows: list[PlanRow] = []
    models: list[MemoryModel] = []
    failing: dict[str, list[Kind]] = {}
    for kind, members in kinds.items():
        alone = MemoryModel(model.workload, model.device_type, model.prior, model.calibration)
        if len(members) > 1:
            alone.interpolate_between(members)
        predicted = _predicted(alone, members)
        if alone.trace_error:
            failing.setdefault(alone.trace_error, []).append(kind)
        else:
            rows, models = rows + predicted, [*models, alone]
    if not models:
        return None
    order = {id(c): i for i, c in enumerate(configs)}
    rows.sort(key=lambda r: order[id(r.config)])
    lines = [
        f"{_kinds_phrase(k, set(kinds))}: the step fails under fake tensors: {e}"
        for e, k in failing.items()
    ]
    return rows, models, lines


def _kinds_phrase(failing: list[Kind], present: set[Kind]) -> str:
    """The configurations of the ``failing`` kinds of step (precision, checkpointing), of the
    ``present`` ones, in the words of their knobs."""
    amp = {"fp32": "amp off", "16-bit": "amp fp16, bf16 (and FSDP's bf16 parameters)"}
    selective = any(kind[1] == "selective" for kind in present)
    ckpt = {
        "full": "checkpoint_segments above 0" + (", checkpoint_policy full" if selective else ""),
        "selective": "checkpoint_policy selective",
        "": "checkpoint_segments 0",
    }
    for place, words in ((0, amp), (1, ckpt)):
        values = {kind[place] for kind in failing}
        if len(values) == 1 and all(k in failing for k in present if k[place] in values):
            return words[values.pop()]
    return "; ".join(f"{amp[p]} with {ckpt[k]}" for p, k in failing)


def _beyond_space(
    model: MemoryModel, rows: list[PlanRow], limit_bytes: int, workload: WorkloadSpec
) -> PlanRow | None:
    """Where nothing in the space fits, its least-memory configuration with the model's own
    levers pulled as far as they go, predicted: every repeated block that keeps something for
    backward checkpointed, at micro-batch 1 (accumulation makes up the global batch). A narrow
    space (the quick one checkpoints at most 2 of a 32-layer model's blocks) would otherwise
    send a user to more devices where checkpointing fits. None where something fits, or the
    space already reaches that configuration."""
    if not rows or any(r.fits(limit_bytes) for r in rows):
        return None
    least = min(rows, key=lambda r: r.prediction.peak_bytes).config
    further = every_block_at_one(least, workload)
    if further is None or any(r.config.key() == further.key() for r in rows):
        return None  # nothing beyond, or a row of the space already
    prediction = model.predict(further)
    return PlanRow(further, prediction) if prediction is not None else None


def _unsplittable(space: SearchSpace, global_batch_size: int) -> list[str]:
    """The world sizes of ``space`` that ``global_batch_size`` cannot be split over, each with
    why (no configuration of them is in the plan)."""
    param = space.params.get("world_size")
    sizes = [s for s in (param.choices if param else ()) if isinstance(s, int)]
    bad = [s for s in sizes if global_batch_size % s]
    if not bad:
        return []
    every = math.lcm(*sizes)
    least = every * -(-global_batch_size // every)  # splits over every size of the space
    return [
        f"world_size {', '.join(map(str, bad))}: global batch {global_batch_size} cannot be "
        f"split evenly over that many ranks (--global-batch-size {least}, or another multiple "
        f"of {every}, plans them)"
    ]


def _checkpointable(
    workload: WorkloadSpec, configs: list[TrainConfig], one: bool
) -> tuple[list[TrainConfig], list[str]]:
    """``configs`` without those that checkpoint more blocks than the model repeats, or blocks
    that keep nothing for backward (``model_facts.idle_blocks``), as the search's probe drops them,
    and lines saying which were left out; for a configuration given alone, a one-line error
    instead where it asks for more blocks than there are. A model that cannot be built on the
    meta device is left to the trace."""
    found = repeated_blocks(workload)
    if found is None:
        return configs, []
    count, name = found
    kept = [c for c in configs if c.checkpoint_segments <= count]
    blocks = blocks_phrase(count, name)
    if one and len(kept) < len(configs):
        check_segments(workload, configs[0].checkpoint_segments)  # in a rank's words
    lines = _dropped_segments(configs, kept, f"the model has {blocks}")
    idle = idle_blocks(workload) if not one else 0
    if idle:
        useful = [c for c in kept if c.checkpoint_segments <= count - idle]
        lines += _dropped_segments(kept, useful, idle_reason(idle, blocks))
        kept = useful
    return kept, lines


def _dropped_segments(
    configs: list[TrainConfig], kept: list[TrainConfig], reason: str
) -> list[str]:
    """A line naming the checkpoint_segments values in ``configs`` and not in ``kept``, and
    why; none where nothing was left out."""
    dropped = sorted(
        {c.checkpoint_segments for c in configs} - {c.checkpoint_segments for c in kept}
    )
    if not dropped:
        return []
    return [f"checkpoint_segments {', '.join(str(d) for d in dropped)}: {reason}"]


def _refused(
    workload: WorkloadSpec, configs: list[TrainConfig], one: bool, left_out: list[str]
) -> tuple[list[TrainConfig], list[str]]:
    """``configs`` without the values the model rules out (``refusals.model_refusals``, as the
    search's probe drops them), ``left_out`` with a line for each knob saying why; for a
    configuration given alone, a one-line error instead."""
    refusals = model_refusals(workload.model)
    if any(c.parallel == "fsdp" and c.fsdp_mixed_precision != "off" for c in configs):
        refusals += fsdp_bf16_refusals(workload)
    on_gpu = [c for c in configs if c.device != "cpu"]
    workers, pinned = {c.num_workers for c in on_gpu}, any(c.pin_memory for c in on_gpu)
    refusals += dataset_refusals(workload, "cuda" if on_gpu else "cpu", workers, pinned)
    if one:
        check_refusals(configs[0], workload.model, refusals)
    dropped: dict[tuple[str, str], list[str]] = {}
    for refusal in refusals:
        kept = [
            c
            for c in configs
            if getattr(c, refusal.knob) != refusal.value or not refusal.holds(c.device)
        ]
        if len(kept) < len(configs):
            dropped.setdefault((refusal.knob, refusal.reason), []).append(str(refusal.value))
        configs = kept
    lines = [f"{knob} {', '.join(values)}: {reason}" for (knob, reason), values in dropped.items()]
    return configs, [*left_out, *lines]


def _calibrate(
    model: MemoryModel,
    configs: list[TrainConfig],
    measure: Callable[[TrainConfig], int | None],
    global_batch_size: int,
    device_type: str,
) -> None:
    micro = min(c.micro_batch_size for c in configs)
    accum = global_batch_size // micro
    probe = TrainConfig(
        global_batch_size=global_batch_size, grad_accum_steps=accum, device=device_type
    )
    tensors = model.device_tensors(probe)
    measured = measure(probe)
    if tensors is not None and measured:
        model.calibration = fit([Point(sum(tensors.values()), 0, measured)], model.prior)

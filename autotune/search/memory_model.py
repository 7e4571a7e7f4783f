"""Every configuration's peak memory, predicted before it runs: tensors traced from the model,
what parallelism adds or shards, and the process around the tensors, calibrated on trials.

A prediction is never a measurement: it travels in its own fields (``Prediction``, a record's
``predicted_memory_bytes``) and is shown as one. The parts:

- tensors of one device, from ``autotune.runner.fake_memory.trace_step`` (the user's model,
  optimizer and loss under fake tensors) at the micro-batch, precision and checkpointing;
- accumulation adds the earlier micro-steps' gradients, held through each later forward and
  backward (the traced step's peak may come before any gradient exists);
- DDP adds its gradient buckets (a copy of every gradient: ``gradient_as_bucket_view`` is off),
  a compressing hook a compressed bucket, PowerSGD its error feedback (another copy);
- FSDP2 shards parameters, gradients and optimizer state over the devices (or, offloaded, keeps
  them in host memory) and gathers, at a time, the root's own parameters (not resharded after
  forward), the block running and the one prefetched, and one block's unsharded gradients before
  they are reduce-scattered;
- ``torch.compile`` is predicted as eager (Inductor usually holds less: an upper bound);
- the process: on CUDA the caching allocator's reserve over what is allocated, on CPU the
  interpreter, libraries and DataLoader workers (each its own pages, and together the old
  copies of the pages their rank writes after forking them). ``calibration.Calibration`` fits
  ``measured = scale * tensors + offset + workers * per_worker + forked_scale * forked`` (and
  more, below) to the trials that ran, pulled towards a prior where the trials cannot tell the
  parts apart.

Where the model defeats the fake tensors, ``predict`` returns None and says why
(``trace_error``); the search then falls back to its fit over measured trials
(``autotune.search.precheck``), which says that it predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.runner.fake_group import WORLD_PROBE
from autotune.runner.fake_memory import (
    CARRIED_STATE,
    FLEX_DENSE,
    FLEX_FUSED,
    GROUP_TRACED,
    HOST_OFFLOAD,
    LIKELIEST_DRAWS,
    RECURRENT_ON_CPU,
    SAMPLE_SHARES,
    UNIFORM_ROUTING,
    TensorPeak,
)
from autotune.runner.planned_gpu import asked_as_imported, assumed
from autotune.runner.workload import WorkloadSpec
from autotune.search.calibration import Calibration, Point, fit
from autotune.search.step_traces import Job, Kind, StepTraces, key_of, kind_of
from autotune.units import format_bytes

MEMORY_FIELDS = {
    "parallel": "DDP's buckets; FSDP's shards and what it gathers",
    "gradient_as_bucket_view": "DDP's buckets hold the gradients: no second copy",
    "bucket_cap_mb": "the bucket a compressing hook holds compressed",
    "world_size": "FSDP's shards",
    "fsdp_mixed_precision": "traced as bf16 autocast, FSDP's gathered parameters halved",
    "fsdp_cpu_offload": "on CUDA, FSDP's parameter, gradient and optimizer-state shards leave "
    "the device (on CPU they stay in the host memory measured)",
    "reshard_after_forward": "FSDP's blocks kept gathered from forward to backward, or not",
    "comm_hook": "a compressed bucket; PowerSGD's error feedback",
    "amp": "the step traced under its autocast",
    "checkpoint_segments": "the step traced with those blocks checkpointed",
    "checkpoint_policy": "the step traced with the policy's saved outputs held",
    "grad_accum_steps": "the micro-batch the step is traced at, and the gradients held from "
    "micro-step to micro-step (under FSDP, unsharded)",
    "compile": "predicted as eager: an upper bound",
    "expandable_segments": "the allocator's reserve over its tensors, learnt by the calibration "
    "from CUDA trials (one scale for both settings: an approximation)",
    "optimizer_impl": "the optimizer's step traced with that implementation (its temporaries)",
    "optimizer_in_backward": "the step traced with each parameter stepped in backward, its "
    "gradient freed then (two steps: the second beside the state the first made)",
    "num_workers": "each DataLoader worker's share, calibrated (CPU ranks only)",
    "device": "which kind of memory is predicted and calibrated",
}
"""How the memory model accounts for each field that moves memory."""

MEMORY_NEUTRAL_FIELDS = {
    "powersgd_rank": "its low-rank factors are rank x (rows + columns) per matrix: negligible "
    "beside the error feedback counted under comm_hook",
    "powersgd_start_iter": "when compression starts, not what it holds",
    "static_graph": "DDP's bookkeeping of the graph, no tensors of the model's size",
    "find_unused_parameters": "a traversal of the autograd graph, no tensors",
    "prefetch_factor": "a few batches queued in host memory, within each worker's share",
    "pin_memory": "page-locked host memory, not the device's",
    "matmul_precision": "how fp32 matmuls compute (TF32), not what they hold",
    "channels_last": "the same bytes in another layout",
    "persistent_workers": "keeps the same workers between epochs, not more of them",
    "max_grad_norm": "one norm per parameter and their total, scalars; the gradients are "
    "scaled in place",
}
"""Fields the model leaves out of the peak, and why. A test fails for a field in neither."""


def budget_scope(device_type: str) -> str:
    """What a memory budget or limit covers, in words: one device, or on CPU the host that all
    ranks of a trial share (what a CPU trial measures: ``MemoryModel.devices_counted``)."""
    return "for all ranks together (one host)" if device_type == "cpu" else "per device"


def traced_amp(config: TrainConfig) -> str:
    """The autocast the step is traced under: FSDP's bf16 policy computes as bf16 autocast
    does (bf16 activations), with its gathered parameters halved in ``device_parts``."""
    return "bf16" if config.fsdp_mixed_precision != "off" else config.amp


def job_of(config: TrainConfig, micro_batch: int, segments: int, world: int) -> Job:
    """The step to trace for ``config`` at ``micro_batch`` with ``segments`` blocks
    checkpointed, as one rank of ``world``: a table's corner, or its own."""
    return (
        micro_batch,
        traced_amp(config),
        segments,
        config.optimizer_impl,
        world,
        config.checkpoint_policy,
        config.optimizer_in_backward,
    )


def config_kind(config: TrainConfig) -> Kind:
    """The kind of step ``config`` traces (``step_traces.Kind``): its traced precision, and
    whether it checkpoints."""
    return kind_of(traced_amp(config), config.checkpoint_segments, config.checkpoint_policy)


def device_parts(peak: TensorPeak, config: TrainConfig) -> dict[str, int]:
    """The tensors one device holds at its peak under ``config``'s parallel mode, by part."""
    parts = {
        "parameters": peak.parameters_bytes,
        "gradients": peak.gradients_bytes,
        "optimizer state": peak.optimizer_bytes,
        "activations": peak.activations_bytes,
    }
    if config.parallel == "ddp":
        # With gradient_as_bucket_view the gradients live in the buckets: no second copy.
        parts["ddp buckets"] = 0 if config.gradient_as_bucket_view else peak.gradient_bytes_full
        if config.comm_hook in ("fp16", "bf16"):
            bucket = config.bucket_cap_mb * 2**20
            parts["compressed bucket"] = min(bucket, peak.gradient_bytes_full) // 2
        if config.comm_hook == "powersgd":
            parts["powersgd error feedback"] = peak.gradient_bytes_full
    if config.grad_accum_steps > 1 and config.parallel != "fsdp":
        parts["accumulated gradients"] = peak.accumulating_bytes
    if peak.dataset_on_device_bytes:  # each rank's own copy, through the whole run
        parts["dataset"] = peak.dataset_on_device_bytes
    if config.parallel == "fsdp":
        shards = config.world_size
        # Offloaded shards live in host memory: a CUDA device no longer holds them, while on a
        # CPU the host is what is measured.
        offloaded = config.fsdp_cpu_offload and config.device == "cuda"
        for name in ("parameters", "gradients", "optimizer state"):
            parts[name] = 0 if offloaded else parts[name] // shards
        # Gathered parameters are whole copies beside the local shards: the root's own (never
        # resharded after forward), and the blocks'.
        root = peak.outside_blocks_bytes
        if config.reshard_after_forward:  # the running block and the prefetched one
            blocks = 2 * peak.block_parameters_bytes
        else:  # every block stays gathered from its forward to its backward
            blocks = peak.parameters_bytes - peak.outside_blocks_bytes
        gathered = root + blocks + peak.block_parameters_bytes  # + its gradients
        if config.fsdp_mixed_precision != "off":
            gathered //= 2  # gathered and computed in bf16
        parts["fsdp gathered"] = gathered
        if config.grad_accum_steps > 1:  # no reduce-scatter before the last micro-step
            parts["fsdp unsharded gradients"] = peak.gradient_bytes_full - peak.gradients_bytes
    return parts


@dataclass(frozen=True)
class Prediction:
    """A configuration's predicted peak: never a measurement."""

    peak_bytes: int  # judged like a measurement: per device on CUDA, all ranks on CPU
    parts: dict[str, int]  # per device: the tensors by part, then the process's share
    source: str

    @property
    def tensors_bytes(self) -> int:
        beyond = ("process", "workers", "fsdp unsharded build", "compiled")
        return sum(v for k, v in self.parts.items() if k not in beyond)


EPOCH_COPY = (
    "each DataLoader worker copies the pages of the dataset's Python objects as it reads them "
    "(reading a sample writes their reference counts): over an epoch {each} a "
    "worker, {all:,.0f} MiB for {workers}, beyond the measured peak, which a trial's few "
    "batches do not show (measured beside a bare rank); samples held in tensors or NumPy "
    "arrays (one buffer, not an object each) are not copied, and fewer workers copy less"
)
CPU_KERNEL_CACHES = (
    "on CPU, autocast's oneDNN kernels are compiled per shape and cached (up to 1,024 in each "
    "of two caches), and this model's shapes change from step to step (a mixture of experts' "
    "routing, sizes the batch's values decide: packed sequences' lengths, rows kept by their "
    "labels, or batches of different shapes: a graph batch's nodes, padding to each batch's "
    "longest sample): a rank's resident memory grows with every new shape, for a hundred steps "
    "and more, past what its trials measured, so the measured peak is a lower bound for a long "
    "run (examples/moe.py in bf16: {growth}; scripts/bench_cpu_growth.py measures a model's)"
)
"""Said of a CPU recommendation under autocast whose trace found sizes that routing or the
batch's values decide (a packed BiLSTM tagger's bf16 DDP configuration measured 1,130 MiB on
a fresh gang and 1,563-1,599 MiB after other bf16 trials in it: docs/benchmarks.md)."""

CPU_KERNEL_CACHE_GROWTH = "846 MiB after 3 steps, 2,128 MiB after 120, at micro-batch 16"
"""What ``scripts/bench_cpu_growth.py`` measured on the AMD EPYC of docs/benchmarks.md
(``results/cpu_growth.json``; with both caches held to one entry, 680 MiB, 1.9x slower per step)."""


@dataclass(frozen=True)
class Traced:
    """A configuration's traced tensors per device, by part, and the two shares the calibration
    scales apart from them: FSDP's unsharded build (``MemoryModel._unsharded``) and what its
    DataLoader workers are forked from (``MemoryModel.forked``)."""

    parts: dict[str, int]
    unsharded_bytes: int
    forked_bytes: int
    flex_fused_by_compile: bool = False  # FlexAttention traced dense, predicted fused

    @property
    def tensors_bytes(self) -> int:
        return sum(self.parts.values())


def _as_run(peak: TensorPeak, config: TrainConfig) -> TensorPeak:
    """``peak`` as ``config`` runs it: compiled, FlexAttention fused (``TensorPeak.compiled``)."""
    return peak.compiled() if config.compile != "off" else peak


@dataclass
class MemoryModel:
    """Predicts any ``TrainConfig`` of ``workload`` on ``device_type``; traces are cached by
    what they depend on (micro-batch, precision, checkpointing)."""

    workload: WorkloadSpec
    device_type: str
    prior: Calibration = field(default_factory=Calibration)
    calibration: Calibration | None = None
    untraced: set[Kind] = field(default_factory=set)
    """Kinds of step known to fail (``memory_gate``): not traced, so not predicted."""
    steps: StepTraces = field(init=False)
    _corners: tuple[tuple[int, int], tuple[int, int]] | None = None
    _world_dependent: bool | None = None  # None: no configuration of more processes traced

    def __post_init__(self) -> None:
        self.steps = StepTraces(self.workload, self.device_type)

    @property
    def trace_error(self) -> str | None:
        """Why a step could not be traced (then nothing more is predicted), or None."""
        return self.steps.error

    @property
    def tracing(self) -> Callable[[str], None] | None:
        """Told, in words, of each step about to be traced (seconds each)."""
        return self.steps.tracing

    @tracing.setter
    def tracing(self, told: Callable[[str], None] | None) -> None:
        self.steps.tracing = told

    @property
    def last_trace_s(self) -> float | None:
        """How long the last step traced took (None: none traced yet by this model)."""
        return self.steps.last_trace_s

    def interpolate_between(self, configs: Iterable[TrainConfig]) -> None:
        """Trace only the corners of ``configs``' micro-batches and checkpointing (per
        precision) and interpolate between them: for a table of many configurations.

        Bilinear interpolation is exact for a peak of the form a + b*mb + c*k + d*mb*k
        (activations grow with the micro-batch, and each checkpointed block drops its own); where
        the peak moves from the backward pass to the optimizer step at small micro-batches, the
        peak is the larger of two such forms, and the interpolation lies above it."""
        configs = list(configs)
        batches = [c.micro_batch_size for c in configs]
        segments = [c.checkpoint_segments for c in configs]
        self._corners = ((min(batches), max(batches)), (min(segments), max(segments)))

    @property
    def assumption(self) -> str | None:
        """What the traces assumed of values they do not have (a mixture of experts' routing,
        a random draw's branch), or None."""
        traces = self.steps.held.values()
        said = [UNIFORM_ROUTING] if self.routed else []
        said += [LIKELIEST_DRAWS] if any(t.drawn_branches for t in traces) else []
        said += [SAMPLE_SHARES] if self.sampled else []
        carried = sorted({name for t in traces for name in t.carried_state})
        said += [CARRIED_STATE.format(names=", ".join(carried))] if carried else []
        said += [GROUP_TRACED] if self.gathers else []
        recurrent = sorted({kind for t in traces for kind in t.recurrent_layers})
        if recurrent and self.device_type == "cuda":  # on CPU the trials run what was traced
            said += [RECURRENT_ON_CPU.format(names=", ".join(recurrent))]
        said += [FLEX_DENSE] if any(t.flex_dense_calls for t in traces) else []  # CUDA's only
        said += [FLEX_FUSED] if any(t.flex_fused_calls for t in traces) else []
        offloaded = max((t.offloaded_bytes for t in traces), default=0)  # CUDA's only
        said += [HOST_OFFLOAD.format(size=format_bytes(offloaded))] if offloaded else []
        asked = {name for t in traces for name in t.cuda_asked}  # CUDA's only
        asked |= asked_as_imported(self.workload) if self.device_type == "cuda" else set()
        gpu = assumed(asked)
        said += [gpu] if gpu else []
        return "; ".join(said) or None

    @property
    def needs_unused_parameters(self) -> bool:
        """Whether a trace showed DDP to need ``find_unused_parameters`` (``TensorPeak``'s)."""
        return any(t.needs_unused_parameters for t in self.steps.held.values())

    @property
    def gathers(self) -> bool:
        """Whether the traced step holds more as one rank of more (a gather from every rank,
        ``fake_group``): known once a configuration of more than one process was traced."""
        return bool(self._world_dependent)

    def _group_world(self, config: TrainConfig) -> int:
        """The ranks ``config``'s step is traced among: its processes where the step holds more
        among more (``gathers``), else one (one trace serves every world size)."""
        return config.processes if self._world_dependent else 1

    def _depends_on_world(self, config: TrainConfig) -> bool:
        """Whether ``config``'s step (a table's least corner: a trace it holds anyway) traced
        as one rank of many (``WORLD_PROBE``, or the config's more) holds other tensors than
        as the only rank: one trace more, once a workload."""
        one, many = (self.steps.get(job) for job in self._probes(config))
        if one is None or many is None:
            return False
        return not one.held_alike(many)

    def _probes(self, config: TrainConfig) -> list[Job]:
        """The two steps ``_depends_on_world`` compares: as the only rank, and as one of many."""
        mb, k = config.micro_batch_size, config.checkpoint_segments
        if self._corners is not None:
            (mb, _), (k, _) = self._corners
        world = max(WORLD_PROBE, config.processes)
        return [job_of(config, mb, k, 1), job_of(config, mb, k, world)]

    @property
    def sampled(self) -> bool:
        """Whether the traces read sizes from the batch's values (``fake_routing``'s)."""
        return any(t.sampled_selections for t in self.steps.held.values())

    @property
    def routed(self) -> bool:
        """Whether the traces estimated a mixture of experts' routing."""
        return any(t.routed_sizes for t in self.steps.held.values())

    @property
    def varying(self) -> bool:
        """Whether the user's collate function batches other samples into other shapes."""
        return any(t.varying_batches for t in self.steps.held.values())

    def trace_ahead(self, configs: Iterable[TrainConfig], processes: int) -> None:
        """Trace every step ``configs``' predictions will look up, ``processes`` at a time
        (``side_by_side``: a table's plan), before they are predicted one by one. A step no
        copy answered for is traced when it is looked up, as without this."""
        configs = list(configs)
        spread = next((c for c in configs if c.processes > 1), None)
        while processes > 1 and self.trace_error is None:
            jobs = self.steps.missing(self._looked_up(configs, spread))
            if jobs:
                self.steps.ahead(jobs, processes)
            if self.trace_error or spread is None or self._world_dependent is not None:
                return
            self._world_dependent = self._depends_on_world(spread)  # then its worlds' steps

    def _looked_up(self, configs: list[TrainConfig], spread: TrainConfig | None) -> list[Job]:
        """The steps predicting ``configs`` looks up, in that order (at the world each is traced
        among, once ``_world_dependent`` is known; before, the probe's two steps too)."""
        jobs: list[Job] = []
        for config in configs:
            world = self._group_world(config)
            if config is spread and self._world_dependent is None:
                jobs += self._probes(config)
            jobs += [job_of(config, mb, k, world) for mb, k in self._steps(config, world)]
        return jobs

    def tensor_peak(self, config: TrainConfig) -> TensorPeak | None:
        """The single-device tensor trace ``config`` needs, as ``config`` runs it (compiled:
        ``TensorPeak.compiled``), or None (``trace_error`` says why)."""
        eager = self._eager_peak(config)
        return None if eager is None else _as_run(eager, config)

    def _eager_peak(self, config: TrainConfig) -> TensorPeak | None:
        if config_kind(config) in self.untraced:
            return None
        if config.processes > 1 and self._world_dependent is None:
            self._world_dependent = self._depends_on_world(config)
        return self._tensor_peak(config, self._group_world(config))

    def _tensor_peak(self, config: TrainConfig, world: int) -> TensorPeak | None:
        mb, k = config.micro_batch_size, config.checkpoint_segments
        looked_up = self._steps(config, world)
        if looked_up == [(mb, k)]:
            return self.steps.get(job_of(config, mb, k, world))
        assert self._corners is not None
        (mb0, mb1), (k0, k1) = self._corners
        corners = {(b, s): self.steps.get(job_of(config, b, s, world)) for b, s in looked_up}
        if any(c is None for c in corners.values()):
            return None
        u = (mb - mb0) / (mb1 - mb0) if mb1 > mb0 else 0.0
        v = (k - k0) / (k1 - k0) if k1 > k0 else 0.0
        weights: dict[tuple[int, int], float] = {}
        for corner, weight in (
            ((mb0, k0), (1 - u) * (1 - v)),
            ((mb1, k0), u * (1 - v)),
            ((mb0, k1), (1 - u) * v),
            ((mb1, k1), u * v),
        ):  # corners coincide where the table has one micro-batch or one checkpointing
            weights[corner] = weights.get(corner, 0.0) + weight
        # names: every corner's, not mixed
        named = ("carried_state", "recurrent_layers", "cuda_asked")
        fields = [name for name in TensorPeak.__dataclass_fields__ if name not in named]
        mixed: dict[str, Any] = {
            name: round(sum(w * getattr(corners[c], name) for c, w in weights.items()))
            for name in fields
        }
        for name in named:
            mixed[name] = tuple(
                sorted({n for p in corners.values() if p for n in getattr(p, name)})
            )
        return TensorPeak(**mixed)

    def _steps(self, config: TrainConfig, world: int) -> list[tuple[int, int]]:
        """The micro-batches and checkpointed blocks traced for ``config``: its own, or the four
        corners of the table around it (``interpolate_between``)."""
        mb, k = config.micro_batch_size, config.checkpoint_segments
        key = key_of(job_of(config, mb, k, world))
        if self._corners is None or key in self.steps.held:
            return [(mb, k)]
        (mb0, mb1), (k0, k1) = self._corners
        return [(b, s) for b in (mb0, mb1) for s in (k0, k1)]

    def device_tensors(self, config: TrainConfig) -> dict[str, int] | None:
        peak = self.tensor_peak(config)
        return None if peak is None else device_parts(peak, config)

    def traced(self, config: TrainConfig) -> Traced | None:
        """What ``config``'s trace gives a prediction and the calibration, from one look-up of
        it (an interpolated one is mixed at each): None where it cannot be traced."""
        eager = self._eager_peak(config)
        if eager is None:
            return None
        peak = _as_run(eager, config)
        parts = device_parts(peak, config)
        unsharded, forked = self._unsharded(peak, config), self._forked(parts, config)
        return Traced(parts, unsharded, forked, flex_fused_by_compile=peak is not eager)

    def calibrate(self, records: Iterable[TrialRecord]) -> Calibration:
        """Fit the process's share to every trial that ran to the end and was measured."""
        points = [p for p in map(self.point, records) if p is not None]
        self.calibration = fit(points, self.prior)
        return self.calibration

    def point(self, record: TrialRecord) -> Point | None:
        """What ``record`` tells the calibration (its traced tensors beside what one device
        measured), or None: it did not run to the end, or its configuration cannot be traced."""
        if record.status != "ok" or record.memory_used_bytes is None or not record.config:
            return None
        config = record.config
        traced = self.traced(config)
        if traced is None:
            return None
        return Point(
            traced.tensors_bytes,
            self.workers(config),
            record.memory_used_bytes // self.devices_counted(config),
            traced.unsharded_bytes,
            config.compile != "off",
            traced.forked_bytes,
        )

    def devices_counted(self, config: TrainConfig) -> int:
        """How many devices a measured figure sums: on CPU all ranks share one host."""
        return config.processes if self.device_type == "cpu" else 1

    def _unsharded(self, peak: TensorPeak, config: TrainConfig) -> int:
        """The whole model an FSDP rank builds before sharding it, where what is measured holds
        it: a CPU rank's heap keeps its pages. A CUDA device never holds it whole: the rank builds
        it in host memory and ``fully_shard`` moves one block at a time to the device as it
        shards it, whose cached memory the step reuses (0 for other modes)."""
        cpu_fsdp = config.parallel == "fsdp" and self.device_type == "cpu"
        return peak.parameters_bytes if cpu_fsdp else 0

    def workers(self, config: TrainConfig) -> int:
        return config.num_workers if self.device_type == "cpu" else 0  # host memory on CUDA

    def forked(self, config: TrainConfig) -> int:
        """What a CPU rank holds when it forks its DataLoader workers and writes again after,
        whose old copies the workers keep (copy on write) while they live: persistent workers
        are forked once, before the first step, from a rank holding its parameters; others at
        every epoch, from a rank holding its whole step (its heap's pages, parameters and
        optimizer state, all written again by the next step). Measured on ``gpt_small``, one
        rank in fp32: one worker added 567 MiB, a persistent one 33 (its step's tensors 730 MiB,
        ``results/memory_prediction_workers.json``). 0 without workers, and on CUDA (host
        memory)."""
        traced = self.traced(config) if self.workers(config) else None
        return traced.forked_bytes if traced is not None else 0

    def _forked(self, parts: dict[str, int], config: TrainConfig) -> int:
        """``forked`` of ``config``, whose tensors per device by part are ``parts``."""
        if not self.workers(config):
            return 0
        return parts.get("parameters", 0) if config.persistent_workers else sum(parts.values())

    def predict(self, config: TrainConfig) -> Prediction | None:
        traced = self.traced(config)
        if traced is None:
            return None
        parts = traced.parts
        calibration = self.calibration or self.prior
        tensors = traced.tensors_bytes
        workers = self.workers(config)
        unsharded = traced.unsharded_bytes
        compiled = config.compile != "off"
        forked = traced.forked_bytes
        per_device = calibration.apply(tensors, workers, unsharded, compiled, forked)
        shown = dict(parts)
        if unsharded:
            shown["fsdp unsharded build"] = int(calibration.build_scale * unsharded)
        if compiled and calibration.compiled_trials:
            shown["compiled"] = calibration.compile_bytes
        if workers:
            shown["workers"] = calibration.workers_bytes(workers, forked)
        shown["process"] = per_device - sum(shown.values())
        exact = key_of(
            job_of(
                config,
                config.micro_batch_size,
                config.checkpoint_segments,
                self._group_world(config),
            )
        )
        source = "fake-tensor trace" + ("" if exact in self.steps.held else ", interpolated")
        if compiled:
            source += (
                ", compiled as eager plus what compiled trials added"
                if calibration.compiled_trials
                else ", compiled as eager plus what compiling added to a small model's rank "
                f"here ({calibration.compile_bytes / 2**20:,.0f} MiB, measured; no compiled "
                "trial yet)"
                if calibration.compile_bytes
                else ", compile predicted as eager (no compiled trial yet)"
            )
        if traced.flex_fused_by_compile:
            source += ", FlexAttention as its fused kernel holds it"
        source += ", routing taken as uniform" if self.routed else ""
        source += f", {calibration.describe()}"
        return Prediction(per_device * self.devices_counted(config), shown, source)

    def margin_for(self, config: TrainConfig) -> float:
        """How far above the truth ``config``'s prediction may lie: the measured margin, but
        for a compiled configuration before any compiled trial has run, no less than the first
        guess's. Such a prediction is the eager one, and compiling can hold much less: on an
        H200, GPT-2 small's first compiled trial measured 9,028 MiB against 14,061 predicted
        (``results/gpu/h200_gpt2_small_search_partial.log``), where eager trials had narrowed
        the margin to what they showed."""
        calibration = self.calibration or self.prior
        if config.compile != "off" and not calibration.compiled_trials:
            return max(calibration.margin, calibration.prior_margin[0])
        return calibration.margin

    def caveats(self, config: TrainConfig) -> list[str]:
        """What ``config``'s measured peak does not cover on this device, for the
        recommendation (from what the traces found: run ``predict`` first)."""
        said = []
        cpu_autocast = self.device_type == "cpu" and traced_amp(config) != "off"
        if cpu_autocast and (self.routed or self.sampled or self.varying):
            said.append(CPU_KERNEL_CACHES.format(growth=CPU_KERNEL_CACHE_GROWTH))
        copied, workers = self.prior.epoch_copy, self.workers(config)
        if workers and copied:
            all_mib = workers * self.prior.epoch_copy_bytes / 2**20
            said.append(EPOCH_COPY.format(each=copied, workers=workers, all=all_mib))
        return said

"""The configuration of one training trial: every knob the search can turn, validated at the edge.

A ``TrainConfig`` is frozen: it is proposed by the search (or written by a user), travels to every
rank unchanged and is stored with the result. Rules that span several fields live together in
``_check_combinations`` so that one place says what may be combined with what.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.errors import ConfigError, validated

Parallel = Literal["single", "dp", "ddp", "fsdp"]
CommHook = Literal["none", "fp16", "bf16", "powersgd"]
Amp = Literal["off", "fp16", "bf16"]
Device = Literal["auto", "cpu", "cuda"]
MatmulPrecision = Literal["default", "highest", "high"]
OptimizerImpl = Literal["default", "foreach", "fused"]
CheckpointPolicy = Literal["full", "selective"]
CHECKPOINT_POLICIES: tuple[CheckpointPolicy, ...] = get_args(CheckpointPolicy)
"""The checkpointing policies, from the one that keeps the least for backward to the most."""
FsdpMixedPrecision = Literal["off", "bf16", "bf16-reduce-fp32"]
Compile = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
GRAPH_CAPTURING_MODES = ("reduce-overhead", "max-autotune")
"""torch.compile modes that capture CUDA graphs on CUDA (Inductor's cudagraph trees)."""


OFF_FIELDS = ("amp", "fsdp_mixed_precision", "compile")
"""Fields whose choices include "off": YAML 1.1 reads an unquoted ``off`` (or ``no``, ``false``)
as False, which they take to mean "off" (a config file or a search space written by hand)."""


def _off(value: Any) -> Any:
    """An ``OFF_FIELDS`` value as YAML read it: False is "off"."""
    return "off" if value is False else value


class TrainConfig(BaseModel):
    """One point of the search space: how to train, never what to train."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: int = Field(
        ge=1,
        description="Samples per optimizer step across all ranks; training semantics, never "
        "changed by the tuner.",
    )
    parallel: Parallel = Field(
        "single",
        description="single: one device; dp: torch.nn.DataParallel in one process (CUDA, >=2 "
        "GPUs); ddp: DistributedDataParallel; fsdp: fully sharded data parallel (FSDP2).",
    )
    world_size: int = Field(1, ge=1, description="Number of devices (ranks) the trial uses.")
    device: Device = Field(
        "auto", description="cuda, cpu, or auto (cuda when available, else cpu)."
    )
    comm_hook: CommHook = Field(
        "none",
        description="DDP gradient communication hook: none, fp16 or bf16 compression, powersgd.",
    )
    powersgd_rank: int = Field(1, ge=1, description="PowerSGD matrix approximation rank.")
    powersgd_start_iter: int = Field(
        2,
        ge=2,
        description="Optimizer step from which PowerSGD compresses (earlier steps all-reduce "
        "uncompressed); kept small so that a short trial measures compression.",
    )
    static_graph: bool = Field(
        False, description="DDP static_graph=True (not with gradient accumulation)."
    )
    find_unused_parameters: bool = Field(
        False,
        description="DDP find_unused_parameters=True: needed when a step leaves some parameters "
        "without a gradient (an unused head, a conditional branch); the search sets it itself.",
    )
    bucket_cap_mb: int = Field(
        25,
        ge=1,
        description="DDP gradient bucket size in MiB (PyTorch's default 25): larger buckets, "
        "fewer and larger all-reduces.",
    )
    gradient_as_bucket_view: bool = Field(
        False,
        description="DDP gradient_as_bucket_view=True: gradients are views into the "
        "communication buckets, not copies (one copy of the gradients less).",
    )
    reshard_after_forward: bool = Field(
        True,
        description="FSDP2: free each block's gathered parameters after its forward (true) or "
        "keep them until its backward (false: no second all-gather, more memory).",
    )
    fsdp_cpu_offload: bool = Field(
        False,
        description="FSDP2's CPUOffloadPolicy: parameter, gradient and optimizer-state shards "
        "live in host memory (pinned on CUDA), gathered to the device for compute; the "
        "optimizer steps on the CPU. A way to fit what fits no other way, at a cost in speed.",
    )
    fsdp_mixed_precision: FsdpMixedPrecision = Field(
        "off",
        description="FSDP2's mixed-precision policy, the FSDP form of AMP: bf16 gathers and "
        "computes with bf16 parameters and reduces gradients in bf16; bf16-reduce-fp32 reduces "
        "them in fp32. Not with amp.",
    )
    amp: Amp = Field(
        "off",
        description="Automatic mixed precision: off, fp16 (with a gradient scaler) or bf16.",
    )
    optimizer_impl: OptimizerImpl = Field(
        "default",
        description="The optimizer's implementation: foreach (multi-tensor kernels) or fused "
        "(one kernel per step), where its class takes the flag; default leaves it as built.",
    )
    optimizer_in_backward: bool = Field(
        False,
        description="Step the optimizer in backward: each parameter updated by an optimizer of "
        "its own as soon as its gradient is complete, and its gradient freed then, so that no "
        "step holds every gradient at once. One device (parallel=single), no accumulation, no "
        "fp16 scaler and no clipping: each needs every gradient at once.",
    )
    matmul_precision: MatmulPrecision = Field(
        "default",
        description="torch.set_float32_matmul_precision for fp32 matmuls: high lets CUDA use "
        "TF32 (Ampere and later); highest is full fp32; default leaves the process's own "
        "setting (the baseline's).",
    )
    checkpoint_segments: int = Field(
        0,
        ge=0,
        description="Activation checkpointing: 0 = off; k = the first k of the model's repeated "
        "blocks (those with a parameter that trains first, then frozen ones from the last) each "
        "run as one non-reentrant checkpoint segment (recomputed in backward). Must not exceed "
        "the number of repeated blocks.",
    )
    checkpoint_policy: CheckpointPolicy = Field(
        "full",
        description="What a checkpointed block keeps for backward: full keeps its input alone "
        "and recomputes its whole forward; selective also keeps the outputs of its matrix "
        "multiplications, convolutions and fused attention kernels and recomputes only the "
        "cheap ops (norms, activations, dropout): more memory than full, less recomputation. "
        "Needs checkpoint_segments >= 1.",
    )
    grad_accum_steps: int = Field(
        1,
        ge=1,
        description="Micro-batches per optimizer step; the micro-batch per rank is "
        "global_batch_size / (world_size * grad_accum_steps).",
    )
    max_grad_norm: float | None = Field(
        None,
        gt=0,
        description="Clip the gradients' total norm to this before each optimizer step "
        "(torch.nn.utils.clip_grad_norm_, after unscaling fp16's; over every rank's shards "
        "under FSDP); training semantics like the global batch, never changed by the tuner. "
        "None: no clipping.",
    )
    channels_last: bool = Field(
        False,
        description="Convolutions in channels-last memory format: the model's weights and its "
        "4-D image batches (N, C, H, W) stored NHWC, which tensor-core convolutions prefer.",
    )
    expandable_segments: bool = Field(
        False,
        description="The CUDA caching allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True): segments that grow in place, less fragmentation; set per "
        "trial in the rank, no effect on CPU.",
    )
    compile: Compile = Field(
        "off",
        description="torch.compile mode for the wrapped model (off: eager). Compiled after "
        "checkpointing and the parallel wrap; the first step's compilation is reported as "
        "compile_s, never measured as a step.",
    )
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    prefetch_factor: int | None = Field(
        None, ge=1, description="Batches each DataLoader worker loads ahead (needs workers)."
    )
    pin_memory: bool = Field(False, description="DataLoader pin_memory (CUDA only).")
    persistent_workers: bool = Field(
        False, description="Keep DataLoader workers alive across epochs (needs workers)."
    )

    @field_validator(*OFF_FIELDS, mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return _off(value)

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainConfig:
        problems: list[str] = []
        if self.parallel == "single" and self.world_size != 1:
            problems.append(f"parallel=single needs world_size=1, got world_size={self.world_size}")
        if self.parallel == "dp":
            if self.world_size < 2:
                problems.append(
                    f"parallel=dp needs world_size >= 2 GPUs, got world_size={self.world_size}"
                )
            if self.device == "cpu":
                problems.append("parallel=dp (DataParallel) needs device=cuda, got device=cpu")
        if self.comm_hook != "none" and self.parallel != "ddp":
            problems.append(
                f"comm_hook={self.comm_hook} needs parallel=ddp, got parallel={self.parallel}"
            )
        if self.comm_hook == "bf16" and self.device == "cpu":
            problems.append("comm_hook=bf16 needs device=cuda (NCCL), got device=cpu")
        if self.static_graph and self.parallel != "ddp":
            problems.append(f"static_graph=true needs parallel=ddp, got parallel={self.parallel}")
        if self.bucket_cap_mb != 25 and self.parallel != "ddp":
            problems.append(
                f"bucket_cap_mb={self.bucket_cap_mb} needs parallel=ddp, got "
                f"parallel={self.parallel}"
            )
        if self.gradient_as_bucket_view and self.parallel != "ddp":
            problems.append(
                f"gradient_as_bucket_view=true needs parallel=ddp, got parallel={self.parallel}"
            )
        if self.fsdp_mixed_precision != "off":
            if self.parallel != "fsdp":
                problems.append(
                    f"fsdp_mixed_precision={self.fsdp_mixed_precision} needs parallel=fsdp, "
                    f"got parallel={self.parallel}"
                )
            if self.amp != "off":
                problems.append(
                    f"fsdp_mixed_precision={self.fsdp_mixed_precision} is FSDP's form of AMP: "
                    f"use it or amp={self.amp}, not both"
                )
        if not self.reshard_after_forward and self.parallel != "fsdp":
            problems.append(
                f"reshard_after_forward=false needs parallel=fsdp, got parallel={self.parallel}"
            )
        if self.fsdp_cpu_offload and self.parallel != "fsdp":
            problems.append(
                f"fsdp_cpu_offload=true needs parallel=fsdp, got parallel={self.parallel}"
            )
        if self.find_unused_parameters and self.parallel != "ddp":
            problems.append(
                f"find_unused_parameters=true needs parallel=ddp, got parallel={self.parallel}"
            )
        if self.static_graph and self.grad_accum_steps > 1:
            problems.append(
                "static_graph=true cannot be combined with grad_accum_steps="
                f"{self.grad_accum_steps} (DDP no_sync); use grad_accum_steps=1"
            )
        if self.compile != "off" and self.parallel == "dp":
            problems.append(
                f"compile={self.compile} cannot be combined with parallel=dp (DataParallel "
                "replicates the module every step); use ddp, fsdp or single"
            )
        if (
            self.compile in GRAPH_CAPTURING_MODES
            and self.device != "cpu"
            and self.grad_accum_steps > 1
            and self.parallel != "single"
        ):
            # The backward graph's output becomes .grad and the next micro-step's replay
            # overwrites it (pytorch/pytorch#169545, open; seen on an H100 with torch 2.11).
            # The trainer keeps gradients of their own then (TrainStep.keep_grads), shown on an
            # H100 to accumulate as eager does on one device; not yet under DDP or FSDP.
            problems.append(
                f"compile={self.compile} (CUDA graphs) cannot be combined with grad_accum_steps="
                f"{self.grad_accum_steps} under parallel={self.parallel} on CUDA (on one device "
                "it can); use grad_accum_steps=1, parallel=single or compile=default"
            )
        if self.pin_memory and self.device == "cpu":
            problems.append("pin_memory=true needs device=cuda, got device=cpu")
        if self.num_workers == 0:
            if self.prefetch_factor is not None:
                problems.append(
                    f"prefetch_factor={self.prefetch_factor} needs num_workers >= 1, "
                    "got num_workers=0"
                )
            if self.persistent_workers:
                problems.append("persistent_workers=true needs num_workers >= 1, got num_workers=0")
        if self.optimizer_in_backward:
            unmet = [
                f"{need} (got {got})"
                for need, met, got in (
                    ("parallel=single", self.parallel == "single", self.parallel),
                    ("grad_accum_steps=1", self.grad_accum_steps == 1, self.grad_accum_steps),
                    (
                        "amp other than fp16, whose scaler checks every gradient",
                        self.amp != "fp16",
                        self.amp,
                    ),
                    (
                        "no max_grad_norm, whose clipping takes every gradient's norm",
                        self.max_grad_norm is None,
                        self.max_grad_norm,
                    ),
                )
                if not met
            ]
            if unmet:
                problems.append(
                    "optimizer_in_backward=true steps each parameter as soon as its gradient is "
                    f"complete: it needs {'; '.join(unmet)}"
                )
        if self.checkpoint_policy != "full" and not self.checkpoint_segments:
            problems.append(
                f"checkpoint_policy={self.checkpoint_policy} needs checkpoint_segments >= 1, "
                "got checkpoint_segments=0"
            )
        per_step = self.world_size * self.grad_accum_steps
        if self.global_batch_size % per_step:
            problems.append(
                f"global_batch_size={self.global_batch_size} is not divisible by world_size * "
                f"grad_accum_steps = {self.world_size} * {self.grad_accum_steps} = {per_step}"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def micro_batch_size(self) -> int:
        """Samples per device per forward/backward pass."""
        return self.global_batch_size // (self.world_size * self.grad_accum_steps)

    @property
    def processes(self) -> int:
        """Rank processes the trial launches: DataParallel drives all its GPUs from one."""
        return 1 if self.parallel == "dp" else self.world_size

    def resolved(self, device: Literal["cpu", "cuda"]) -> TrainConfig:
        """This config with ``device=auto`` replaced by the device actually used, re-validated."""
        if self.device != "auto":
            return self
        return make_config({**self.model_dump(), "device": device})

    def key(self) -> str:
        """This configuration's identity: equal keys, the same configuration (stable across
        processes and storage, unlike ``hash``)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    def summary(self) -> str:
        """A short human-readable description, e.g. for progress lines."""
        parts = [f"{self.parallel}x{self.world_size}", f"amp={self.amp}"]
        if self.matmul_precision != "default":
            parts.append(f"matmul={self.matmul_precision}")
        if self.optimizer_impl != "default":
            parts.append(f"optim={self.optimizer_impl}")
        if self.optimizer_in_backward:
            parts.append("optim-in-backward")
        if self.comm_hook != "none":
            parts.append(f"hook={self.comm_hook}")
        if self.find_unused_parameters:
            parts.append("find-unused")
        if self.static_graph:
            parts.append("static-graph")
        if self.bucket_cap_mb != 25:
            parts.append(f"bucket={self.bucket_cap_mb}MB")
        if self.gradient_as_bucket_view:
            parts.append("grad-views")
        if not self.reshard_after_forward:
            parts.append("no-reshard")
        if self.fsdp_cpu_offload:
            parts.append("cpu-offload")
        if self.fsdp_mixed_precision != "off":
            parts.append(f"fsdp-mp={self.fsdp_mixed_precision}")
        if self.checkpoint_segments:
            policy = "" if self.checkpoint_policy == "full" else f":{self.checkpoint_policy}"
            parts.append(f"ckpt={self.checkpoint_segments}{policy}")
        if self.channels_last:
            parts.append("channels-last")
        if self.expandable_segments:
            parts.append("expandable")
        if self.compile != "off":
            parts.append(f"compile={self.compile}")
        if self.max_grad_norm is not None:
            parts.append(f"clip={self.max_grad_norm:g}")
        parts.append(f"accum={self.grad_accum_steps}")
        parts.append(f"mbs={self.micro_batch_size}")
        parts.append(f"workers={self.num_workers}")
        if self.prefetch_factor is not None:
            parts.append(f"prefetch={self.prefetch_factor}")
        if self.persistent_workers:
            parts.append("persistent")
        if self.pin_memory:
            parts.append("pinned")
        if self.comm_hook == "powersgd":
            parts.append(f"rank={self.powersgd_rank} start={self.powersgd_start_iter}")
        return " ".join(parts)


def field_value(name: str, value: Any) -> Any:
    """``value`` as ``TrainConfig``'s field ``name`` holds it (``off`` read as False becomes
    "off", "4" becomes 4); ValueError with one line where the field cannot take it. The field
    alone: rules across fields are ``TrainConfig``'s."""
    field = TrainConfig.model_fields[name]
    value = _off(value) if name in OFF_FIELDS else value
    kind: Any = field.annotation
    if field.metadata:  # its constraints (ge=1)
        kind = Annotated[(kind, *field.metadata)]
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as error:
        raise ValueError(f"{value!r}: {error.errors()[0]['msg']}") from None


def make_config(values: dict[str, Any], source: str = "config") -> TrainConfig:
    """Validate ``values`` into a ``TrainConfig``, raising ``ConfigError`` with one clear line."""
    return validated(TrainConfig, values, source)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of config fields (unvalidated: flags may still override it)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {str(path)!r}: {error.strerror}") from None

    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML/JSON: {first_line}"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of fields, got {type(data).__name__}"
        )
    return data


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load a config file, apply ``overrides`` (e.g. from CLI flags) and validate the result."""
    values = {**read_config_file(path), **(overrides or {})}
    return make_config(values, source=f"config {str(path)!r}")


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as YAML (or JSON when the path ends in .json), loadable by load_config."""
    path = Path(path)
    data = config.model_dump(mode="json")
    if path.suffix == ".json":
        path.write_text(json.dumps(data, indent=2) + "\n")
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False))

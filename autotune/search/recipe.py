"""The standard recipe, and what a configuration changes about the training's numerics.

The standard recipe is the configuration a skilled engineer writes by hand, the bar the tuner
is held to beside the plain baseline: bf16 autocast where the device computes it natively
(else fp16 with a scaler, else off: a CPU without AVX512-BF16 or AMX emulates both),
``torch.compile`` in its default mode where it works, DDP over every device (FSDP when DDP fits
at no micro-batch, one device when neither does), the largest micro-batch that fits,
DataLoader workers ``min(4, cores per rank)`` with pinned memory and persistent workers on
CUDA, the optimizer's fused form where it has one. "Where it works" is what the space offers
after the probe: a choice the probe dropped is not the recipe's either; and where the model
itself fails under compile or autocast (an op autocast leaves in fp32 beside one it casts), the
recipe goes on without that knob, as the engineer who saw the error would (``recipe_fallback``).

Knobs that change numerics (autocast, compressed gradients, TF32, FSDP's bf16 policy) must
earn their place: ``numerics_changes`` names them, ``simplest_of`` orders configurations by how
much they change, numerics first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from autotune.config import TrainConfig
from autotune.records import Value
from autotune.runner.platform import AUTOCASTS
from autotune.search.space import SearchSpace

RECIPE_WORKERS = 4
"""DataLoader workers per rank in the recipe, at most (fewer where the cores are fewer)."""
DROPPABLE = ("compile", "optimizer_impl", "persistent_workers", "pin_memory", "num_workers")
"""Recipe knobs left at their default, in this order, when a combination is refused."""


def recipe_values(
    choices: Mapping[str, Sequence[Value]],
    device_type: str,
    devices: int,
    cores_per_rank: int,
    native_amp: Sequence[str] = AUTOCASTS,
) -> dict[str, Any]:
    """The recipe's knobs (all but the micro-batch) from the space's ``choices``; autocast only
    in a precision the device computes natively (``native_amp``: ``platform.native_autocast``),
    as an engineer leaves emulated bf16 off a CPU without the instructions for it."""

    def offered(knob: str, value: Value) -> bool:
        return value in choices.get(knob, ())

    values: dict[str, Any] = {
        "amp": recipe_amp(choices.get("amp", ()), native_amp),
    }
    if devices > 1 and offered("parallel", "ddp") and offered("world_size", devices):
        values.update(parallel="ddp", world_size=devices)
    else:
        values.update(parallel="single", world_size=1)
    if offered("compile", "default"):
        values["compile"] = "default"
    workers = [c for c in choices.get("num_workers", ()) if isinstance(c, int)]
    fitting = [w for w in workers if w <= min(RECIPE_WORKERS, cores_per_rank)]
    if fitting and max(fitting) > 0:
        values["num_workers"] = max(fitting)
        if device_type == "cuda" and offered("persistent_workers", True):
            values["persistent_workers"] = True
    if device_type == "cuda" and offered("pin_memory", True):
        values["pin_memory"] = True
    if offered("optimizer_impl", "fused"):
        values["optimizer_impl"] = "fused"
    return values


FALLBACKS = (("compile", "off"), ("amp", "off"))
"""What the recipe gives up, in this order, when a trial of it fails for another reason than
memory: compile first (the likelier to fail), then autocast."""


def recipe_fallback(values: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(the knob given up, the recipe without it) after a trial of ``values`` failed for another
    reason than memory; None when it has nothing left to give up."""
    for knob, plain in FALLBACKS:
        if values.get(knob, plain) != plain:
            return f"{knob}={values[knob]}", {**values, knob: plain}
    return None


def recipe_amp(amp_choices: Sequence[Value], native_amp: Sequence[str]) -> str:
    """bf16 where the space offers it and the device computes it natively, else fp16, else
    off."""
    return next((a for a in AUTOCASTS if a in amp_choices and a in native_amp), "off")


def recipe_candidates(
    values: Mapping[str, Any],
    space: SearchSpace,
    complete: Callable[[dict[str, Any]], dict[str, Any]],
) -> list[TrainConfig]:
    """The recipe at each micro-batch of ``space``, largest first (least accumulation), DDP's
    before FSDP's, then one device's, as far as the space offers them; knobs a combination
    refuses are left at their default, and a knob the recipe leaves alone takes PyTorch's
    default where the space offers it (else the space's first choice: a DataLoader's prefetch
    factor of 2, say)."""
    params = space.params
    accum = params["grad_accum_steps"].choices if "grad_accum_steps" in params else (1,)
    layouts = [dict(values)]
    offered = params["parallel"].choices if "parallel" in params else ()
    if values.get("parallel") == "ddp":  # FSDP when DDP fits nowhere; else one device
        if "fsdp" in offered:
            layouts.append({**values, "parallel": "fsdp"})
        if "single" in offered:
            layouts.append({**values, "parallel": "single", "world_size": 1})
    out = []
    for layout in layouts:
        for steps in sorted({a for a in accum if isinstance(a, int)}):
            chosen = {**layout, "grad_accum_steps": steps}
            config = _valid(_filled(chosen, space), complete)
            if config is not None and config not in out:
                out.append(config)
    return out


def _filled(values: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """``values`` with every knob of ``space`` that exists under them and that they leave
    unset at a choice the space offers (its default where offered)."""
    out = dict(values)
    for name, param in space.params.items():
        if name in out or not param.active(out):
            continue
        default = TrainConfig.model_fields[name].default
        if default not in param.choices:
            out[name] = param.choices[0]
    return out


def _valid(
    values: dict[str, Any], complete: Callable[[dict[str, Any]], dict[str, Any]]
) -> TrainConfig | None:
    for dropped in range(len(DROPPABLE) + 1):
        kept = {k: v for k, v in values.items() if k not in DROPPABLE[:dropped]}
        try:
            return TrainConfig(**complete(kept))
        except ValueError:
            continue
    return None


# -- numerics -----------------------------------------------------------------------------


BatchNorm = Literal["local", "synced"]
"""How a model's batch norms compute their statistics: over each device's micro-batch
(``nn.BatchNorm1d/2d/3d``), or over the micro-batches of every rank together
(``nn.SyncBatchNorm``, under DDP or FSDP)."""


@dataclass(frozen=True)
class Coupling:
    """What makes the samples of one forward compute together, so that the micro-batch, which
    the global batch does not fix, is part of the training's numerics."""

    batch_norm: BatchNorm | None = None
    """How the model's batch norms compute their statistics; None: it has none."""
    loss: bool = False
    """The loss of a micro-batch is not the mean (or sum) of its samples' own: in-batch
    negatives, a mean over the tokens of padded samples (``runner.coupling``)."""
    loss_gathered: bool = False
    """The loss covers what the step gathers from every rank (SimCLR's negatives): DDP's and
    FSDP's ranks compute it over all their micro-batches together (``coupled.gathers``)."""
    loss_untold: str = ""
    """Why the check could not tell whether the loss couples the samples (a model too large to
    run here, a loss that draws at random); "" where it told. Untold, a split of the global
    batch is taken to train the same, and the search's header says so."""

    def __bool__(self) -> bool:
        return self.batch_norm is not None or self.loss


def norm_samples(config: TrainConfig, batch_norm: BatchNorm) -> int:
    """The samples a batch norm's statistics cover in one forward of ``config``."""
    return _over_ranks(config, batch_norm == "synced")


def loss_samples(config: TrainConfig, coupling: Coupling) -> int:
    """The samples a coupled loss covers in one forward of ``config``."""
    return _over_ranks(config, coupling.loss_gathered)


def _over_ranks(config: TrainConfig, gathered: bool) -> int:
    """One forward's samples: every rank's micro-batch where they are ``gathered``."""
    if gathered and config.parallel in ("ddp", "fsdp"):
        return config.micro_batch_size * config.world_size
    return config.micro_batch_size


def numerics_changes(
    config: TrainConfig,
    coupling: Coupling | None = None,
    reference: TrainConfig | None = None,
) -> list[str]:
    """What ``config`` changes about the training's arithmetic against plain fp32 (each as
    ``knob=value``): autocast, compressed gradients, TF32 matmuls, FSDP's bf16 policy; and, for
    a model whose forward couples its samples (``coupling``: batch norms, a loss over the
    micro-batch together), a forward over another number of samples than ``reference``'s (the
    baseline's): the micro-batch, which the global batch does not fix, is then part of the
    numerics."""
    changes = []
    if config.amp != "off":
        changes.append(f"amp={config.amp}")
    if config.parallel == "ddp" and config.comm_hook != "none":
        changes.append(f"comm_hook={config.comm_hook}")
    if config.matmul_precision not in ("default", "highest"):
        changes.append(f"matmul_precision={config.matmul_precision}")
    if config.parallel == "fsdp" and config.fsdp_mixed_precision != "off":
        changes.append(f"fsdp_mixed_precision={config.fsdp_mixed_precision}")
    if coupling is None or reference is None:
        return changes
    if coupling.batch_norm is not None:
        mine = norm_samples(config, coupling.batch_norm)
        theirs = norm_samples(reference, coupling.batch_norm)
        if mine != theirs:
            changes.append(f"batch_norm_samples={mine} (the baseline's {theirs})")
    if coupling.loss:
        mine, theirs = loss_samples(config, coupling), loss_samples(reference, coupling)
        if mine != theirs:
            changes.append(f"loss_samples={mine} (the baseline's {theirs})")
    return changes


def knobs_moved(config: TrainConfig, baseline: TrainConfig | None) -> int:
    """How many knobs ``config`` sets differently from ``baseline`` (from the defaults when
    there is none)."""
    reference = baseline.model_dump() if baseline is not None else {}
    values = config.model_dump()
    if baseline is None:
        reference = {name: field.default for name, field in TrainConfig.model_fields.items()} | {
            "global_batch_size": config.global_batch_size,
            "device": config.device,
        }
    return sum(values[k] != reference.get(k) for k in values)


def simplicity(
    config: TrainConfig, baseline: TrainConfig | None, coupling: Coupling | None = None
) -> tuple[int, int]:
    """The order in which a configuration changes less: numerics first, then knobs moved."""
    return len(numerics_changes(config, coupling, baseline)), knobs_moved(config, baseline)

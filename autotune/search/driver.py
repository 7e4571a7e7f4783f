"""One search from start to end: probe, open the study, run the tuner on Ray, recommend."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TextIO

from autotune.errors import ConfigError
from autotune.recommendation import Recommendation
from autotune.records import exclusion_lines
from autotune.result import Platform
from autotune.runner.executor import Executor
from autotune.runner.fake_memory import warnings_once
from autotune.runner.launch import LocalExecutor
from autotune.runner.pickled import PREFIX, is_pickled
from autotune.runner.platform import (
    detect_platform,
    native_autocast,
    resolve_device,
    usable_cpus,
)
from autotune.runner.workload import (
    DEFAULT_GLOBAL_BATCH_SIZE,
    GLOBAL_BATCH_ATTRIBUTE,
    WorkloadSpec,
    check_workload,
    declared_global_batch,
    describe_collate,
    describe_optimizer,
    model_location,
)
from autotune.search.calibration import start_prior
from autotune.search.coupled import coupling
from autotune.search.memory_model import budget_scope
from autotune.search.meta_build import (
    batch_source_note,
    check_batches,
    check_dataset_size,
    check_optimizer,
    configures_optimizer,
    data_source,
    feeds_images,
    optimizer_flags,
)
from autotune.search.model_facts import (
    fsdp_block_classes,
    idle_blocks,
    own_checkpointing,
    own_compile,
    parameters_dtype,
    refuses_own_checkpointing,
    repeated_blocks,
    scalar_parameters,
)
from autotune.search.probe import every_block, is_looped, restrict_space
from autotune.search.progress import Reporter
from autotune.search.recipe import BatchNorm, Coupling
from autotune.search.refusals import (
    check_clipping,
    clipping_refusals,
    dataset_refusals,
    fsdp_bf16_refusals,
    model_refusals,
)
from autotune.search.settings import SearchSettings
from autotune.search.space import SearchSpace, load_space
from autotune.search.storage import open_storage, pick_study, stored_studies
from autotune.search.study import model_hash, open_study
from autotune.search.tuner import Tuner
from autotune.secrets import mask_url
from autotune.units import format_budget

RECOMMENDATION_ATTR = "autotune:recommendation"


def default_study_name(workload: WorkloadSpec, settings: SearchSettings) -> str:
    model = workload.model  # an object given to the API: its file's name, type and hash
    model = Path(model.removeprefix(PREFIX)).stem if is_pickled(model) else model
    model = re.sub(r"[^A-Za-z0-9_.:-]+", "_", model)
    clip = f"-clip{settings.max_grad_norm:g}" if settings.max_grad_norm is not None else ""
    return f"{model}-gbs{settings.global_batch_size}{clip}"


def resolve_global_batch(
    workload: WorkloadSpec, settings: SearchSettings
) -> tuple[SearchSettings, str]:
    """The settings with their global batch settled, and where it came from, in words."""
    if settings.global_batch_size is not None:
        return settings, "given"
    declared = declared_global_batch(workload)
    if declared is not None:
        module = model_location(workload)
        return settings.replace(global_batch_size=declared), f"{module} {GLOBAL_BATCH_ATTRIBUTE}"
    source = (
        f"default {DEFAULT_GLOBAL_BATCH_SIZE}: the global batch is training semantics; give the "
        f"real one with --global-batch-size or {GLOBAL_BATCH_ATTRIBUTE} in the model's module"
    )
    return settings.replace(global_batch_size=DEFAULT_GLOBAL_BATCH_SIZE), source


def _devices(settings: SearchSettings, device_count: int, device_type: str) -> int:
    if settings.cluster.devices is not None:
        if device_type == "cuda" and settings.cluster.devices > device_count:
            raise ConfigError(
                f"--devices {settings.cluster.devices} exceeds the {device_count} GPUs of this "
                "machine"
            )
        return settings.cluster.devices
    return device_count if device_type == "cuda" else min(device_count, 2)


def _executor(
    settings: SearchSettings,
    space: SearchSpace,
    platform: Platform,
    devices: int,
    workload: WorkloadSpec,
    rank_output: TextIO | None = None,
) -> Executor:
    """The Ray executor (a private local instance, or the cluster at ``ray_address``), or with
    ``executor='local'`` rank processes of this machine, one trial at a time."""
    if settings.cluster.executor == "local":
        return LocalExecutor(rank_output)
    from autotune.runner.ray_executor import RayExecutor  # imports Ray: only when searching

    if settings.memory.predict_memory:  # the memory model's first guess, measured as Ray starts
        start_prior(platform.device_type, workload, RayExecutor.rank_imports, space.compiles())

    max_workers = (
        max((c for c in space.params["num_workers"].choices if isinstance(c, int)), default=0)
        if "num_workers" in space.params
        else 0
    )
    # A private instance declares enough logical CPUs to keep gangs of each size warm, with and
    # without what trials leave in their ranks (``ray_gang.leaves_behind``: the compiler,
    # autocast's kernels; idle gangs beyond that make room); on CPU trials run one at a time, so
    # this never oversubscribes the cores during a measurement.
    return RayExecutor(
        platform,
        address=settings.cluster.ray_address,
        cpus_per_rank=1 + max_workers,
        num_cpus=max(usable_cpus(), 4 * devices * (1 + max_workers)),
        ship=(os.getcwd() if settings.cluster.ray_address and settings.cluster.ship_code else None),
        rank_output=rank_output,
    )


def _executor_lines(executor: Executor) -> dict[str, str]:
    """What the search's header says of the executor."""
    if isinstance(executor, LocalExecutor):
        return {"executor": "rank processes of this machine, one trial at a time (no Ray)"}
    notes, shipped = getattr(executor, "notes", []), getattr(executor, "shipped", None)
    lines = {"ray": "; ".join(notes)} if notes else {}
    return lines | ({"shipped": f"{shipped} to every Ray node"} if shipped else {})


def _asks_fsdp_bf16(space: SearchSpace, devices: int) -> bool:
    """Whether ``space`` offers FSDP's bf16 parameters on ``devices``: only then does the probe
    try a forward held as they hold the model (``refusals.fsdp_bf16_refusals``)."""
    choices = space.choices()
    return (
        devices >= 2
        and "fsdp" in choices.get("parallel", ())
        and any(value != "off" for value in choices.get("fsdp_mixed_precision", ()))
    )


def _oversubscribed(
    settings: SearchSettings, device: str, devices: int, cores: int
) -> dict[str, str]:
    """The header's line where CPU ranks outnumber this machine's cores (none for a Ray
    cluster's, whose nodes bring their own)."""
    if device != "cpu" or devices <= cores or settings.cluster.ray_address:
        return {}
    return {
        "cores": f"--devices {devices} on {cores} usable cores: ranks share cores, so "
        "configurations of more ranks than cores measure their contention, not a machine with "
        f"{devices} devices"
    }


_OTHER_SAMPLES = (
    "a configuration whose forward covers other samples than the baseline's changes the "
    "numerics, and its recommendation names it as such"
)


def _norm_line(norms: BatchNorm) -> str:
    """What the search's header says of a model's batch norms."""
    if norms == "synced":
        over = "every rank's micro-batches together (SyncBatchNorm)"
    else:
        over = "each device's micro-batch"
    return f"statistics over {over}: {_OTHER_SAMPLES}"


def _coupling_lines(coupled: Coupling | None) -> dict[str, str]:
    """The header's lines on what makes the model's forward follow the micro-batch."""
    lines = {}
    if coupled and coupled.batch_norm:
        lines["batch norm"] = _norm_line(coupled.batch_norm)
    if coupled and coupled.loss:
        over = (
            "every rank's micro-batches together (it gathers from every rank)"
            if coupled.loss_gathered
            else "each device's micro-batch together"
        )
        lines["loss"] = (
            f"over {over}, not a mean of its samples' own (two samples' loss is not the mean "
            "of each one's with a copy of itself: in-batch negatives, a mean over padded "
            f"tokens): {_OTHER_SAMPLES}"
        )
    if coupled is not None and coupled.loss_untold:  # falsy: nothing known couples
        lines["loss"] = (
            f"not told whether it couples each micro-batch's samples ({coupled.loss_untold}); "
            "a configuration that splits the global batch otherwise is taken to train the same"
        )
    return lines


def _check_split(global_batch_size: int | None, devices: int, source: str) -> None:
    """Every configuration of the search, the baseline first, splits the global batch evenly
    over the devices: one that cannot leaves nothing to run."""
    if global_batch_size is None or global_batch_size % devices == 0:
        return
    larger = (global_batch_size // devices + 1) * devices
    given = batch_source_note(source)
    raise ConfigError(
        f"global batch {global_batch_size}{given} does not split evenly over {devices} devices: "
        f"use a multiple of {devices} (such as {larger}) with --global-batch-size, or --devices "
        "with a number that divides it"
    )


def _check_objects_reach(workload: WorkloadSpec, ray_address: str | None) -> None:
    """An object given to the API is pickled to a file of this machine
    (``autotune.runner.pickled``), which other nodes of a Ray cluster cannot read."""
    if ray_address is None:
        return
    for what in ("data", "loss", "optimizer", "collate"):
        reference = getattr(workload, what)
        if reference and is_pickled(reference):
            raise ConfigError(
                f"{what}: an object is pickled for the ranks to {reference.removeprefix(PREFIX)}, "
                f"a file of this machine that the nodes of the Ray cluster at {ray_address!r} "
                "cannot read; give it as 'pkg.module:Name' (a factory that builds it)"
            )


def run_search(
    workload: WorkloadSpec,
    settings: SearchSettings,
    reporter: Reporter,
    rank_output: TextIO | None = None,
) -> Recommendation:
    """Search, store every trial, and return (and store) the recommendation; each trial's
    ranks' own output to ``rank_output`` as it ends, where one is given (``--debug``). A
    warning the model gives is said once, not again by each trace of it."""
    with warnings_once():
        return _run_search(workload, settings, reporter, rank_output)


def _run_search(
    workload: WorkloadSpec,
    settings: SearchSettings,
    reporter: Reporter,
    rank_output: TextIO | None,
) -> Recommendation:
    check_workload(workload)
    _check_objects_reach(workload, settings.cluster.ray_address)
    check_batches(workload)
    check_optimizer(workload)
    check_clipping(settings.max_grad_norm, workload.model)
    settings, batch_source = resolve_global_batch(workload, settings)
    space = load_space(settings.space)
    device = resolve_device(settings.cluster.device)
    platform = detect_platform(device)
    count = platform.device_count if device == "cuda" else usable_cpus()
    devices = _devices(settings, count, device)
    _check_split(settings.global_batch_size, devices, batch_source)
    check_dataset_size(workload, settings.global_batch_size, batch_source)
    budget = settings.memory.memory_budget_bytes(platform.device_memory_bytes)
    blocks = repeated_blocks(workload)
    # before the fingerprint: a study resumed with another space says so, not Optuna
    space, added = every_block(space, *(blocks or (None, "")))
    fingerprint = {
        "platform": platform.fingerprint(),
        "model": model_hash(workload.model),
        "data": workload.data,
        **(
            {"input": [list(workload.input_shape), workload.input_dtype]}
            if workload.input_shape
            else {}
        ),
        "loss": workload.loss,
        **({"optimizer": workload.optimizer} if workload.optimizer else {}),
        **({"collate": workload.collate} if workload.collate else {}),
        "space": space.fingerprint(),
        "devices": devices,
        "global_batch_size": settings.global_batch_size,
        **({"max_grad_norm": settings.max_grad_norm} if settings.max_grad_norm is not None else {}),
        "memory_budget_bytes": budget,
        "safety_margin": settings.memory.safety_margin,
        "steps": [settings.measurement.warmup_steps, settings.measurement.measured_steps],
        "seed": settings.measurement.seed,
    }
    optimizer_source = describe_optimizer(workload, configures_optimizer(workload.model))
    collate = describe_collate(workload)
    name = settings.study.study_name or default_study_name(workload, settings)
    # opened once the input is known good: a bad flag leaves no empty study database behind
    storage = open_storage(settings.study.storage, settings.study.storage_wait_s, reporter.phase)
    study, name, requeued = open_study(storage, name, fingerprint, settings.study.new_study)

    # the first time on a platform this tries comm hooks and torch.compile in tiny trials
    reporter.phase("probing what works on this machine (cached per platform)")
    coupled = coupling(workload, device)  # four forwards of two samples, on the model built here
    images = feeds_images(workload) if "channels_last" in space.params else None
    flags = optimizer_flags(workload) if "optimizer_impl" in space.params else None
    refusals = model_refusals(workload.model) + clipping_refusals(settings.max_grad_norm)
    if _asks_fsdp_bf16(space, devices):
        refusals += fsdp_bf16_refusals(workload)
    # a dataset kept on the GPU's: workers, and pinning its samples
    workers = space.params["num_workers"].choices if "num_workers" in space.params else ()
    pinned = "pin_memory" in space.params and True in space.params["pin_memory"].choices
    refusals += dataset_refusals(
        workload, device, [w for w in workers if isinstance(w, int)], pinned
    )
    space, exclusions = restrict_space(
        space,
        platform,
        devices,
        blocks[0] if blocks else None,
        image_batches=images,
        optimizer_flags=flags,
        block_class=blocks[1] if blocks else "",
        refusals=refusals,
        idle_blocks=idle_blocks(workload) if blocks else 0,
    )
    executor = _executor(settings, space, platform, devices, workload, rank_output)
    concurrency = settings.cluster.concurrency or (1 if device == "cpu" else devices)
    if settings.cluster.executor == "local":
        concurrency = 1  # one machine, trials one at a time (LocalExecutor.fits_now)
    try:
        reporter.start(
            study=f"{name} in {mask_url(settings.study.storage)}"
            + (f" ({requeued} interrupted trial(s) re-queued)" if requeued else ""),
            platform=f"{platform.device_name} x{devices} ({platform.backend})",
            **{"global batch": f"{settings.global_batch_size} ({batch_source})"},
            **({"data": data} if (data := data_source(workload)) else {}),
            optimizer=optimizer_source,
            **({"batches": f"made by {collate}"} if collate else {}),
            **_coupling_lines(coupled),
            **({"checkpointing": own} if (own := own_checkpointing(workload.model)) else {}),
            **({"compile": compiled} if (compiled := own_compile(workload.model)) else {}),
            **_oversubscribed(settings, device, devices, count),
            budget=f"{format_budget(budget)} {budget_scope(device)}, limit "
            f"{1 - settings.memory.safety_margin:.0%} of it",
            **({"excluded": "; ".join(exclusion_lines(exclusions))} if exclusions else {}),
            **({"added": added} if added else {}),
            **_executor_lines(executor),
        )
        tuner = Tuner(
            study=study,
            executor=executor,
            workload=workload,
            settings=settings.replace(concurrency=concurrency),
            space=space,
            platform=platform,
            devices=devices,
            reporter=reporter,
            native_amp=native_autocast(platform.device_type),
            coupling=coupled,
            ddp_refused=any(
                (r.knob, r.value) == ("parallel", "ddp") and r.holds(platform.device_type)
                for r in refusals
            ),
        )
        recommendation = tuner.run(exclusions, mask_url(settings.study.storage), name)
        recommendation = recommendation.model_copy(
            update={
                "model": workload.model,
                "block_class": fsdp_block_classes(workload.model),
                "looped_layer": bool(blocks and is_looped(blocks[1])),
                "checkpointing_refused_by": refuses_own_checkpointing(workload.model),
                "scalar_parameters": scalar_parameters(workload.model),
                "parameter_dtype": parameters_dtype(workload.model),
                "global_batch_source": batch_source,
                "optimizer": verification_optimizer(recommendation),
                "optimizer_source": optimizer_source,
            }
        )
    finally:
        executor.shutdown()
        reporter.close()
    study.set_user_attr(RECOMMENDATION_ATTR, recommendation.model_dump(mode="json"))
    return recommendation


def verification_optimizer(recommendation: Recommendation) -> str:
    """The optimizer class the recommendation's verification run trained with."""
    verification = recommendation.verification
    return verification.optimizer if verification is not None else ""


def load_recommendation(storage: str, study_name: str | None) -> Recommendation:
    """The recommendation stored by a finished search."""
    return finished_recommendation(pick_study(storage, stored_studies(storage)[1], study_name))


def finished_recommendation(summary: Any) -> Recommendation:
    """The recommendation stored in the study (``summary``); one line where its search did not
    finish."""
    recommendation = stored_recommendation(summary)
    if recommendation is None:
        raise ConfigError(
            f"study {summary.study_name!r} has no recommendation yet (the search did not "
            "finish); run the same search command again to resume it"
        )
    return recommendation


def stored_recommendation(summary: Any) -> Recommendation | None:
    """The recommendation a finished search stored in the study (``summary``); None before."""
    attrs = summary.user_attrs
    if RECOMMENDATION_ATTR not in attrs:
        return None
    return Recommendation.model_validate(attrs[RECOMMENDATION_ATTR])

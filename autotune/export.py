"""A configuration in the forms other tools read: YAML, JSON, a torchrun command line, and the
settings of Hugging Face, Lightning and Accelerate.

What is exported is a ``TrainConfig``: a search's recommendation (which adds a header with its
measurements, the platform's core count and the model's block class) or any config file in the
trial schema, such as the ``best.yaml`` that ``search --out`` writes.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import yaml

from autotune.config import TrainConfig
from autotune.recommendation import Recommendation
from autotune.runner.platform import usable_cpus
from autotune.trainers import accelerate, hugging_face, lightning, render_yaml
from autotune.units import format_rate

FORMATS = ("yaml", "json", "torchrun", "hf", "lightning", "accelerate")
Exported = Recommendation | TrainConfig


def _config(target: Exported) -> TrainConfig:
    return target.config if isinstance(target, Recommendation) else target


def _header(r: Recommendation) -> str:
    close = r.runner_up
    caveat = ""
    if close is not None and close.ratio is not None:
        if close.faster:
            caveat = (
                f"# {close.config.summary()} ran {close.ratio:.2f}x its samples/s, a gain its "
                "95% interval does not show: this one changes less\n"
            )
        elif not close.ruled_out:
            caveat = (
                f"# the race could not tell it from {close.config.summary()} "
                f"({close.ratio:.2f}x its samples/s): either may be the faster\n"
            )
    return (
        f"# autotune recommendation for study {r.study_name}: {format_rate(r.samples_per_s)}"
        + (f", {r.speedup:.2f}x the baseline" if r.speedup else "")
        + (
            f", {r.speedup_over_recipe:.2f}x the standard recipe"
            if r.speedup_over_recipe and not r.recipe_won
            else (", the standard recipe itself" if r.recipe_won else "")
        )
        + f", {r.memory_used_bytes / 2**30:.2f} GiB peak on {r.platform.device_name}\n"
        + (f"# numerics changed: {', '.join(r.numerics_changes)}\n" if r.numerics_changes else "")
        + "".join(f"# memory caveat: {caveat}\n" for caveat in r.memory_caveats)
        + "".join(f"# throughput caveat: {caveat}\n" for caveat in r.throughput_caveats)
        + (f"# {optimizer_note(r)}\n" if r.optimizer else "")
        + caveat
    )


def render(
    target: Exported, fmt: str, script: str = "train.py", config_file: str = "autotune-best.yaml"
) -> str:
    """``target`` as ``fmt``; YAML and JSON load with ``autotune trial --config``. A torchrun
    command names ``config_file``, which the caller must write (``autotune export`` does)."""
    config = _config(target)
    data = config.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        header = _header(target) if isinstance(target, Recommendation) else ""
        return header + yaml.safe_dump(data, sort_keys=False)
    if fmt == "torchrun":
        return torchrun_command(target, script, config_file) + "\n"
    if fmt in ("hf", "lightning", "accelerate"):
        data, _ = trainer_settings(target, fmt)
        notes = notes_for(target, fmt)
        titles = {
            "hf": "transformers.TrainingArguments(output_dir=..., **yaml.safe_load(this_file))",
            "lightning": "LightningCLI config: trainer arguments, and your DataLoader's",
            "accelerate": "accelerate launch --config_file this_file train.py",
        }
        return render_yaml(data, notes, f"autotune configuration as {titles[fmt]}")
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def trainer_settings(target: Exported, fmt: str) -> tuple[dict[str, Any], list[str]]:
    """The settings for a trainer (hf, lightning, accelerate) and what it cannot express."""
    config = _config(target)
    looped = isinstance(target, Recommendation) and target.looped_layer
    if fmt == "hf":
        refused = target.checkpointing_refused_by if isinstance(target, Recommendation) else None
        return hugging_face(config, looped, refused)
    if fmt == "lightning":
        return lightning(config, looped)
    block_class = target.block_class if isinstance(target, Recommendation) else None
    return accelerate(config, block_class or None, looped)


def optimizer_note(r: Recommendation) -> str:
    """Which optimizer the numbers hold for: it sets the memory of every trial."""
    return (
        f"measured with the optimizer {r.optimizer} ({r.optimizer_source}); train with the same "
        "one, or the memory and speed measured may not hold"
    )


def notes_for(target: Exported, fmt: str) -> list[str]:
    """What ``fmt`` cannot express of the configuration (for yaml/json/torchrun: only which
    optimizer a recommendation was measured with)."""
    trainer = fmt in ("hf", "lightning", "accelerate")
    notes = trainer_settings(target, fmt)[1] if trainer else []
    if (
        trainer
        and isinstance(target, Recommendation)
        and target.config.parallel == "fsdp"
        and target.scalar_parameters
    ):
        notes.append(scalar_note(target.scalar_parameters))
    if trainer and isinstance(target, Recommendation) and _norms_kept_whole(target):
        notes.append(NORMS_NOTE)
    if isinstance(target, Recommendation) and target.optimizer:
        notes.append(optimizer_note(target))
    return notes


NORMS_NOTE = (
    "FSDP's bf16 parameters fail on batch norms (a bf16 weight beside float32 running "
    "statistics): the trials kept the batch norms' parameters whole and in float32, "
    "fully_shard(..., ignored_params=...), their gradients averaged over the ranks "
    "(autotune.apply does the same); do so where this trainer shards the model"
)
"""What another trainer's FSDP2 with bf16 parameters meets on a model with batch norms."""


def _norms_kept_whole(target: Recommendation) -> bool:
    """Whether the recommendation is FSDP with bf16 parameters of a model with batch norms
    (from a build on the meta device: an unbuildable one is not said)."""
    config = target.config
    if config.parallel != "fsdp" or config.fsdp_mixed_precision == "off" or not target.model:
        return False
    from autotune.search.model_facts import batch_norm  # imports torch: a build on the meta device

    return batch_norm(target.model) is not None


def scalar_note(names: list[str]) -> str:
    """What another trainer's FSDP2 meets where the trials' did not."""
    return (
        f"FSDP2's fully_shard refuses 0-dim parameters ({', '.join(names)}): the trials passed "
        "them as fully_shard(..., ignored_params=...) and averaged their gradients over the "
        "ranks (autotune.apply does the same); do so where this trainer shards the model, or "
        "make each a 1-element tensor"
    )


def torchrun_command(target: Exported, script: str, config_file: str) -> str:
    """How to launch ``script`` with the configuration, read from ``config_file``."""
    config = _config(target)
    env = []
    if config.expandable_segments:
        env.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if config.device == "cpu":
        cores = target.platform.cpu_count if isinstance(target, Recommendation) else usable_cpus()
        threads = max(1, cores // config.processes - config.num_workers)
        env.append(f"OMP_NUM_THREADS={threads}")
    if config.parallel in ("ddp", "fsdp"):
        launcher = f"torchrun --standalone --nnodes=1 --nproc-per-node={config.world_size}"
    else:
        launcher = "python"
    return " ".join([*env, launcher, shlex.quote(script), "--config", shlex.quote(config_file)])

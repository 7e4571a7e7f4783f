"""A recommendation in the forms other tools read: YAML, JSON, a torchrun command line."""

from __future__ import annotations

import json
import shlex
from typing import Any

from autotune.recommendation import Recommendation
from autotune.trainers import accelerate, hugging_face, lightning, render_yaml

FORMATS = ("yaml", "json", "torchrun", "hf", "lightning", "accelerate")


def render(recommendation: Recommendation, fmt: str, script: str = "train.py") -> str:
    """The recommended config as ``fmt``; YAML and JSON load with ``autotune trial --config``."""
    config = recommendation.config
    data = config.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        header = (
            f"# autotune recommendation for study {recommendation.study_name}: "
            f"{recommendation.samples_per_s:,.1f} samples/s"
            + (f", {recommendation.speedup:.2f}x the baseline" if recommendation.speedup else "")
            + f", {recommendation.memory_used_bytes / 2**30:.2f} GiB peak"
            f" on {recommendation.platform.device_name}\n"
        )
        return header + yaml.safe_dump(data, sort_keys=False)
    if fmt == "torchrun":
        return torchrun_command(recommendation, script) + "\n"
    if fmt in ("hf", "lightning", "accelerate"):
        data, notes = trainer_settings(recommendation, fmt)
        titles = {
            "hf": "transformers.TrainingArguments(output_dir=..., **yaml.safe_load(this_file))",
            "lightning": "LightningCLI config: trainer arguments, and your DataLoader's",
            "accelerate": "accelerate launch --config_file this_file train.py",
        }
        return render_yaml(data, notes, f"autotune recommendation as {titles[fmt]}")
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")


def trainer_settings(recommendation: Recommendation, fmt: str) -> tuple[dict[str, Any], list[str]]:
    """The settings for a trainer (hf, lightning, accelerate) and what it cannot express."""
    config = recommendation.config
    if fmt == "hf":
        return hugging_face(config)
    if fmt == "lightning":
        return lightning(config)
    return accelerate(config, recommendation.block_class or None)


def notes_for(recommendation: Recommendation, fmt: str) -> list[str]:
    """What ``fmt`` cannot express of the recommendation (empty for yaml/json/torchrun)."""
    if fmt in ("hf", "lightning", "accelerate"):
        return trainer_settings(recommendation, fmt)[1]
    return []


def torchrun_command(recommendation: Recommendation, script: str) -> str:
    """How to launch ``script`` with the recommended config (written next to it as YAML)."""
    config = recommendation.config
    env = []
    if config.device == "cpu":
        threads = max(1, recommendation.platform.cpu_count // config.processes - config.num_workers)
        env.append(f"OMP_NUM_THREADS={threads}")
    if config.parallel in ("ddp", "fsdp"):
        launcher = f"torchrun --standalone --nnodes=1 --nproc-per-node={config.world_size}"
    else:
        launcher = "python"
    return " ".join([*env, launcher, shlex.quote(script), "--config", "autotune-best.yaml"])

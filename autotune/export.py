"""A recommendation in the forms other tools read: YAML, JSON, a torchrun command line."""

from __future__ import annotations

import json
import shlex
from typing import Literal

from autotune.search.recommendation import Recommendation

Format = Literal["yaml", "json", "torchrun"]


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
    raise ValueError(f"unknown export format {fmt!r}; use yaml, json or torchrun")


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

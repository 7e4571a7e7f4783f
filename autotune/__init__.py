"""autotune: finds the fastest memory-safe training configuration for a PyTorch model.

``import autotune`` stays cheap: torch, Ray and plotting libraries load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from autotune.api import plan, run_trial, tune
    from autotune.config import TrainConfig, load_config
    from autotune.recommendation import Recommendation
    from autotune.result import TrialResult
    from autotune.runner.request import TrialOptions
    from autotune.runner.workload import WorkloadSpec

_LAZY = {
    "TrainConfig": "autotune.config",
    "load_config": "autotune.config",
    "TrialResult": "autotune.result",
    "TrialOptions": "autotune.runner.request",
    "WorkloadSpec": "autotune.runner.workload",
    "run_trial": "autotune.api",
    "plan": "autotune.api",
    "tune": "autotune.api",
    "Recommendation": "autotune.recommendation",
}

__all__ = [
    "Recommendation",
    "TrainConfig",
    "TrialOptions",
    "TrialResult",
    "WorkloadSpec",
    "__version__",
    "load_config",
    "plan",
    "run_trial",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")

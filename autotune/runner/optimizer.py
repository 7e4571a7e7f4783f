"""The optimizer's implementation as a knob: the user's optimizer rebuilt with ``foreach`` or
``fused`` where its class takes the flag (PyTorch's Adam, AdamW, SGD and others do)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from autotune.errors import ConfigError

IMPLEMENTATIONS = ("foreach", "fused")

OPTIMIZER_STEP = "in the optimizer's step"
"""The note an error raised by the optimizer's step carries (then the optimizer's class): the
rank's one-line reason says it, since such an error is the optimizer's, not the model's (a
user's Adafactor under FSDP2 mixed plain tensors with DTensor parameters)."""

MODEL_ARGUMENTS = ("model", "module", "net", "network")
"""Names of an optimizer factory's first parameter that ask for the model, not its parameters."""


def default_optimizer(parameters: Any, learning_rate: float = 1e-4) -> Any:
    """What trials train with when the workload names no optimizer: AdamW."""
    import torch  # imports torch only where an optimizer is built

    return torch.optim.AdamW(parameters, lr=learning_rate)


def takes_model(factory: Callable[..., Any]) -> bool:
    """Whether the user's optimizer factory is given the model rather than its parameters: its
    first parameter is named ``model`` (or ``module``, ``net``, ``network``), as a factory that
    groups the parameters by name (no weight decay for biases and norms) or calls the model's
    own ``configure_optimizers`` is written. A checked factory says so itself."""
    said = getattr(factory, "takes_model", None)
    if said is not None:
        return bool(said)
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(parameters) and parameters[0].name in MODEL_ARGUMENTS


def chosen_optimizer(
    factory: Callable[[Any], Any] | None, model: Any, learning_rate: float = 1e-4
) -> Callable[[Any], Any]:
    """The factory a training builds its optimizer with, first of: the user's (``--optimizer``,
    ``autotune_optimizer`` beside the model, ``prepare(optimizer=...)``), the one the model
    configures itself (a LightningModule's ``configure_optimizers``, as ``LightningStep`` holds
    it), the default AdamW at ``learning_rate``. The factory returned takes the parameters; a
    user's factory that takes the model (``takes_model``) is given ``model``, whose parameters
    are those of any wrapper around it."""
    if factory is not None:
        if takes_model(factory):
            return lambda _parameters: factory(model)
        return factory
    configured = getattr(model, "configured_optimizer", None)
    if configured is not None:
        return configured  # type: ignore[no-any-return]
    return functools.partial(default_optimizer, learning_rate=learning_rate)


def accepted_implementations(optimizer_class: type) -> tuple[str, ...]:
    """The implementation flags ``optimizer_class`` takes, of ``foreach`` and ``fused``."""
    parameters = inspect.signature(optimizer_class).parameters
    return tuple(flag for flag in IMPLEMENTATIONS if flag in parameters)


def device_default(optimizer: Any, device_type: str) -> str:
    """The implementation ``optimizer``, left at its default, runs on a ``device_type`` device:
    on CUDA PyTorch picks ``foreach`` (its step on every tensor at once, one temporary the
    size of all the parameters) where the class takes the flag and neither flag was set; on a
    CPU it loops over the tensors one at a time (the rule of ``torch.optim``'s private
    ``_default_to_fused_or_foreach``, mirrored here for traces run on a CPU for CUDA)."""
    groups = optimizer.param_groups
    if (
        device_type == "cuda"
        and "foreach" in accepted_implementations(type(optimizer))
        and all(g.get("foreach") is None and not g.get("fused") for g in groups)
    ):
        return "foreach"
    return "default"


def with_implementation(optimizer: Any, implementation: str) -> Any:
    """``optimizer`` (just built, no state yet) rebuilt over the same parameter groups with
    ``implementation`` on and the other flag off; ``default`` returns it as it is."""
    if implementation == "default":
        return optimizer
    cls = type(optimizer)
    accepted = accepted_implementations(cls)
    if implementation not in accepted:
        raise ConfigError(
            f"optimizer_impl={implementation}: {cls.__name__} takes no {implementation!r} flag "
            f"(it takes: {', '.join(accepted) or 'neither foreach nor fused'}); use "
            "optimizer_impl=default"
        )
    flags = {flag: flag == implementation for flag in accepted}
    return rebuilt(optimizer, [{**group, **flags} for group in optimizer.param_groups], **flags)


def rebuilt(optimizer: Any, groups: list[dict[str, Any]], **options: Any) -> Any:
    """``optimizer``'s class built again over ``groups``, with the options it was built with
    (those its constructor takes: its ``defaults`` may hold more) and ``options``."""
    cls = type(optimizer)
    taken = inspect.signature(cls).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in taken and k != "params"}
    return cls(groups, **{**defaults, **options})


def running_implementation(optimizer: Any) -> str:
    """The implementation flag ``optimizer``'s first parameter group is set to run with."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    return next((flag for flag in IMPLEMENTATIONS if group.get(flag)), "default")

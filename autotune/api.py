"""The Python API: what the CLI does, callable from a training pipeline."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, ParamSpec, TextIO, TypeVar

from autotune.config import TrainConfig, load_config, make_config
from autotune.errors import ConfigError, validated
from autotune.recommendation import Recommendation
from autotune.result import TrialResult
from autotune.runner.launch import run_trial as launch
from autotune.runner.pickled import pickled_reference, release
from autotune.runner.planned_gpu import (
    GPUS,
    PLANNED,
    Properties,
    described,
    gpu_words,
    importing,
    planning,
    this_machines,
)
from autotune.runner.platform import resolve_device
from autotune.runner.references import running_user_code
from autotune.runner.request import TrialOptions
from autotune.runner.workload import (
    GLOBAL_BATCH_ATTRIBUTE,
    WorkloadSpec,
    check_workload,
    declared_global_batch,
)
from autotune.search.driver import resolve_global_batch, run_search
from autotune.search.log import memory_used
from autotune.search.meta_build import check_batches, check_optimizer
from autotune.search.model_facts import check_segments
from autotune.search.plan import Plan, make_plan
from autotune.search.progress import LineReporter, Reporter
from autotune.search.refusals import check_refusals, dataset_refusals, forget, model_refusals
from autotune.search.settings import make_settings
from autotune.search.space import load_space
from autotune.units import parse_bytes


def as_config(config: TrainConfig | dict[str, Any] | str | Path) -> TrainConfig:
    """Accept a TrainConfig, a mapping of its fields, or a path to a YAML/JSON file."""
    if isinstance(config, TrainConfig):
        return config
    if isinstance(config, dict):
        return make_config(config)
    return load_config(config)


def as_options(options: TrialOptions | None, overrides: dict[str, Any]) -> TrialOptions:
    base = options.model_dump() if options else {}
    return validated(TrialOptions, {**base, **overrides}, "trial options")


Reference = str | Callable[..., Any]
"""A workload part as a reference ("pkg.module:Name" or "file.py:Name"), or the class or function
itself where it lives in an importable module (or the script being run); for the parts other
than the model, also an object (a dataset, a loss module), pickled for the ranks."""


def _reference(
    value: Reference | None, what: str, paths: list[str], say: Callable[[str], None] | None
) -> str | None:
    """``value`` as the reference every rank imports it by, adding to ``paths`` the directory
    its module is imported from. A class or function of the script being run (``__main__``)
    is imported from the script's file; one defined inside a function has no name the ranks
    import: refused in one line. Any other object but the model is pickled for the ranks."""
    if value is None or isinstance(value, str):
        return value
    module_name = getattr(value, "__module__", None)
    name = getattr(value, "__qualname__", None)
    module = sys.modules.get(module_name or "")
    kind = type(value).__name__
    shown = f"{module_name}.{name}" if name else f"a{'n' * (kind[0] in 'aeiou')} {kind} object"
    where = f"{what}={shown}"
    if not callable(value) or module is None or not name:  # an object, not its class
        if what == "model" and not callable(value):
            raise ConfigError(
                f"{where}: give the model (a torch.nn.Module), or the class or factory that "
                "builds it, as an object or as 'pkg.module:Name' / 'path/to/file.py:Name'"
            )
        # a dataset, a loss module, a collator, a partial of a factory, a built model: each
        # rank loads its own copy
        return pickled_reference(value, where, _script_location(sys.modules["__main__"]), say)
    if name.endswith("<lambda>"):
        raise ConfigError(
            f"{where}: a lambda has no name the ranks can import it by; define a function at "
            "the top level of the script or of a module, or give a functools.partial of the "
            "class (optimizer=functools.partial(torch.optim.SGD, lr=0.05))"
        )
    if "<locals>" in name:
        raise ConfigError(
            f"{where}: defined in a function, which the ranks cannot import; move it to the "
            "module's top level and pass it from there"
        )
    if module_name == "__main__":
        return _script_reference(value, module, name, where)
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if found is not value:
        raise ConfigError(f"{where}: not found as {module_name}:{name}; give 'pkg.module:Name'")
    source = getattr(module, "__file__", None)
    if source:  # the directory the top-level package is imported from, for the ranks
        file = Path(source).resolve()
        depth = module.__name__.count(".") + (file.name == "__init__.py")
        paths.append(str(file.parents[depth]))
    return f"{module_name}:{name}"


def _script_reference(value: Any, script: Any, name: str, where: str) -> str:
    """A class or function of the script being run, as the ranks import it: the script by its
    module name where it runs as ``python -m pkg.train``, else by its file, as multiprocessing's
    spawn imports it. Its top-level code runs again in each import, and what its ``if __name__
    == "__main__":`` holds does not. A notebook's, which no file holds, is refused in one
    line."""
    source = getattr(script, "__file__", None)
    if not source:
        raise ConfigError(
            f"{where}: defined in an interactive session (a notebook), which the ranks cannot "
            "import; move it to a .py file and pass it from there"
        )
    if "." in name or getattr(script, name, None) is not value:
        raise ConfigError(
            f"{where}: not found at the top level of the script being run ({source}), where "
            "the ranks would import it from; define it there, or in a module"
        )
    return f"{_script_location(script)}:{name}"


def _script_location(script: Any) -> str | None:
    """Where the ranks import the script being run from: its module name where it runs as
    ``python -m pkg.train``, else its file (relative to here, for a copy shipped to a
    cluster); None in an interactive session, which no file holds."""
    spec = getattr(script, "__spec__", None)
    source = getattr(script, "__file__", None)
    if spec is not None and spec.name != "__main__":
        return str(spec.name)
    if not source:
        return None
    file = Path(source).resolve()
    with contextlib.suppress(ValueError):
        file = file.relative_to(Path.cwd())
    return str(file)


def _workload(
    model: Reference,
    data: Reference | None,
    loss: Reference | None,
    input_shape: tuple[int, ...] | None,
    input_dtype: str,
    optimizer: Reference | None = None,
    collate: Reference | None = None,
    say: Callable[[str], None] | None = None,
) -> WorkloadSpec:
    """The workload references, importable from ranks as from the caller's directory (and
    from where the modules of parts given as objects were imported). Refused where it is
    called from the user's code as autotune imports it: a script that calls the tuner outside
    its ``__main__`` guard. ``say``: told of a part given as an object that took seconds to
    pickle."""
    if (program := running_user_code()) is not None:
        raise ConfigError(
            f"autotune was called again while it imported {program} for its ranks: put the call "
            'under `if __name__ == "__main__":`, which only the script run directly enters'
        )
    data, collate = _unloaded(data, collate)
    paths = [os.getcwd()]
    parts = {
        what: _reference(value, what, paths, say)
        for what, value in (
            ("model", model),
            ("data", data),
            ("loss", loss),
            ("optimizer", optimizer),
            ("collate", collate),
        )
    }
    return validated(
        WorkloadSpec,
        {
            **parts,
            "input_shape": input_shape,
            "input_dtype": input_dtype,
            "search_path": tuple(dict.fromkeys(paths)),
        },
        "workload",
    )


def _unloaded(data: Any, collate: Any) -> tuple[Any, Any]:
    """A DataLoader given as the data, as a pipeline holds one: its dataset, and its collate
    function where it batches with one of its own and none was given. Its batch size,
    workers, pinning and prefetching are what a configuration sets, and its sampler is
    replaced by the trials' ``DistributedSampler``."""
    loading = sys.modules.get("torch.utils.data")  # imported where a DataLoader exists
    if loading is None or not isinstance(data, loading.DataLoader):
        return data, collate
    own = data.collate_fn
    if collate is None and own is not loading.default_collate:
        collate = own
    return data.dataset, collate


P = ParamSpec("P")
R = TypeVar("R")


def _keeps_no_objects(call: Callable[P, R]) -> Callable[P, R]:
    """``call`` keeps nothing it was given past its return: a pipeline that tunes dataset after
    dataset (or model after model) in one process would otherwise hold every one of them."""

    @functools.wraps(call)
    def released(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return call(*args, **kwargs)
        finally:
            forget()
            release()

    return released


def _check_not_launched(call: str) -> None:
    """Refuse a call made in one process of a distributed launch (``torchrun train.py`` whose
    script tunes before it trains): each of its processes would run trials of its own, on the
    devices the others hold."""
    world = os.environ.get("WORLD_SIZE", "")
    if "RANK" in os.environ and world.isdigit() and int(world) > 1:
        raise ConfigError(
            f"autotune.{call}() called in a distributed launch (RANK={os.environ['RANK']} of "
            f"WORLD_SIZE={world}, as torchrun sets them): each process would run trials of its "
            "own on the same devices; tune before the launch, in a process run alone "
            "(`autotune search`), and launch training with its recommendation"
        )


@_keeps_no_objects
def run_trial(
    model: Reference,
    config: TrainConfig | dict[str, Any] | str | Path,
    *,
    data: Reference | None = None,
    loss: Reference | None = None,
    optimizer: Reference | None = None,
    collate: Reference | None = None,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    options: TrialOptions | None = None,
    rank_output: TextIO | None = None,
    **option_overrides: Any,
) -> TrialResult:
    """Measure one configuration of ``model`` ("pkg.mod:Model" or "file.py:Model", or the
    class or factory itself where it lives in an importable module; the same for the other
    parts).

    Bad input raises ``AutotuneError`` (a one-line message); a trial that fails (OOM, crash,
    hang, an exception in the model) is returned as a ``TrialResult`` with its status.
    ``option_overrides`` are ``TrialOptions`` fields, e.g. ``measured_steps=20``.
    ``optimizer`` ("module:attr") names a factory taking the parameters (or the model, where
    its first parameter is named ``model``) and returning a ``torch.optim.Optimizer``; without
    it the model module's ``autotune_optimizer``, else AdamW.
    ``collate`` ("module:attr") names the DataLoader's ``collate_fn`` (samples -> batch: padding
    samples of different lengths); without it the model module's ``autotune_collate``, else
    torch's ``default_collate``.
    A mapping without ``global_batch_size`` takes the model module's
    ``autotune_global_batch_size``. ``rank_output`` (a stream: ``sys.stderr``) receives each
    rank's own output as the trial ends: the model's prints and warnings, a failure's whole
    traceback, which the result's message gives one line of.
    """
    _check_not_launched("run_trial")
    workload = _workload(model, data, loss, input_shape, input_dtype, optimizer, collate)
    check_workload(workload)
    if isinstance(config, dict) and "global_batch_size" not in config:
        config = {**config, "global_batch_size": declared_global_batch_size(workload.model)}
    chosen = as_config(config)
    refusals = model_refusals(workload.model)
    refusals += dataset_refusals(workload, chosen.device, [chosen.num_workers], chosen.pin_memory)
    check_refusals(chosen, workload.model, refusals)
    if chosen.checkpoint_segments:  # more than the model has: one line, before any launch
        check_segments(workload, chosen.checkpoint_segments)
    return launch(chosen, workload, as_options(options, option_overrides), rank_output)


@_keeps_no_objects
def declared_global_batch_size(model: str) -> int:
    """The model module's ``autotune_global_batch_size``, for a trial given no global batch: a
    trial measures the user's training, so it never assumes one (a search says when it does)."""
    declared = declared_global_batch(_workload(model, None, None, None, "float32"))
    if declared is None:
        raise ConfigError(
            "--global-batch-size is required (or global_batch_size in --config, or "
            f"{GLOBAL_BATCH_ATTRIBUTE} in the model's module)"
        )
    return declared


@_keeps_no_objects
def tune(
    model: Reference,
    *,
    global_batch_size: int | None = None,
    data: Reference | None = None,
    loss: Reference | None = None,
    optimizer: Reference | None = None,
    collate: Reference | None = None,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    progress: bool = False,
    reporter: Reporter | None = None,
    rank_output: TextIO | None = None,
    **settings: Any,
) -> Recommendation:
    """Search for the fastest configuration of ``model`` (a reference or an importable class
    or factory, as for ``run_trial``) that fits the memory budget.

    ``settings`` are ``SearchSettings`` fields by their flat names: ``memory_budget``
    ("20GiB" or 0.9), ``trials``, ``time_budget_s``, ``space``, ``devices``, ``storage``,
    ``ray_address``, ... (``autotune search --help`` lists them all). Nothing is printed
    unless ``progress=True``. Re-running with the same arguments resumes the study.
    Without ``global_batch_size`` the model module's ``autotune_global_batch_size`` is used,
    else 32; ``Recommendation.global_batch_source`` says which.
    Bad input raises ``AutotuneError`` with a one-line message. ``rank_output`` (a stream:
    ``sys.stderr``) receives the ranks' own output as each trial ends, as ``run_trial``'s does.
    """
    _check_not_launched("tune")
    checked = make_settings({"global_batch_size": global_batch_size, **settings})
    if reporter is None:
        reporter = LineReporter(trials=checked.budget.trials) if progress else Reporter()
    parts = (model, data, loss, input_shape, input_dtype, optimizer, collate)
    workload = _workload(*parts, say=reporter.phase)
    return run_search(workload, checked, reporter, rank_output)


@_keeps_no_objects
def plan(
    model: Reference,
    *,
    devices: int,
    device_memory: str | int | None = None,
    device: str | None = None,
    gpu: str | None = None,
    space: str | None = "default",
    config: TrainConfig | dict[str, Any] | str | Path | None = None,
    global_batch_size: int | None = None,
    safety_margin: float = 0.1,
    calibrate: bool = False,
    data: Reference | None = None,
    loss: Reference | None = None,
    optimizer: Reference | None = None,
    collate: Reference | None = None,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    progress: bool = False,
) -> Plan:
    """The predicted peak per device of every configuration of ``space`` (or of ``config``)
    on ``devices`` devices of ``device_memory`` each, without running a step: the model traced
    under fake tensors on this machine. ``gpu``: which GPU a plan for CUDA is for, one of
    ``planned_gpu.GPUS`` (an H100 80GB unless given; ``device_memory`` defaults to its memory),
    where this machine has none. ``calibrate=True`` first runs one short real trial here
    to measure what the process adds to its tensors (only for this machine's kind of device).
    Every number in the result is a prediction. ``device``: the kind planned for; by default
    ``config``'s own device (where it names one), else cuda. Bad input raises
    ``AutotuneError``. ``progress=True`` says on stderr what takes time (each traced step).
    """
    say = LineReporter().phase if progress else None  # its clock starts here
    chosen = as_config(config) if config is not None else None
    device = _planned_device(device, chosen, devices)
    chosen = chosen.resolved(device) if chosen is not None else None  # device=auto: this one
    if devices < 1:
        raise ConfigError(f"--devices {devices}: must be at least 1")
    if not 0 <= safety_margin < 1:
        raise ConfigError(f"--safety-margin {safety_margin}: must be in [0, 1)")
    gpu = gpu.lower() if gpu is not None else None  # H100 as h100
    if device_memory is None and gpu is None:
        raise ConfigError(
            "--device-memory: give one device's memory (80GiB), or --gpu NAME for a listed "
            f"GPU's ({', '.join(GPUS)})"
        )
    try:
        given = parse_bytes(device_memory) if isinstance(device_memory, str) else device_memory
    except ValueError as error:
        raise ConfigError(f"--device-memory: {error}") from None
    planned_for = _planned_gpu(gpu, device, given)
    memory = planned_for.total_memory if given is None else given
    parts = (model, data, loss, input_shape, input_dtype, optimizer, collate)
    workload = _workload(*parts, say=say)
    if say is not None:
        say(f"reading {workload.model} and its data: imports, a build on the meta device")
    from autotune.runner.fake_memory import warnings_once  # imports torch

    # the model's modules imported and built here: for CUDA, told the planned GPU's answers
    asking = importing(workload) if device == "cuda" else contextlib.nullcontext()
    # the model's own warnings, said once: not again by each trace
    with warnings_once(), planning(planned_for), asking:
        check_workload(workload)
        check_batches(workload)
        check_optimizer(workload)
        if chosen is not None:
            gbs = chosen.global_batch_size
        else:
            settings = make_settings({"global_batch_size": global_batch_size})
            gbs = resolve_global_batch(workload, settings)[0].global_batch_size or 0
        measure = None
        if calibrate:
            if resolve_device("auto") != device:
                raise ConfigError(
                    f"--calibrate measures a real step here, and this machine has no {device} "
                    "device; plan without it"
                )
            measure = _short_trial_peak(workload)
        return make_plan(
            workload,
            devices=devices,
            limit_bytes=int(memory * (1 - safety_margin)),
            device_type=device,
            global_batch_size=gbs,
            space=load_space(space) if chosen is None and space else None,
            config=chosen,
            measure=measure,
            progress=say,
            gpu=planned_for if device == "cuda" else None,
            gpu_said=gpu_words(planned_for, gpu, device_memory is None) if device == "cuda" else "",
        )


def _planned_gpu(gpu: str | None, device: str, memory: int | None) -> Properties:
    """The GPU a plan for ``device`` is made for: this machine's where it has one, else ``gpu``
    named (or given by its capability and memory, ``planned_gpu.described``; ``memory``: the
    device memory given), else ``PLANNED``. Refused where the plan is not for CUDA, where
    ``gpu`` is neither, or where this machine has a GPU, whose own answers and kernels a trace
    for CUDA takes."""
    import torch

    if gpu is not None and device != "cuda":
        raise ConfigError(f"--gpu {gpu}: names a CUDA GPU, and the plan is for {device}")
    if device != "cuda":
        return PLANNED  # asked of nothing: a plan for CPU traces no GPU
    try:
        named = None if gpu is None else GPUS.get(gpu) or described(gpu, memory)
    except ValueError as error:
        raise ConfigError(f"--gpu {gpu!r}: {error}") from None
    if not torch.cuda.is_available():
        return named or PLANNED
    if gpu is None:
        return this_machines()
    raise ConfigError(
        f"--gpu {gpu}: this machine has a GPU ({torch.cuda.get_device_name()}), whose "
        "kernels and answers the plan takes; drop --gpu, or hide it (CUDA_VISIBLE_DEVICES=)"
    )


def _planned_device(
    device: str | None, config: TrainConfig | None, devices: int
) -> Literal["cpu", "cuda"]:
    """The kind of device a plan is for: ``device``, else the configuration's own, else cuda.
    A configuration planned as another device than its own, or on fewer devices than it
    uses, is refused: the plan would show numbers for something other than the file."""
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: use cpu or cuda")
    if config is None:
        return "cpu" if device == "cpu" else "cuda"
    own = config.device
    if device is not None and own != "auto" and own != device:
        raise ConfigError(
            f"--device {device}: the configuration's device is {own}; drop --device to plan it "
            f"as it is, or set device: {device} in it"
        )
    if config.world_size > devices:
        raise ConfigError(
            f"--devices {devices}: the configuration uses world_size={config.world_size}; "
            f"plan it with --devices {config.world_size} or more"
        )
    return "cpu" if (device or own) == "cpu" else "cuda"


def _short_trial_peak(workload: WorkloadSpec) -> Any:
    def measure(config: TrainConfig) -> int | None:
        options = as_options(None, {"warmup_steps": 1, "measured_steps": 2, "target_interval": 0})
        result = launch(config, workload, options)
        return memory_used(result, config.device)

    return measure

"""What to train: the user's model, its data and its loss, found the way users expect.

A ``WorkloadSpec`` is a small, serialisable set of references ("pkg.mod:Name" or
"path/to/file.py:Name") that travels to every rank; each rank calls ``build_workload`` to turn it
into a live model, dataset and loss. The lookup rules are documented in README.md ("Your model").
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import WorkloadError, error_line, first_three
from autotune.runner.compile_state import compiled_module
from autotune.runner.instances import copy_with_tensors
from autotune.runner.loss import default_loss
from autotune.runner.optimizer import MODEL_ARGUMENTS, takes_model
from autotune.runner.pickled import described, is_pickled
from autotune.runner.references import FILE_MODULE_PREFIX, call_factory, resolve_reference

BUILDING = "building the workload"
"""A rank's stage that builds the model, its data and loss: a failure there is the model's,
whatever the configuration (none is applied yet)."""

DATASET_ATTRIBUTE = "autotune_dataset"
"""Name of the dataset (or factory) a model's module may expose when no --data is given."""

GLOBAL_BATCH_ATTRIBUTE = "autotune_global_batch_size"
"""Name of the global batch size (an int) a model's module may declare for the search."""

DEFAULT_GLOBAL_BATCH_SIZE = 32
"""The global batch a search uses when neither the user nor the model's module gives one."""

LOSS_ATTRIBUTE = "autotune_loss"
"""Name of the loss function, ``loss(output, target)``, a model's module may expose when no
--loss is given."""

OPTIMIZER_ATTRIBUTE = "autotune_optimizer"
"""Name of the optimizer factory (parameters -> torch.optim.Optimizer) a model's module may
expose when no --optimizer is given."""

DEFAULT_OPTIMIZER = "AdamW"
"""What trials train with when the user names no optimizer (``TrialOptions.learning_rate``)."""

COLLATE_ATTRIBUTE = "autotune_collate"
"""Name of the function a model's module may expose to make one batch of samples (the
DataLoader's ``collate_fn``: padding samples of different lengths) when no --collate is given."""

DEFAULT_COLLATE = "torch's default_collate"

EXAMPLE_INPUT_ATTRIBUTE = "example_input"
"""Name of one example sample (no batch dimension) a model may carry, for synthetic data."""


class WorkloadSpec(BaseModel):
    """References to the user's model, data and loss; resolved inside each rank process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="'pkg.module:Model' or 'path/to/file.py:Model'.")
    data: str | None = Field(None, description="'module:attr' naming a Dataset or a factory.")
    loss: str | None = Field(None, description="'module:attr' naming loss(output, target).")
    optimizer: str | None = Field(
        None,
        description="'module:attr' naming a factory: parameters -> torch.optim.Optimizer.",
    )
    collate: str | None = Field(
        None,
        description="'module:attr' naming collate(samples) -> batch, the DataLoader's "
        "collate_fn (padding samples of different lengths).",
    )
    input_shape: tuple[int, ...] | None = Field(
        None, description="Shape of one synthetic sample, without the batch dimension."
    )
    input_dtype: str = Field("float32", description="dtype of synthetic samples.")
    search_path: tuple[str, ...] = Field(
        (), description="Directories put on sys.path so that ranks import what the caller did."
    )


@dataclass
class Workload:
    """A live model, its dataset and a loss, built inside one rank process."""

    model: Any  # torch.nn.Module; typed loosely so this module imports without torch
    dataset: Any  # torch.utils.data.Dataset
    loss: Callable[[Any, Any], Any]  # (output, target) -> scalar tensor
    data_source: str
    loss_source: str
    optimizer: Callable[[Any], Any] | None = None  # parameters -> Optimizer; None: AdamW
    optimizer_source: str = f"default {DEFAULT_OPTIMIZER}"
    collate: Callable[[list[Any]], Any] | None = None  # samples -> batch; None: default_collate
    collate_source: str = DEFAULT_COLLATE


def parameter_dtype(model: Any) -> str | None:
    """The one floating dtype every floating parameter of ``model`` has ("float32",
    "bfloat16", ...); None where they differ or there are none."""
    floating = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
    floating &= {"float64", "float32", "bfloat16", "float16"}
    return floating.pop() if len(floating) == 1 else None


def _check_model_target(target: Any, reference: str) -> None:
    import torch.nn as nn

    if isinstance(target, nn.Module):
        return
    if not callable(target):
        raise WorkloadError(
            f"--model {reference!r} is a {type(target).__name__}, expected an nn.Module "
            "subclass or a zero-argument factory returning one"
        )
    if inspect.isclass(target) and not issubclass(target, nn.Module):
        raise WorkloadError(
            f"--model {reference!r} is the class {target.__name__}, which is not a "
            "torch.nn.Module subclass"
        )


def put_on_path(spec: WorkloadSpec) -> None:
    """``spec``'s search path first on ``sys.path``, so that its references import as the
    caller's did."""
    for directory in reversed(spec.search_path):
        if directory not in sys.path:
            sys.path.insert(0, directory)


def check_workload(spec: WorkloadSpec) -> None:
    """Resolve every reference in ``spec`` without building anything: fail fast, in one line."""
    put_on_path(spec)
    module, target = resolve_reference(spec.model, "--model")
    _check_model_target(target, spec.model)
    load_optimizer(spec, module)
    if spec.data:
        resolve_reference(spec.data, "--data")
    load_loss(spec, module)
    load_collate(spec, module)
    _check_synthetic_flags(spec, module)
    if spec.input_shape is not None:
        import torch

        if not isinstance(getattr(torch, spec.input_dtype, None), torch.dtype):
            raise WorkloadError(
                f"--input-dtype {spec.input_dtype!r} is not a torch dtype; use e.g. float32, "
                "bfloat16, int64"
            )


SYNTHETIC_LAST = "the first of --data, autotune_dataset, model.example_input, --input-shape wins"


def _check_synthetic_flags(spec: WorkloadSpec, module: Any) -> None:
    """``--input-shape`` and ``--input-dtype`` shape synthetic data, the last source of data:
    given beside a source that comes first, they would be ignored, so say so instead."""
    if spec.input_shape is None:
        if spec.input_dtype != "float32":
            raise WorkloadError(
                f"--input-dtype {spec.input_dtype} shapes synthetic samples and needs "
                "--input-shape (e.g. 3x224x224)"
            )
        return
    if spec.data:
        source = described(spec.data, "--data")
    elif hasattr(module, DATASET_ATTRIBUTE):
        source = _beside_model(spec, DATASET_ATTRIBUTE)
    else:
        return
    raise _shape_ignored(spec, f"the data comes from {source}", "one of them")


def _shape_ignored(spec: WorkloadSpec, because: str, drop: str) -> WorkloadError:
    """The error for ``--input-shape`` given beside a source of data that comes first."""
    shape = "x".join(map(str, spec.input_shape or ()))
    return WorkloadError(
        f"--input-shape {shape} would be ignored: {because} ({SYNTHETIC_LAST}); drop {drop}"
    )


def declared_global_batch(spec: WorkloadSpec) -> int | None:
    """``autotune_global_batch_size`` of the model's module, or None where it declares none."""
    put_on_path(spec)  # a module in the caller's directory, as every other reference
    module, _ = resolve_reference(spec.model, "--model")
    value = getattr(module, GLOBAL_BATCH_ATTRIBUTE, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(
            f"{module.__name__}.{GLOBAL_BATCH_ATTRIBUTE} = {value!r}: expected a positive int"
        )
    return value


def load_model(reference: str, fresh: bool = False) -> tuple[Any, Any]:
    """Build the model named by ``reference``; return (module it came from, model). A
    LightningModule comes as ``lightning.LightningStep``: its training step is the forward.
    ``fresh``: a model given as an object is read from its file again, not the one loaded
    before."""
    import torch.nn as nn

    from autotune.runner.lightning import trained_as  # imports torch

    module, target = resolve_reference(reference, "--model", fresh)
    _check_model_target(target, reference)
    model = target if isinstance(target, nn.Module) else call_factory(target, reference, "--model")
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"--model {reference!r} returned a {type(model).__name__}, expected a torch.nn.Module"
        )
    # compiled by its factory: the module it wraps, so that the config's compile decides
    model = compiled_module(model) or model
    return module, trained_as(model)


def check_materialised(model: Any, reference: str) -> None:
    """Refuse a model whose factory built it on the meta device itself (``with
    torch.device("meta")``, as a large model's is written to be initialised after sharding):
    its tensors hold no values to train, and every trial would fail as it moved them."""
    from torch.nn.parameter import is_lazy

    held = [*model.named_parameters(), *model.named_buffers()]
    meta = [name for name, t in held if t.is_meta and not is_lazy(t)]
    if meta:
        raise WorkloadError(
            f"--model {reference!r} builds its tensors on the meta device ({first_three(meta)}), "
            "where they hold no values to train: give a factory that materialises them "
            '(model.to_empty(device="cpu"), then its initialisation: reset_parameters(), '
            "init_weights()); `autotune plan` predicts its memory as it is"
        )


def model_optimizer(model: Any) -> OptimizerFactory | None:
    """The optimizer the model configures itself (a LightningModule's
    ``configure_optimizers``), as a factory of the parameters; None where it does not."""
    return getattr(model, "configured_optimizer", None)


def _instantiate_dataset(
    source: Any,
    model: Any,
    reference: str,
    what: str,
    collate_given: Callable[[], bool] = lambda: False,
) -> tuple[Any, str]:
    """The dataset ``source`` gives, and a note for where it comes from ('' but for a
    LightningDataModule whose loader samples with a sampler of its own)."""
    from torch.utils.data import Dataset, IterableDataset

    from autotune.runner.lightning import is_data_module, train_dataset  # imports torch

    dataset, note = source, ""
    if not isinstance(source, Dataset) and callable(source):
        wants_model = _takes_one_argument(source)
        dataset = call_factory(source, reference, what, *((model,) if wants_model else ()))
    if is_data_module(dataset):  # a LightningDataModule: the dataset its loader trains on
        dataset, note = train_dataset(dataset, f"{what} {reference!r}", collate_given())
    if isinstance(dataset, IterableDataset):
        return dataset, note  # a stream: it shards itself across ranks and workers (README)
    if not isinstance(dataset, Dataset) and not _indexable(dataset):
        raise WorkloadError(
            f"{what} {reference!r} gave a {type(dataset).__name__}, expected a "
            "torch.utils.data.Dataset (map-style, or an IterableDataset stream), samples by "
            "index (a list, a Hugging Face datasets.Dataset: __len__ and __getitem__), or a "
            "factory returning one"
        )
    if not hasattr(dataset, "__len__"):
        raise WorkloadError(
            f"{what} {reference!r} has no __len__; a map-style Dataset needs one (a stream "
            "without a length is an IterableDataset)"
        )
    return dataset, note


def _indexable(value: Any) -> bool:
    """Samples by index, as a DataLoader takes them: a list, a tuple, a Hugging Face
    ``datasets.Dataset`` (not a torch ``Dataset``), anything with ``__len__`` and
    ``__getitem__``; not a string or a mapping, whose items are not samples."""
    from collections.abc import Mapping

    if isinstance(value, (str, bytes, Mapping)):
        return False
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def _takes_one_argument(function: Any) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 1


def _beside_model(spec: WorkloadSpec, attribute: str) -> str:
    """``attribute`` of the model's module, named as the user named the model (a file path
    stays a path, not the name it is imported under)."""
    return f"{model_location(spec)}:{attribute}"


def model_location(spec: WorkloadSpec) -> str:
    """The model's module as the user named it; for a model given to the API as an object
    (pickled), the module its class or factory comes from, a file's by its path."""
    if not is_pickled(spec.model):
        return spec.model.rpartition(":")[0]
    module, _ = resolve_reference(spec.model, "--model")
    if module is None:
        return "the model's module"
    name: str = module.__name__
    return str(getattr(module, "__file__", name)) if name.startswith(FILE_MODULE_PREFIX) else name


def load_dataset(spec: WorkloadSpec, model_module: Any, model: Any) -> tuple[Any, str]:
    """The dataset for ``model`` and a description of where it came from: ``--data`` (a
    LightningDataModule too), else ``autotune_dataset``, else a LightningModule's own
    ``train_dataloader()``, else synthetic samples."""
    from autotune.runner.lightning import (  # imports torch
        LightningStep,
        defines_train_dataloader,
        train_dataset,
    )

    def given() -> bool:  # asked only where a Lightning loader is read
        return load_collate(spec, model_module)[0] is not None

    if spec.data:
        _, source = resolve_reference(spec.data, "--data")
        dataset, note = _instantiate_dataset(source, model, spec.data, "--data", given)
        return dataset, f"{described(spec.data, '--data')}{note}"
    if hasattr(model_module, DATASET_ATTRIBUTE):
        reference = _beside_model(spec, DATASET_ATTRIBUTE)
        source = getattr(model_module, DATASET_ATTRIBUTE)
        dataset, note = _instantiate_dataset(source, model, reference, "dataset", given)
        return dataset, f"{reference}{note}"
    if isinstance(model, LightningStep) and defines_train_dataloader(model.module):
        named = "the LightningModule"
        dataset, note = train_dataset(model.module, named, given())
        return dataset, f"{named}'s train_dataloader(){note}"
    from autotune.runner.synthetic import (  # imports torch: when data is needed
        INTEGER_HIGH,
        SyntheticDataset,
        holds_float32,
        lookup_bound,
    )

    example = getattr(model, EXAMPLE_INPUT_ATTRIBUTE, None)
    if example is not None and spec.input_shape is not None:
        raise _shape_ignored(spec, f"the model has '{EXAMPLE_INPUT_ATTRIBUTE}'", "--input-shape")
    if example is not None:
        own = parameter_dtype(model)
        if own in (None, "float32") or not holds_float32(example):
            return SyntheticDataset.like(example), "synthetic, shaped like model.example_input"
        # a float32 example beside parameters of another dtype (``model.half()`` after the
        # example was made): float32 samples would meet them in the first matmul and fail
        return SyntheticDataset.like(example, own), (
            f"synthetic, shaped like model.example_input, {own} as the model's parameters "
            "(the example is float32)"
        )
    if spec.input_shape is not None:
        dtype, why = spec.input_dtype, ""
        own = parameter_dtype(model)
        if dtype == "float32" and own not in (None, "float32"):  # the default follows the model
            dtype, why = own, f" (the model's parameters are {own})"
        bound = lookup_bound(model)
        dataset = SyntheticDataset.from_shape(spec.input_shape, dtype, bound or INTEGER_HIGH)
        if dataset.high is not None:
            why = f" in [0, {dataset.high})" + (
                " (the model's smallest lookup table)" if bound == dataset.high else ""
            )
        return dataset, f"synthetic {dtype}{list(spec.input_shape)}{why}"
    raise WorkloadError(
        f"no data for --model {spec.model!r}: pass --data module:attr, expose "
        f"'{DATASET_ATTRIBUTE}' in the model's module, give the model an "
        f"'{EXAMPLE_INPUT_ATTRIBUTE}' attribute, or pass --input-shape (e.g. 3x224x224)"
    )


def _user_function(
    reference: str | None, flag: str, spec: WorkloadSpec, model_module: Any, attribute: str,
    expected: str,
) -> tuple[Callable[..., Any], str] | None:  # fmt: skip
    """(function, where it came from): the one ``reference`` names (given by ``flag``), else
    ``attribute`` in the model's module; None when neither. Not callable: one line, naming
    what was ``expected``."""
    if reference:
        _, function = resolve_reference(reference, flag)
        named, shown = described(reference, flag), f"{flag} {reference!r}"
    elif hasattr(model_module, attribute):
        function = getattr(model_module, attribute)
        named = _beside_model(spec, attribute)
        shown = repr(named)
    else:
        return None
    if not callable(function):
        raise WorkloadError(f"{shown} is a {type(function).__name__}, expected {expected}")
    return function, named


def first_samples(dataset: Any, count: int) -> list[Any]:
    """The first ``count`` samples of ``dataset`` (fewer if it holds fewer): by index, or the
    first a stream (an ``IterableDataset``) yields."""
    import itertools

    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        return list(itertools.islice(iter(dataset), count))
    return [dataset[i] for i in range(min(count, len(dataset)))]


def load_loss(spec: WorkloadSpec, model_module: Any) -> tuple[Callable[[Any, Any], Any], str]:
    """The user's loss function (``--loss``, else ``autotune_loss`` in the model's module), or
    the default rules of ``default_loss``."""
    expected = "a callable loss(output, target) returning a scalar tensor"
    found = _user_function(spec.loss, "--loss", spec, model_module, LOSS_ATTRIBUTE, expected)
    return found or (default_loss, "model output's loss, else default for (input, target)")


def load_collate(
    spec: WorkloadSpec, model_module: Any
) -> tuple[Callable[[list[Any]], Any] | None, str]:
    """The user's collate function (``--collate``, else ``autotune_collate`` in the model's
    module) and where it came from; None: torch's ``default_collate``."""
    expected = "a callable collate(samples) returning a batch"
    found = _user_function(
        spec.collate, "--collate", spec, model_module, COLLATE_ATTRIBUTE, expected
    )
    return found or (None, DEFAULT_COLLATE)


def resolve_optimizer(reference: str) -> Callable[[Any], Any]:
    """The optimizer factory ``reference`` names, checked to be callable (not yet called)."""
    _, factory = resolve_reference(reference, "--optimizer")
    return _callable_factory(factory, f"--optimizer {reference!r}")


def _callable_factory(factory: Any, named: str) -> Callable[[Any], Any]:
    if not callable(factory):
        raise WorkloadError(
            f"{named} is a {type(factory).__name__}, expected a factory taking the model's "
            "parameters and returning a torch.optim.Optimizer"
        )
    return factory  # type: ignore[no-any-return]


OptimizerFactory = Callable[[Any], Any]
"""The model's parameters -> a torch.optim.Optimizer (typed loosely: no torch import here)."""


def load_optimizer(spec: WorkloadSpec, model_module: Any) -> tuple[OptimizerFactory | None, str]:
    """The user's optimizer factory and where it came from; None: the default AdamW."""
    if spec.optimizer:
        return _checked_optimizer(resolve_optimizer(spec.optimizer), spec.optimizer)
    factory = getattr(model_module, OPTIMIZER_ATTRIBUTE, None)
    if factory is None:
        return None, f"default {DEFAULT_OPTIMIZER}"
    reference = _beside_model(spec, OPTIMIZER_ATTRIBUTE)
    return _checked_optimizer(_callable_factory(factory, reference), reference)


def _needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` must be given a closure (``torch.optim.LBFGS``)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is closure.empty


class _CheckedOptimizer:
    """The user's optimizer factory, its result checked: a ``torch.optim.Optimizer`` whose step
    takes no closure. Given the parameters, or the model where the factory asks for it
    (``optimizer.takes_model``)."""

    def __init__(self, factory: Callable[[Any], Any], reference: str) -> None:
        self.factory = factory
        self.reference = reference
        self.takes_model = takes_model(factory)

    def __call__(self, given: Any) -> Any:
        import torch

        reference = self.reference
        try:
            optimizer = call_factory(self.factory, reference, "optimizer", given)
        except WorkloadError as error:
            if self.takes_model or "'generator' object" not in str(error):
                raise
            raise WorkloadError(
                f"{error} (it is given the model's parameters; a factory that wants the model "
                f"names its first parameter one of: {', '.join(MODEL_ARGUMENTS)})"
            ) from error
        if not isinstance(optimizer, torch.optim.Optimizer):
            paired = isinstance(optimizer, tuple | list | dict)
            raise WorkloadError(
                f"optimizer {reference!r} returned a {type(optimizer).__name__}, expected a "
                "torch.optim.Optimizer"
                + (
                    " alone (a learning-rate schedule changes neither a step's time nor its "
                    "memory: trials need none)"
                    if paired
                    else ""
                )
            )
        if _needs_closure(optimizer):
            raise WorkloadError(
                f"optimizer {reference!r} returned a {type(optimizer).__name__}, whose step "
                "needs a closure that evaluates the loss again (several forward and backward "
                "passes a step); a trial's step calls step() once after the backward: give an "
                "optimizer whose step takes no closure"
            )
        return optimizer


def _checked_optimizer(
    factory: Callable[[Any], Any], reference: str
) -> tuple[Callable[[Any], Any], str]:
    return _CheckedOptimizer(factory, reference), reference


def describe_optimizer(spec: WorkloadSpec, configures: bool = False) -> str:
    """Where the trials' optimizer comes from, in words (the default says how to give one);
    ``configures``: the model, as built, configures its own (``meta_build.configures_optimizer``:
    a factory's LightningModule, which the reference alone does not tell)."""
    from autotune.runner.lightning import CONFIGURED, is_lightning_module  # imports torch

    module, target = resolve_reference(spec.model, "--model")
    factory, source = load_optimizer(spec, module)
    if factory is not None:
        return described(source, "--optimizer") if spec.optimizer else source
    if configures or is_lightning_module(target):
        return CONFIGURED
    return (
        f"default {DEFAULT_OPTIMIZER}: memory and speed hold for it; give the one you train "
        f"with by --optimizer module:attr or {OPTIMIZER_ATTRIBUTE} in the model's module"
    )


def describe_collate(spec: WorkloadSpec) -> str | None:
    """Where the trials' collate function comes from (None: torch's ``default_collate``)."""
    module, _ = resolve_reference(spec.model, "--model")
    function, source = load_collate(spec, module)
    return source if function is not None else None


def _materialize(model: Any, dataset: Any, collate: Any, reference: str) -> None:
    """Give the model's lazy modules their shapes (``lazy_modules.materialize``) from a batch of
    the dataset's first samples, before any wrapper sees them."""
    from autotune.runner.lazy_modules import materialize_from_data  # imports torch

    try:
        materialize_from_data(model, dataset, collate)
    except Exception as error:
        raise WorkloadError(
            f"--model {reference!r}: the forward that gives its lazy modules their shapes "
            f"failed: {error_line(error)}"
        ) from error


def build_workload(spec: WorkloadSpec) -> Workload:
    """Import and build everything ``spec`` names; raises WorkloadError with one clear line."""
    put_on_path(spec)
    model_module, model = load_model(spec.model)
    check_materialised(model, spec.model)
    dataset, data_source = load_dataset(spec, model_module, model)
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise WorkloadError(f"the dataset from {data_source} is empty")
    loss, loss_source = load_loss(spec, model_module)
    optimizer, optimizer_source = load_optimizer(spec, model_module)
    collate, collate_source = load_collate(spec, model_module)
    _materialize(model, dataset, collate, spec.model)
    return Workload(
        model, dataset, loss, data_source, loss_source, optimizer, optimizer_source,
        collate, collate_source,
    )  # fmt: skip


def _copied(model: Any, reference: str) -> Any:
    """A deep copy of ``model``; where ``deepcopy`` refuses a tensor the model computed
    (``weight_norm``'s weight), a copy with every tensor cloned (``instances``)."""
    import copy

    try:
        return copy.deepcopy(model)
    except RuntimeError:  # "Only Tensors created explicitly by the user ... support deepcopy"
        return copy_with_tensors(model, lambda t: t.clone(), reference)


class WorkloadCache:
    """Builds each workload once per process and hands out a fresh model copy per trial.

    For processes that run trial after trial: the user's module, dataset and loss are kept,
    and the model is deep-copied from a pristine instance (no re-initialisation); a model that
    cannot be deep-copied (it holds a lock) is built again for each trial.
    """

    def __init__(self) -> None:
        self._built: dict[str, Workload] = {}
        self._uncopyable: set[str] = set()

    def get(self, spec: WorkloadSpec) -> Workload:
        import dataclasses

        key = spec.model_dump_json()
        if key not in self._built:
            self._built[key] = build_workload(spec)
        pristine = self._built[key]
        if key not in self._uncopyable:
            try:
                return dataclasses.replace(pristine, model=_copied(pristine.model, spec.model))
            except Exception:  # it holds what cannot be copied: a lock, an open file
                self._uncopyable.add(key)
        _, model = load_model(spec.model, fresh=True)  # as a process of its own would build it
        _materialize(model, pristine.dataset, pristine.collate, spec.model)
        return dataclasses.replace(pristine, model=model)

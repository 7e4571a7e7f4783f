"""The tensors one training step holds at its peak, traced under fake tensors: nothing allocated.

This is the one module that uses PyTorch's private memory tools (``torch._subclasses``'
``FakeTensorMode`` with a ``torch.fx.experimental`` ``ShapeEnv``, and
``torch.distributed._tools.mem_tracker.MemTracker`` with its ``mod_tracker.ModTracker``), with
``autotune.runner.fake_routing`` beside it for a mixture of experts' routing (a
``torch.utils._python_dispatch`` mode); they may change between releases, so
``tests/runner/test_fake_memory.py`` pins what is relied on, and every failure of theirs becomes
``TraceError`` with one line, for the caller's fallback (a fit over measured trials,
``autotune.search.memory_model``).

The step is the trials' own: the user's model built under the fake mode, checkpointing applied
by the same code, a batch shaped as the DataLoader makes it (``autotune.runner.fake_batch``), one
forward under the config's autocast (for a CUDA device, CUDA's op lists,
``autotune.runner.fake_autocast``, and its fused attention, ``fake_attention``), the loss,
backward and the user's
optimizer step, twice (the first step creates the optimizer's state, the second holds it beside
the gradients and activations). One device, as ``parallel=single`` runs it; what DDP and FSDP
add or shard is arithmetic on these parts (``autotune.search.memory_model``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import WorkloadError, error_line
from autotune.runner.compile_state import eager_compiles, torchs_own_rules
from autotune.runner.fake_batch import fake_batch, varying
from autotune.runner.fake_group import fake_group, in_group
from autotune.runner.fake_transformers import values_read_where_known
from autotune.runner.instances import copy_with_tensors
from autotune.runner.loss import call_loss
from autotune.runner.optimizer import chosen_optimizer, device_default, with_implementation
from autotune.runner.planned_gpu import AVAILABLE
from autotune.runner.workload import (
    WorkloadSpec,
    load_collate,
    load_dataset,
    load_loss,
    load_model,
    load_optimizer,
    put_on_path,
)


class TraceError(Exception):
    """The model could not be traced under fake tensors (a data-dependent op, say)."""


@dataclass(frozen=True)
class TensorPeak:
    """The tensors of one device at the step's peak, by what they are (bytes)."""

    total_bytes: int
    parameters_bytes: int  # all of the model's parameters and buffers
    gradients_bytes: int  # at the peak
    optimizer_bytes: int  # the optimizer's state at the peak
    block_parameters_bytes: int  # the largest repeated block's parameters (FSDP's unit)
    outside_blocks_bytes: int  # parameters outside the repeated blocks (FSDP's root unit)
    gradient_bytes_full: int  # every parameter's gradient (DDP's buckets copy them)
    backward_bytes: int = 0  # forward and backward's peak beside the optimizer state (0: total's)
    backward_gradients_bytes: int = 0  # the gradients at that moment
    routed_sizes: int = 0  # sizes a mixture of experts' routing decides, taken at uniform routing
    drawn_branches: int = 0  # branches a random draw decides (LayerDrop), taken at their likeliest
    unused_parameters: int = 0  # trainable parameters the traced step left without a gradient
    sampled_selections: int = 0  # sizes the batch's values decide, at the first samples' share
    varying_batches: bool = (
        False  # batches of other samples have other shapes (``fake_batch.varying``)
    )
    carried_state: tuple[str, ...] = ()  # module tensors a step leaves for the next (``_carried``)
    recurrent_layers: tuple[str, ...] = ()  # the kinds of recurrent layer traced (``nn.RNNBase``)
    group_world: int = 0  # the ranks of the group it was traced in (0: none, ``fake_group``)
    flex_dense_calls: int = 0  # FlexAttention's forwards traced dense (CUDA without compile)
    flex_fused_calls: int = 0  # and fused (compiled by the model's own code: ``fake_flex``)
    flex_dense_excess_bytes: int = 0  # what its dense calls add to the peak over fused ones
    flex_dense_excess_backward_bytes: int = 0  # and to ``backward_bytes``
    offloaded_bytes: int = 0  # saved by ``save_on_cpu`` into host memory (CUDA's: ``fake_offload``)
    dataset_on_device_bytes: int = 0  # what the dataset keeps on CUDA, beside the step
    cuda_asked: tuple[str, ...] = ()  # what the model's code asked of the GPU (``planned_gpu``)

    def held_alike(self, other: TensorPeak) -> bool:
        """Whether ``other``, the same step traced in a group of another size, holds the same:
        a step that gathers from every rank holds more among more."""
        return replace(self, group_world=0) == replace(other, group_world=0)

    def compiled(self) -> TensorPeak:
        """The step as ``torch.compile`` runs it on CUDA where the eager trace is far from it:
        FlexAttention's dense calls as its fused kernel, which holds no scores (sequence x
        sequence per head). Otherwise the step itself: compile is predicted as eager, an
        upper bound (Inductor frees some activations early, and holds its own buffers)."""
        if not self.flex_dense_excess_bytes:
            return self
        return replace(
            self,
            total_bytes=self.total_bytes - self.flex_dense_excess_bytes,
            backward_bytes=max(0, self.backward_bytes - self.flex_dense_excess_backward_bytes),
            flex_fused_calls=self.flex_fused_calls + self.flex_dense_calls,
            flex_dense_calls=0,
            flex_dense_excess_bytes=0,
            flex_dense_excess_backward_bytes=0,
        )

    @property
    def needs_unused_parameters(self) -> bool:
        """Whether DDP needs ``find_unused_parameters``: the step left a parameter without a
        gradient (an unused head), or a random draw decides a branch (LayerDrop skips layers
        in some steps, whose parameters then get none)."""
        return self.unused_parameters > 0 or self.drawn_branches > 0

    @property
    def accumulating_bytes(self) -> int:
        """What accumulating gradients adds to the peak: each later micro-step's forward and
        backward runs beside every gradient of the earlier ones, where the traced step (its
        gradients set to None before it) held only its own."""
        backward = self.backward_bytes or self.total_bytes
        held = self.backward_gradients_bytes if self.backward_bytes else self.gradients_bytes
        return max(0, backward - held + self.gradient_bytes_full - self.total_bytes)

    @property
    def activations_bytes(self) -> int:
        """What the batch adds at the peak: activations and backward's temporaries."""
        return max(
            0,
            self.total_bytes - self.parameters_bytes - self.gradients_bytes - self.optimizer_bytes,
        )


def _fake_model(spec: WorkloadSpec, mode: Any, routing: Any) -> tuple[Any, Any]:
    """(module, model) built under the fake ``mode``, or on the meta device where that cannot
    be done, and made fake. Built under ``routing`` too, so that the small tensors made from
    constants (a queue's pointer, a "initialised" flag, position ids: buffers the forward may
    read) keep their values (``fake_shadows``)."""
    import torch

    from autotune.runner.fake_shadows import FakeDeepcopies  # imports torch
    from autotune.runner.lazy_modules import has_lazy_parameters  # imports torch

    try:
        with mode, routing, FakeDeepcopies():
            module, model = load_model(spec.model)
        if has_lazy_parameters(model):
            # A lazy module's parameter is a real tensor until its first forward, which cannot
            # then become a fake one: on the meta device it takes its shape without memory
            # (``_materialized``), and is faked after.
            with torch.device("meta"):
                module, model = load_model(spec.model)
    except WorkloadError as error:
        # A constructor that cannot run on fake tensors: one that reads its initial values
        # (Hugging Face ViT's trunc_normal_ draws again until no value lies out of range), or
        # converts its parameters (``.double()``: ``_apply`` cannot swap a fake parameter for
        # one of another dtype). On the meta device initialisation is skipped and conversions
        # work, with the same shapes and dtypes; a constructor that fails there too is the
        # model's, and its first error is said.
        try:
            with torch.device("meta"):
                module, model = load_model(spec.model)
        except WorkloadError:
            raise error from error.__cause__
    return module, _fake_copy(model, mode, spec.model)


def _fake_copy(model: Any, mode: Any, reference: str) -> Any:
    """``model`` with every parameter and buffer a fake tensor: itself where it was built under
    the fake mode, else a copy (``instances.copy_with_tensors``): the reference named an
    instance built before (the user's own model, left as it was), or it was built on the meta
    device. Lazy ones stay as they are until ``_materialized``."""
    import torch
    from torch.nn.parameter import is_lazy

    def fake(tensor: Any) -> Any:
        if tensor.device.type != "cpu":  # shapes only (meta, or the caller's model on its GPU):
            with mode:  # an empty fake tensor of the same shape, on the CPU, as traces are
                return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
        return mode.from_tensor(tensor)

    fakes = _fake_tensor_class()
    if all((not p.is_meta and isinstance(p, fakes)) or is_lazy(p) for p in model.parameters()):
        return model  # built under the fake mode: its buffers are as the constructor made them
    # else an instance built before, or a factory that builds on the meta device itself (as
    # a large model's is written: ``with torch.device("meta")``), whose fakes are on it
    from autotune.runner.fake_shadows import FakeDeepcopies  # imports torch

    with FakeDeepcopies():  # a fake tensor the constructor kept outside its parameters
        return copy_with_tensors(model, fake, reference)


def _materialized(model: Any, batch: Any, mode: Any, reference: str) -> Any:
    """``model`` with its lazy modules' shapes, given by a forward of ``batch``'s shapes on the
    meta device, and what that made faked."""
    import torch

    from autotune.runner.lazy_modules import has_lazy_parameters, materialize  # imports torch
    from autotune.runner.training import map_tensors  # imports torch

    if not has_lazy_parameters(model):
        return model
    shapes = map_tensors(batch, lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta"))
    materialize(model, shapes)
    return _fake_copy(model, mode, reference)


def _dense_parts(tensor: Any) -> tuple[Any, ...]:
    """What holds ``tensor``'s memory: itself, or a sparse COO tensor's indices and values;
    nothing for None (a gradient an optimizer stepped in backward freed before the tracker's
    own hook read it: ``runner.in_backward``)."""
    if tensor is None:
        return ()
    if tensor.is_sparse:
        return (tensor._indices(), tensor._values())
    return (tensor,)


def _peak_tracker() -> Any:
    """``MemTracker`` keeping the device's peak only: its per-module statistics walk every
    module at every op, half of a trace's time, and nothing here reads them."""
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

    class PeakTracker(MemTracker):  # type: ignore[no-untyped-call]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                    self._peak_mem[device] = snapshot[_TOTAL_KEY]
                    self._peak_mem_snap[device] = dict(snapshot)

        def _track_module_params_and_buffers(
            self, module: Any, install_grad_hooks: bool = True
        ) -> tuple[int, int]:
            # The tracker hooks every parameter's gradient, and a frozen one (fine-tuning's
            # backbone) refuses a hook: mark those as hooked already, with nothing to remove.
            handles = self._param_to_grad_hook_handles
            for param in module.parameters():
                if _transformed(param):
                    # called by ``functional_call`` under ``vmap`` (an ensemble over stacked
                    # parameters): its parameters are the transform's views, without storage
                    # of their own; the stacked tensors they view are the model's, tracked
                    return 0, 0
                if not param.requires_grad and param not in handles:
                    handles[param] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
            # A module run again in one forward after a backward inside it (MAML's inner step:
            # ``autograd.grad`` of the support loss, then the query's forward) reads to the
            # tracker as the next step, which it refuses ("multiple iterative calls"). Its
            # parameters are tracked from its first run, and its own statistics are not read.
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                return
            super()._pre_fw_hook(module, inputs)

        def _track_inputs_or_outputs(self, args: Any) -> int:
            # A module's input and output sizes feed only its own statistics, which nothing
            # here reads; and the tracker's tree_map rebuilds them, which a PackedSequence (an
            # LSTM's input) refuses: its constructor takes other arguments than its fields.
            return 0

        # A sparse COO tensor (an ``EmbeddingBag(sparse=True)``'s gradient) has no storage of
        # its own, which the tracker asks every tensor for: it holds its indices and values.
        def _track(self, reftype: Any, t: Any) -> None:
            for part in _dense_parts(t):
                super()._track(reftype, part)

        def _update_and_maybe_create_winfos(
            self, t: Any, reftype: Any, update_existing: bool = False
        ) -> set[Any]:
            found: set[Any] = set()
            for part in _dense_parts(t):
                found |= super()._update_and_maybe_create_winfos(part, reftype, update_existing)
            return found

        def _delete_callback(self, winfo: Any, w_st: Any) -> None:
            # A storage whose size depends on the data (a mixture of experts' routing) cannot
            # be compared with zero; the trace has failed on it already, and a weakref callback
            # that raises prints a traceback whenever the storage is collected, trace or not.
            try:
                super()._delete_callback(winfo, w_st)
            except _data_dependent_error():
                pass

    tracker = PeakTracker()
    tracker._mod_tracker = _module_tracker()
    return tracker


def _module_tracker() -> Any:
    """``ModTracker`` (the memory tracker's record of which module runs) that lets a module run
    on an input it cannot hook. Before a module's forward it hooks its inputs' gradients, to see
    its backward begin; a view made with gradients off of a tensor that requires them (inside a
    custom autograd Function's forward: Reformer's reversible layers split their input in two)
    has no node to hook, and ``register_multi_grad_hook`` raised before hooking anything. Such a
    module is then taken to end with the backward, as one without inputs that need gradients
    is; nothing here reads which module is running."""
    import weakref

    from torch.distributed._tools.mod_tracker import ModTracker

    class ModuleTracker(ModTracker):
        def _fw_pre_hook(self, mod: Any, input: Any) -> None:
            try:
                super()._fw_pre_hook(mod, input)  # type: ignore[no-untyped-call]
            except AssertionError as error:
                if "gradient function" not in str(error) or self.is_bw:
                    raise
                name = self._get_mod_name(mod)  # type: ignore[no-untyped-call]
                pop = self._get_pop_fn(weakref.ref(mod), name, True)
                self._post_bw_callbacks_to_enqueue.append(pop)

        def _get_pop_fn(self, w_mod: Any, name: str, is_bw: bool) -> Any:
            # A backward inside a forward (MAML's inner ``autograd.grad``) ends the modules it
            # ran through, and the forward's end finds them ended already ("The Module
            # hierarchy tracking is wrong"): nothing is left to end then.
            pop = super()._get_pop_fn(w_mod, name, is_bw)  # type: ignore[no-untyped-call]

            def lenient(*args: Any) -> None:
                try:
                    pop(*args)
                except RuntimeError as error:
                    if "hierarchy tracking is wrong" not in str(error):
                        raise

            return lenient

    return ModuleTracker()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _unmoved_modules() -> Iterator[None]:
    """``module.to(...)`` that would change none of a module's tensors returns the module, as a
    real one comes back unchanged in effect. Under fake tensors ``Module._apply`` swaps every
    parameter for its converted copy, and one the memory tracker holds a weak reference to
    cannot be swapped: Switch Transformers' router converts itself to its own dtype in forward
    (``self.classifier.to(self.dtype)``), and the trace stopped (``_apply(): Couldn't swap
    Linear.weight``). ``torch._C._nn._parse_to`` is private: a test pins it."""
    import itertools

    import torch

    original = torch.nn.Module.to

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        parsed: Any = torch._C._nn._parse_to(*args, **kwargs)  # its memory_format may be None
        device, dtype, _, memory_format = parsed
        unchanged = memory_format is None and all(
            (device is None or t.device == device)
            and (dtype is None or not t.is_floating_point() or t.dtype == dtype)
            for t in itertools.chain(self.parameters(), self.buffers())
        )
        return self if unchanged else original(self, *args, **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def _concrete_scalars() -> Any:
    """A dispatch mode, entered inside the fake mode, under which a value read out of a tensor
    (``.item()``) is 1 (``True``, ``1.0``) instead of an unknown symbol. For the optimizer's step
    only: an optimizer's values decide its numbers, not what it allocates, and some branch on
    them (torch's Adafactor: ``min(lr, 1 / step.item() ** 0.5)``), which stops a trace; a
    model's forward keeps its unknowns, since its branches may decide its memory."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class ConcreteScalars(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                tensor = args[0]
                if tensor.dtype is torch.bool:
                    return True
                return 1.0 if tensor.is_floating_point() or tensor.is_complex() else 1
            return func(*args, **(kwargs or {}))

    return ConcreteScalars()  # type: ignore[no-untyped-call]


def _fake_limits() -> tuple[type[Exception], ...]:
    """What fake tensors raise where a real run would not (an op they lack, a size the data
    decides); anything else raised in the trace may be the model's own error."""
    from torch._subclasses import fake_tensor as fake

    return (
        fake.UnsupportedFakeTensorException,
        fake.DynamicOutputShapeException,
        fake.DataDependentOutputException,
        fake.UnsupportedOperatorException,
        fake.UnsupportedMutationAliasingException,
        fake.MetadataMismatchError,
        _data_dependent_error(),
    )


def _data_dependent_error() -> type[Exception]:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return GuardOnDataDependentSymNode


MODEL_AT_FAULT = " (if the model raises this when it runs too, the model is at fault)"
"""Said after a trace error that is not one of fake tensors' limits: the model's own, maybe."""

UNIFORM_ROUTING = (
    "a mixture of experts' routing traced as uniform, each expert its share of the tokens "
    "(what the experts hold sums the same under any split; a trial's measured peak shows the rest)"
)
"""Said wherever a prediction rests on ``autotune.runner.fake_routing``'s estimate."""

GROUP_TRACED = (
    "the step calls torch.distributed (a gather from every rank): traced as one rank of a "
    "group of the configuration's ranks that moves no data, what it gathers counted at its "
    "shapes"
)
"""Said wherever a traced step called ``torch.distributed`` (``fake_group``)."""

LIKELIEST_DRAWS = (
    "a branch a random draw decides (LayerDrop's skip) traced at its likeliest outcome: "
    "a layer dropped with a chance below one half runs, the most memory such a step takes"
)
"""Said wherever a traced step took a random draw's likeliest branch."""

UNUSED_PARAMETERS = (
    "the traced step leaves some parameters without a gradient, or a random draw decides a "
    "branch (LayerDrop)"
)
"""Why DDP needs ``find_unused_parameters`` (``TensorPeak.needs_unused_parameters``), said by
the search and the plan."""

SAMPLE_SHARES = (
    "sizes the batch's own values decide (a loss keeping its labelled rows, unpadding by an "
    "attention mask, a CTC target's length, packed sequences' lengths) traced as the "
    "dataset's first samples show them"
)
"""Said wherever a traced step sized a selection by the first samples' values."""

CARRIED_STATE = (
    "the model keeps tensors on its modules from one step to the next ({names}), traced from "
    "the state before its first step: a later step holds them too, and more where they grow "
    "(a memory of past steps), so a long run's peak may lie above the prediction, and above a "
    "short trial's measurement"
)
"""Said wherever a traced step left module tensors that it found smaller or absent."""

RECURRENT_ON_CPU = (
    "recurrent layers ({names}) traced as this machine's CPU runs them (an LSTM with oneDNN's "
    "workspace, a GRU or RNN step by step, each step's tensors kept for backward): on a GPU "
    "cuDNN's fused kernels keep a reserve space instead, not measured against the trace"
)
"""Said of a prediction for CUDA devices wherever the traced step ran a recurrent layer."""

FLEX_DENSE = (
    "FlexAttention traced as CUDA runs it: without torch.compile as its dense kernels (the "
    "scores, sequence x sequence per head in float32, while each call runs), compiled as its "
    "fused kernel (no scores); not measured on a GPU"
)
"""Said of a prediction for CUDA devices wherever the traced step ran FlexAttention dense."""

FLEX_FUSED = (
    "FlexAttention compiled by the model's own code traced as its fused kernel holds it (its "
    "output and a log-sum-exp per query, no scores; not measured on a GPU)"
)
"""Said of a prediction for CUDA devices wherever the traced step ran FlexAttention fused."""

HOST_OFFLOAD = (
    "activations offloaded by torch's save_on_cpu traced in host memory, not on the device "
    "({size} a process at most), each brought back to the device for its own backward; not "
    "measured on a GPU"
)
"""Said of a prediction for CUDA devices wherever the traced step offloaded (``fake_offload``)."""

DATA_DEPENDENT = (
    "a size or branch depends on tensor values, which fake tensors do not have (branching on "
    "a value, or nonzero / torch.where(mask) / masked_select of a mask made from activations "
    "or other values the trace lacks; it follows a mixture of experts' routing, random draws, "
    "the batch's own integer values and tensors made from constants)"
)
"""The one line for a trace stopped by data: the guard's expression means little to a user."""


class _NoHook:
    """Stands for a hook handle where no hook could be installed (a frozen parameter)."""

    def remove(self) -> None:
        pass


def _carried(model: Any) -> dict[str, int]:
    """The tensors the model's modules hold as attributes of their own, beside parameters and
    buffers (``self.memory = context.detach()`` in a forward: state one step leaves for the
    next), bytes by ``Class.attribute``."""
    import torch

    held: dict[str, int] = {}
    for module in model.modules():
        for attribute, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                key = f"{type(module).__name__}.{attribute}"
                held[key] = held.get(key, 0) + value.nbytes
    return held


def _grown(before: dict[str, int], after: dict[str, int]) -> tuple[str, ...]:
    """The module tensors (``_carried``) a traced step left larger than it found them."""
    return tuple(sorted(key for key, size in after.items() if size > before.get(key, 0)))


def _by_kind(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    parts = next(iter(snapshot.values()), {})
    return {getattr(k, "name", str(k)): int(v) for k, v in parts.items()}


def _with_state(backward: dict[str, int], state: int) -> dict[str, int]:
    """A steady step's forward and backward: beside the optimizer's state, which the first
    step creates at its end (AdamW's), where it did not exist from the optimizer's constructor
    on (Adagrad's sums, already held by the first backward)."""
    added = max(0, state - backward.get("OPT", 0))
    with_state = {**backward, "OPT": backward.get("OPT", 0) + added}
    with_state["Total"] = backward.get("Total", 0) + added
    return with_state


def _steady_peak(backward: dict[str, int], stepped: dict[str, int], state: int) -> dict[str, int]:
    """A steady step's peak from the first step's: its forward and backward beside the state,
    and its optimizer step peaking as the first one's did. Tracing one step and adding the state
    costs half of tracing two, with the same peak (pinned against two traced steps in the
    tests)."""
    with_state = _with_state(backward, state)
    return with_state if with_state["Total"] >= stepped.get("Total", 0) else stepped


def _transformed(tensor: Any) -> bool:
    """Whether ``tensor`` is a ``torch.func`` transform's wrapper (``vmap``'s batched tensor,
    ``grad``'s), which has no storage to track. Reads torch's private ``_functorch`` check,
    pinned by ``tests/runner/test_fake_memory.py``; without it, False: the trace then fails on
    such a model as before and the search predicts it by a fit over trials."""
    import torch

    check = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return bool(check(tensor)) if check is not None else False


def _fake_tensor_class() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def _bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _gradient_bytes(model: Any) -> int:
    """Every trainable parameter's gradient after backward: the parameter's size, or what a
    sparse one holds (a lookup's, one entry per index: a small share of its table)."""
    total = 0
    for p in model.parameters():
        if p.requires_grad:
            sparse = p.grad is not None and p.grad.is_sparse
            total += _bytes(_dense_parts(p.grad)) if sparse else _bytes([p])
    return total


_SHOWN: set[tuple[str, str, str, int]] = set()
"""The warnings shown in this process within ``warnings_once`` (text, category's name, place)."""


@contextlib.contextmanager
def warnings_once() -> Iterator[None]:
    """Within: each warning (text, category, place) shown once a process, however often the
    filters change. Python forgets which warnings it showed whenever the filter list changes
    (``catch_warnings`` included, as each trace does): a user's deprecation note, given each
    time the model is built, was said again by every trace. Nested, the outermost decides."""
    import warnings

    with warnings.catch_warnings():
        if not getattr(warnings.showwarning, "shown_once", False):
            warnings.showwarning = _once(warnings.showwarning)
        yield


def _once(show: Any) -> Any:
    """``warnings.showwarning`` that shows each warning (text, category, place) once."""

    def shown_once(
        message: Any, category: Any, filename: str, lineno: int, *rest: Any, **more: Any
    ) -> None:
        key = (str(message), getattr(category, "__name__", str(category)), filename, lineno)
        if key not in _SHOWN:
            _SHOWN.add(key)
            show(message, category, filename, lineno, *rest, **more)

    shown_once.shown_once = True  # type: ignore[attr-defined]
    return shown_once


def trace_step(
    spec: WorkloadSpec,
    micro_batch_size: int,
    amp: str = "off",
    checkpoint_segments: int = 0,
    learning_rate: float = 1e-4,
    optimizer_impl: str = "default",
    device_type: str = "cpu",
    world_size: int = 1,
    checkpoint_policy: str = "full",
    optimizer_in_backward: bool = False,
) -> TensorPeak:
    """The peak of one training step of ``spec``'s model on one ``device_type`` device, traced
    on the CPU (for ``cuda``, autocast follows CUDA's op lists: ``fake_autocast``), as rank 0 of
    a group of ``world_size`` that moves no data (``fake_group``): what a step that calls
    ``torch.distributed`` gathers from the other ranks is counted at its shapes.
    ``optimizer_in_backward``: each parameter stepped in backward (``runner.in_backward``),
    traced over two steps, the second's beside the state the first made.

    Raises ``TraceError`` (one line) when the model defeats the fake tensors."""
    import logging
    import warnings

    # A meta kernel that fails logs its traceback before raising; the one line below says it.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        # each trace builds the model again, and the filters below make Python forget which
        # warnings it showed: the user's code's own (a library's deprecation notes) are said
        # once a process, not once a configuration
        with warnings_once():
            # the tracker's own notes on hooks it skipped
            warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
            # a deep copy of a fake parameter (nn.TransformerEncoder clones its layer) reads
            # its data pointer, which a fake tensor warns of: nothing is allocated either way
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            # torch's note on building a sparse gradient (an EmbeddingBag(sparse=True)'s, in
            # Adagrad's step), said from inside the trace as if the tool's own
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
            # torch.compile's map of torch's functions, built with torch's own before any
            # stand-in below is entered, and again where a process group cleared it
            torchs_own_rules()

            from autotune.runner.fake_bias import causal_biases  # imports torch
            from autotune.runner.fake_routing import unchecked_distributions  # imports torch

            # the model's build too: a flow makes its base, a model may keep its mask
            with unchecked_distributions(), causal_biases():
                step = (
                    spec,
                    micro_batch_size,
                    amp,
                    checkpoint_segments,
                    learning_rate,
                    optimizer_impl,
                    device_type,
                    world_size,
                    checkpoint_policy,
                    optimizer_in_backward,
                )
                asked: set[str] = set()  # what the model's code asked of the GPU
                trace = functools.partial(_trace, *step, asked=asked)
                try:
                    peak = trace()
                except Exception:
                    if AVAILABLE not in asked:
                        raise
                    # told a GPU is there, the code reached for what only a GPU has: the
                    # path it takes without one (``planned_gpu``)
                    asked.clear()
                    trace = functools.partial(_trace, *step, asked=asked, available=False)
                    peak = trace()
                peak = replace(peak, cuda_asked=tuple(sorted(asked)))
                if peak.flex_dense_calls:  # and compiled: the fused kernel (``compiled``)
                    fused = trace(flex_fused=True)
                    if fused.flex_fused_calls:  # where this torch has its fake kernels
                        peak = replace(
                            peak,
                            flex_dense_excess_bytes=peak.total_bytes - fused.total_bytes,
                            flex_dense_excess_backward_bytes=(
                                peak.backward_bytes - fused.backward_bytes
                            ),
                        )
                return peak
    except _data_dependent_error() as error:
        raise TraceError(DATA_DEPENDENT) from error
    except Exception as error:  # a private tool's failure is the caller's cue to fall back
        line = error_line(error)
        if not isinstance(error, (*_fake_limits(), WorkloadError)):  # the model's shapes, say
            line += MODEL_AT_FAULT
        raise TraceError(line) from error
    finally:
        fake_log.setLevel(level)


def _trace(
    spec: WorkloadSpec,
    micro_batch: int,
    amp: str,
    segments: int,
    learning_rate: float,
    implementation: str,
    device_type: str,
    world_size: int,
    checkpoint_policy: str,
    in_backward: bool,
    flex_fused: bool = False,
    asked: set[str] | None = None,
    available: bool = True,
) -> TensorPeak:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from autotune.runner import fake_recurrent  # imports torch
    from autotune.runner.blocks import find_repeated_blocks  # imports torch
    from autotune.runner.fake_attention import cuda_attention  # imports torch
    from autotune.runner.fake_autocast import cuda_policy, cuda_regions  # imports torch
    from autotune.runner.fake_checks import SameDtypes  # imports torch
    from autotune.runner.fake_device import (  # imports torch
        CudaMade,
        CudaOnCpu,
        CudaOpsOnCpu,
        cuda_stand_ins,
        indexed_devices,
    )
    from autotune.runner.fake_flex import CudaFlexAttention  # imports torch
    from autotune.runner.fake_offload import host_offload  # imports torch
    from autotune.runner.fake_routing import FormattedScalars, UniformRouting  # imports torch
    from autotune.runner.in_backward import InBackward  # imports torch
    from autotune.runner.training import (  # imports torch
        _AMP_DTYPES,
        forward_keywords,
        loop_calls,
        prepare_model,
        split_batch,
        target_into,
    )

    put_on_path(spec)
    # A shape environment lets a value read for logging (``loss.item()`` in forward) stay an
    # unknown symbol instead of failing the trace; branching on one still fails (TraceError).
    # Static shapes: every size stays a plain int, as without it.
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    routing = UniformRouting()  # below the tracker: it sees the sizes routing gave
    cuda = device_type == "cuda"  # the trace's CPU tensors stand for a CUDA device's
    named = CudaOnCpu() if cuda else contextlib.nullcontext()  # "cuda" in the model's code
    asked = set() if asked is None else asked  # what the model's code asked of the GPU

    def stand_ins(made: CudaMade | None = None) -> Any:
        """``cuda_stand_ins`` for a trace for CUDA, answering and recording into ``asked``."""
        return cuda_stand_ins(made, asked, available) if cuda else contextlib.nullcontext()

    with stand_ins(), named:
        module, model = _fake_model(spec, mode, routing)
    made = CudaMade() if cuda else None  # a dataset kept on the GPU: real tensors, here
    with stand_ins(made), CudaOnCpu(made) if cuda else contextlib.nullcontext():
        dataset, _ = load_dataset(spec, module, model)
        loss_fn, _ = load_loss(spec, module)
        factory, _ = load_optimizer(spec, module)
        collate, _ = load_collate(spec, module)
        batch, observed = fake_batch(dataset, micro_batch, mode, collate)
    on_device = made.held_bytes() if made is not None else 0  # what the dataset keeps there
    model = _materialized(model, batch, mode, spec.model)  # lazy modules' shapes, as on a rank
    config = TrainConfig(
        global_batch_size=micro_batch,
        amp=amp,
        checkpoint_segments=segments,
        checkpoint_policy=checkpoint_policy,
        device="cpu",
    )
    device = torch.device("cpu")
    blocks = find_repeated_blocks(model)
    parameters = _bytes([*model.parameters(), *model.buffers()])
    block_bytes = max((_bytes(b.parameters()) for b in blocks), default=0)
    in_blocks = sum(_bytes(b.parameters()) for b in blocks)
    dtype = _AMP_DTYPES.get(amp)
    accepts = forward_keywords(model)  # before wrapping: a wrapper's forward takes anything
    into = target_into(model, loss_fn)
    world = world_size if in_group(model) else 0
    with fake_group(world) if world else contextlib.nullcontext(), mode, eager_compiles():
        for fake, values in observed:
            routing.observe(fake, values)
        with routing:  # the layers a model without stacks loops over, as a rank counts them
            calls = loop_calls(model, batch) if segments else None
        wrapped, _, _, _ = prepare_model(model, config, device, calls)
        params = wrapped.parameters()
        # a LightningModule's own, on the fake model, where the user gave none; the user's
        # factory asks after the GPU as the model does (nanoGPT's fused=True on CUDA)
        with stand_ins():
            optimizer = chosen_optimizer(factory, model, learning_rate)(params)
        if implementation == "default":  # what the device would run: foreach on CUDA
            implementation = device_default(optimizer, device_type)
        optimizer = with_implementation(optimizer, implementation)
        stepper = InBackward(optimizer, _concrete_scalars) if in_backward else None
        tracker = _peak_tracker()
        tracker.track_external(wrapped, *(stepper.optimizers() if stepper else [optimizer]))
        policy = cuda_policy() if dtype and cuda else contextlib.nullcontext()
        regions = cuda_regions() if cuda else contextlib.nullcontext()
        ops_named = CudaOpsOnCpu() if cuda else contextlib.nullcontext()  # type: ignore[no-untyped-call]
        attention = cuda_attention() if cuda else contextlib.nullcontext()
        flex = CudaFlexAttention(flex_fused) if cuda else None  # a CPU refuses to run it
        offload = host_offload() if cuda else contextlib.nullcontext()
        # Tensor.to("cuda"), current_device(), NVTX: in backward too, and on a CPU build
        step_stand_ins = stand_ins()
        workspace = fake_recurrent.RecurrentWorkspace()  # type: ignore[no-untyped-call]
        packing = fake_recurrent.PackedSequences(routing, cpu=device_type == "cpu")
        scalars = FormattedScalars()
        unmasked = values_read_where_known(routing.shadows)  # Hugging Face's masks, as real
        # the policy holds for checkpoints' recomputation too
        with (
            routing,
            workspace,
            tracker,
            policy,
            regions,  # the model's own CUDA autocast regions, on the trace's CPU autocast
            named,
            ops_named,  # and in backward, where a function mode is not active
            SameDtypes(),  # type: ignore[no-untyped-call]  # what a real matmul checks
            step_stand_ins,
            attention,
            flex or contextlib.nullcontext(),  # above the tracker: it sees the scores
            packing,
            scalars,
            unmasked,
            _unmoved_modules(),
            offload as offloaded,  # save_on_cpu's tensors in host memory, as on a GPU
        ):
            args, kwargs, target = split_batch(batch, accepts, into)
            found = _carried(model)
            autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()

            def forward_backward() -> Any:
                with autocast:
                    output = wrapped(*args, **kwargs)
                    loss = call_loss(loss_fn, output, target, kwargs)
                # A device index in a checkpoint's recomputation: the trace's device
                # (``fake_device.indexed_devices``).
                with indexed_devices() if cuda else contextlib.nullcontext():
                    loss.backward()
                if flex:
                    flex.give_gradients()
                return output

            # The output (a language model's logits and key/value cache) is held through
            # backward and the optimizer's step, as the trials' step holds it: it goes when the
            # next step's output replaces it. Stepped in backward, the first step makes the
            # optimizer's state as backward goes; a second holds it from its start.
            output = forward_backward()
            if stepper:
                del output
                output = forward_backward()
            backward = _by_kind(tracker.get_tracker_snapshot("peak"))
            given = stepper.stepped if stepper else set()  # stepped, their gradients freed
            unused = sum(
                1
                for p in model.parameters()
                if p.requires_grad and p.grad is None and p not in given
            )
            gradients_full = _gradient_bytes(model)
            if not stepper:
                with _concrete_scalars():
                    optimizer.step()  # the first step creates the optimizer's state
            stepped = _by_kind(tracker.get_tracker_snapshot("peak"))
            del output
            optimizer.zero_grad(set_to_none=True)
            state = _by_kind(tracker.get_tracker_snapshot("current")).get("OPT", 0)
            carried = _grown(found, _carried(model))
    by_kind = _steady_peak(backward, stepped, state)
    steady_backward = _with_state(backward, state)
    return TensorPeak(
        total_bytes=int(by_kind.get("Total", 0)),
        parameters_bytes=parameters,
        gradients_bytes=int(by_kind.get("GRAD", 0)),
        optimizer_bytes=int(by_kind.get("OPT", 0)),
        block_parameters_bytes=block_bytes,
        outside_blocks_bytes=max(0, parameters - in_blocks),
        gradient_bytes_full=gradients_full,
        backward_bytes=int(steady_backward.get("Total", 0)),
        backward_gradients_bytes=int(steady_backward.get("GRAD", 0)),
        routed_sizes=routing.estimated,
        drawn_branches=routing.drawn,
        sampled_selections=routing.sampled,
        unused_parameters=unused,
        varying_batches=varying(dataset, collate),
        carried_state=carried,
        recurrent_layers=tuple(
            sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)})
        ),
        group_world=world,
        flex_dense_calls=flex.dense_calls if flex else 0,
        flex_fused_calls=flex.fused_calls if flex else 0,
        offloaded_bytes=offloaded.bytes if offloaded else 0,
        dataset_on_device_bytes=on_device,
    )

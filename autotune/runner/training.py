"""Apply a ``TrainConfig`` to a model and run optimizer steps with it.

Order matters and is fixed here: activation checkpointing first (it patches the blocks' forward),
then the move to the device and the parallel wrap (FSDP shards the blocks, then the root), then
the DDP comm hook, and ``torch.compile`` last, of the wrapped model, as PyTorch documents for DDP
(its optimizer splits the graph at bucket boundaries) and FSDP2; checkpointed blocks are traced
as checkpoint regions. Each step runs ``grad_accum_steps`` micro-batches under autocast, skips the
gradient sync on all but the last (``no_sync`` / ``set_requires_gradient_sync``), and steps the
optimizer once, through the gradient scaler for fp16.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.nn.utils.rnn import PackedSequence

from autotune.config import GRAPH_CAPTURING_MODES, TrainConfig
from autotune.errors import ConfigError
from autotune.runner.blocks import find_repeated_blocks, may_loop
from autotune.runner.checkpointing import apply_checkpointing, checkpoint_units, count_calls
from autotune.runner.in_backward import InBackward
from autotune.runner.loss import TARGET_PARAMETERS, DefaultLoss, call_loss, first_tensor
from autotune.runner.optimizer import OPTIMIZER_STEP
from autotune.runner.tensor_hooks import fsdp_drops_hooks

_AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
CLIPPING = "in clipping the gradients (clip_grad_norm_)"
"""The note an error raised by clipping carries instead (``max_grad_norm``): it comes before the
optimizer's step, and is not the optimizer's."""


def maps_own_tensors(value: Any) -> bool:
    """Whether ``value`` is a batch that maps its own tensors, as PyTorch Geometric's graph
    ``Data``/``Batch`` do: ``apply(fn)`` on its tensors, in place, and ``stores`` of them."""
    return callable(getattr(value, "apply", None)) and hasattr(value, "stores")


def dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def check_loss(loss: Any) -> None:
    """Refuse a loss that backward cannot start from, naming what it is."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return
    what = (
        f"a tensor of shape {tuple(loss.shape)}"
        if isinstance(loss, torch.Tensor)
        else f"a {type(loss).__name__}"
    )
    raise ValueError(
        f"the loss returned {what}, not a scalar tensor: reduce it in the loss function "
        "(.mean() or .sum())"
    )


@dataclass
class HookCounter:
    """Counts invocations of a DDP comm hook (one per gradient bucket per synced backward)."""

    calls: int = 0
    lowrank_calls: int = 0  # PowerSGD calls that compressed (not its plain-allreduce start)

    def wrap(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        # DDP checks the hook's annotations, so the wrapper must carry the hook's own.
        @functools.wraps(hook)
        def counted(state: Any, bucket: Any) -> Any:
            self.calls += 1
            future = hook(state, bucket)
            # PowerSGD allocates a bucket's low-rank factors only on its compressing path.
            if bucket.index() in getattr(state, "p_memory_dict", {}):
                self.lowrank_calls += 1
            return future

        return counted


POWERSGD_EPSILON = 1e-8
"""Added to each column PowerSGD normalises, as torch's documentation suggests where a gradient
matrix may hold a column of zeros (at 0, torch's default, such a column divides by zero: DETR's
parameters were NaN after the first compressed step, and its next forward raised on them)."""


def _comm_hook(config: TrainConfig) -> tuple[Any, Callable[..., Any]]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    if config.comm_hook == "fp16":
        return None, default_hooks.fp16_compress_hook
    if config.comm_hook == "bf16":
        return None, default_hooks.bf16_compress_hook
    state = powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=config.powersgd_rank,
        start_powerSGD_iter=config.powersgd_start_iter,
        orthogonalization_epsilon=POWERSGD_EPSILON,
    )
    return state, powersgd.powerSGD_hook


def _move(model: nn.Module, device: torch.device) -> None:
    """``model.to(device)``, skipped where every tensor is there already: a no-op move, which
    fake tensors (the memory prediction's) cannot do in place."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.device != device for t in tensors):
        model.to(device)


def _mixed_precision(config: TrainConfig) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if config.fsdp_mixed_precision == "off":
        return MixedPrecisionPolicy()
    reduce = torch.float32 if config.fsdp_mixed_precision == "bf16-reduce-fp32" else None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)


def _offload(config: TrainConfig, device: torch.device) -> Any:
    """FSDP2's offload policy: shards in host memory (pinned where a CUDA device copies them)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not config.fsdp_cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def scalar_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The model's 0-dim trainable parameters by name (CLIP's ``logit_scale``), which FSDP2
    cannot shard ("fully_shard doesn't support scalar parameters")."""
    return {n: p for n, p in model.named_parameters() if p.dim() == 0 and p.requires_grad}


BATCH_NORMS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
)  # fmt: skip
"""torch's batch norms, whose kernels take bf16 inputs beside float32 parameters and running
statistics, but not bf16 parameters beside float32 statistics ("expected scalar type BFloat16
but found Float", on a CPU as FSDP's bf16 parameters gave them)."""


def whole_parameters(model: nn.Module, config: TrainConfig) -> list[nn.Parameter]:
    """The parameters FSDP2 leaves whole on every rank (``fully_shard``'s ``ignored_params``):
    the 0-dim ones (``scalar_parameters``), which it cannot shard, and under its bf16
    parameters the batch norms', kept in float32 as autocast keeps them, since FSDP would cast
    them and not the running statistics (FSDP1 kept batch norms out of its mixed precision for
    the same reason)."""
    whole = list(scalar_parameters(model).values())
    if config.fsdp_mixed_precision != "off":
        norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
        whole += [p for m in norms for p in m.parameters() if p.dim() > 0]
    return whole


def average_gradients(parameters: list[nn.Parameter]) -> None:
    """Average the trainable ``parameters``' gradients over the ranks as each backward
    accumulates them, as DDP does for every parameter (those FSDP2 leaves whole:
    ``whole_parameters``). Averaging after each micro-step of an accumulation is averaging the
    sum, so accumulation needs nothing more."""
    import torch.distributed as dist

    def average(param: torch.Tensor) -> None:
        assert param.grad is not None
        dist.all_reduce(param.grad)  # gloo has no AVG: sum, then divide
        param.grad.div_(dist.get_world_size())

    for param in parameters:
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(average)  # type: ignore[no-untyped-call]


def wrap_model(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    hooks: HookCounter,
    checkpointed: list[nn.Module] | None = None,
) -> nn.Module:
    """Move ``model`` to ``device`` and wrap it for ``config.parallel`` (checkpointing done:
    ``checkpointed``, its modules). FSDP shards each repeated block as a unit of its own, but
    for one inside a checkpointed module (a looped layer's attention, a unit of the fallback's
    blocks): its gathering hooks inside a recomputation saved other tensors than the forward
    ("A different number of tensors was saved"), so it is sharded with what holds it."""
    if config.parallel == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if dropped := fsdp_drops_hooks(model):  # refused before any trial; here for apply
            raise ConfigError(f"parallel=fsdp: {dropped}; use ddp or single")

        # Not the whole model to the device first: fully_shard moves each block's states there
        # as it shards them, so a device holds one block whole at a time, not the model (which
        # need not fit one device: that is what FSDP is for). It leaves its ignored parameters
        # where they are: those move here.
        mesh = init_device_mesh(device.type, (config.world_size,))
        policy, offload = _mixed_precision(config), _offload(config, device)
        whole = whole_parameters(model, config)
        average_gradients(whole)
        ignored = set(whole) or None
        for parameter in whole:
            parameter.data = parameter.data.to(device)
        regions = [m for c in checkpointed or () for m in c.modules() if m is not c]
        for block in find_repeated_blocks(model):
            if any(block is m for m in regions):
                continue
            fully_shard(
                block,
                mesh=mesh,
                reshard_after_forward=config.reshard_after_forward,
                mp_policy=policy,
                offload_policy=offload,
                ignored_params=ignored,
            )
            # A block's unsharded parameters can outlive the call in a reference cycle (the
            # first DTensor's lazy import keeps the frames that hold them until a collection
            # runs): on a device, a whole block each. Freed here, before the next block moves.
            gc.collect()
        fully_shard(
            model, mesh=mesh, mp_policy=policy, offload_policy=offload, ignored_params=ignored
        )
        return model
    _move(model, device)
    if config.parallel == "dp":
        return nn.DataParallel(model, device_ids=list(range(config.world_size)))
    if config.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(
            model,
            device_ids=ids,
            static_graph=config.static_graph,
            find_unused_parameters=config.find_unused_parameters,
            bucket_cap_mb=config.bucket_cap_mb,
            gradient_as_bucket_view=config.gradient_as_bucket_view,
        )
        if config.comm_hook != "none":
            state, hook = _comm_hook(config)
            ddp.register_comm_hook(state, hooks.wrap(hook))
        return ddp
    return model


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``batch`` with ``fn`` applied to each of its tensors, through dicts, lists and tuples as
    users' data code makes them: a mapping keeps its type where that type can be built from a
    dict (Hugging Face's ``BatchEncoding``, a ``UserDict`` that torch's pytree takes for one
    leaf), else becomes a dict; a named tuple keeps its type; a ``PackedSequence`` (a collate
    function that packs) keeps its batch sizes; a dataclass instance is a copy with its fields
    mapped; a batch that maps its own tensors (a PyTorch Geometric graph batch,
    ``maps_own_tensors``) is a shallow copy mapped by its ``apply``, as its own ``clone`` does.
    Anything else is left as it is."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, PackedSequence):  # its batch sizes stay on the CPU, as its .to keeps them
        data, sizes, order, unorder = batch
        return PackedSequence(
            fn(data), sizes, *(t if t is None else fn(t) for t in (order, unorder))
        )
    if isinstance(batch, Mapping):
        mapped = {k: map_tensors(v, fn) for k, v in batch.items()}
        if type(batch) is dict:
            return mapped
        try:
            return type(batch)(mapped)  # type: ignore[call-arg]
        except Exception:  # a mapping its items do not make (a defaultdict)
            return mapped
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(v, fn) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    if maps_own_tensors(batch):
        return copy.copy(batch).apply(lambda t: map_tensors(t, fn))
    if dataclass_instance(batch):
        copied = copy.copy(batch)
        for item in dataclasses.fields(batch):
            # object.__setattr__: a frozen dataclass's copy takes its mapped fields too
            object.__setattr__(copied, item.name, map_tensors(getattr(batch, item.name), fn))
        return copied
    return batch


def move_to(
    batch: Any, device: torch.device, non_blocking: bool, channels_last: bool = False
) -> Any:
    """``batch`` on ``device`` (``map_tensors``); with ``channels_last``, its 4-D floating
    tensors (image batches) in channels-last memory format."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if channels_last and tensor.dim() == 4 and tensor.is_floating_point():
            return tensor.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
        return tensor.to(device, non_blocking=non_blocking)

    return map_tensors(batch, move)


WHOLE_BATCH = frozenset({"(the whole batch)"})
"""``forward_keywords`` of a model whose forward takes the batch as it comes
(``takes_whole_batch``: a LightningModule's training step): ``split_batch`` splits nothing."""


def _forward_parameters(model: nn.Module) -> list[inspect.Parameter] | None:
    """The parameters of the model's forward; None when they cannot be told. A wrapper whose
    forward takes anything (``*args, **kwargs``) and that names the model it wraps (PEFT's
    ``PeftModel``: ``get_base_model()``) is read through that model, as Hugging Face's Trainer
    reads it for the columns a model takes."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    base = getattr(model, "get_base_model", None)
    if all(p.kind in variadic for p in parameters) and callable(base):
        try:
            inner = base()
        except Exception:  # not a wrapper after all: its own signature stands
            return parameters
        if isinstance(inner, nn.Module) and inner is not model:
            return _forward_parameters(inner)
    return parameters


def forward_keywords(model: nn.Module) -> frozenset[str] | None:
    """The keyword arguments the user's model's forward takes (the model as built, before any
    wrapper, whose forward takes anything); None when it takes any (``**kwargs``) or cannot be
    told; ``WHOLE_BATCH`` for a forward that takes the whole batch."""
    if getattr(model, "takes_whole_batch", False):
        return WHOLE_BATCH
    parameters = _forward_parameters(model)
    if parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(
        p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def target_parameter(model: nn.Module) -> tuple[str, int] | None:
    """(name, position) of the forward's optional parameter that takes the target, named as
    ``TARGET_PARAMETERS`` name one (nanoGPT's ``forward(idx, targets=None)``, Hugging Face's
    ``labels=None``), its position among the positional parameters (a keyword-only one: after
    them all); None where the forward has none, or takes the whole batch."""
    if getattr(model, "takes_whole_batch", False):
        return None
    parameters = _forward_parameters(model)
    if parameters is None:
        return None
    for name in TARGET_PARAMETERS:
        for position, p in enumerate(parameters):
            keyword = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            if p.name == name and keyword and p.default is not p.empty and position > 0:
                return name, position
    return None


def required_parameter(model: nn.Module) -> tuple[str, int] | None:
    """(name, position) of the forward's last required positional parameter after its first
    (a discriminator's ``forward(x, y)``, a triplet network's ``forward(anchor, positive,
    negative)``): a tuple batch whose inputs leave it free fills it with its last item, as the
    user's ``model(*batch)`` does, where calling without it could only fail; None where the
    forward has none."""
    if getattr(model, "takes_whole_batch", False):
        return None
    required = [
        (p.name, position)
        for position, p in enumerate(_forward_parameters(model) or [])
        if position > 0 and p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty
    ]
    return required[-1] if required else None


def target_into(model: nn.Module, loss_fn: Any) -> tuple[str, int] | None:
    """Where a tuple batch's target goes in the forward too: ``target_parameter`` where
    ``loss_fn`` is the default loss (a user's loss takes the output as the forward makes it
    without the target), else a parameter the forward cannot run without
    (``required_parameter``)."""
    named = target_parameter(model) if isinstance(loss_fn, DefaultLoss) else None
    return named or required_parameter(model)


def split_batch(
    batch: Any,
    accepts: frozenset[str] | None = None,
    target_into: tuple[str, int] | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """(positional inputs, keyword inputs, target) of a batch.

    A tensor is the input; a dict (any mapping: a ``BatchEncoding``) is passed as keyword
    arguments (and given to a user loss as the target); a tuple/list is (inputs..., target),
    or (input,) alone, and ``target_into`` (``target_parameter`` where the loss is the
    default, else ``required_parameter``) passes the target to the forward's parameter for it
    too, as a training loop calls ``model(x, y)``, where the inputs leave that parameter free.
    Where the inputs are one dict (``(inputs, target)`` for ``model(**inputs)``, as diffusion
    and Keras-style loops write it) its keys go as keyword arguments, as a dict's alone do.
    ``accepts``: the keywords the forward takes (``forward_keywords``); a dict's other keys (a
    dataset's ``labels`` beside a forward that takes ``input_ids``) stay out of the call, as
    Hugging Face's Trainer leaves out the columns a model does not take, and in the target.
    Where the forward takes none of its keys (research code's ``forward(self, batch)``), the
    batch goes whole as its first argument (``dict_hint`` says so if the forward then fails).
    """
    if accepts is WHOLE_BATCH:
        return (batch,), {}, None
    if isinstance(batch, Mapping):
        every = batch if type(batch) is dict else dict(batch)  # kwargs: a dict
        taken = every if accepts is None else {k: v for k, v in every.items() if k in accepts}
        if not taken:
            return (batch,), {}, batch
        return (), taken, batch
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1:
            return (batch[0],), {}, None
        inputs, target = tuple(batch[:-1]), batch[-1]
        if len(inputs) == 1 and isinstance(inputs[0], Mapping):  # (inputs, target)
            args, kwargs, _ = split_batch(inputs[0], accepts)
            if kwargs:  # the forward's parameters by the keys' names; the target where free
                free = target_into is not None and target_into[0] not in kwargs
                into = {target_into[0]: target} if free and target_into else {}
                return args, {**kwargs, **into}, target
        if target_into is not None and len(inputs) <= target_into[1]:
            return inputs, {target_into[0]: target}, target
        return inputs, {}, target
    return (batch,), {}, None


@dataclass
class StepStats:
    """What one optimizer step took."""

    wall_s: float
    data_wait_s: float
    loss: float
    hook_calls: list[int] = field(default_factory=list)


class TrainStep:
    """Runs optimizer steps of a wrapped model with the config's AMP and accumulation."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], Any],
        config: TrainConfig,
        device: torch.device,
        hooks: HookCounter,
        accepts: frozenset[str] | None = None,
        target_into: tuple[str, int] | None = None,
    ) -> None:
        """``accepts``: the keywords the user's model takes (``forward_keywords`` of it before
        it was wrapped); None passes a dict batch's every key. ``target_into``: the forward's
        parameter a tuple batch's target goes to (``target_parameter``, with the default
        loss)."""
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.config, self.device, self.hooks = config, device, hooks
        self.amp_dtype = _AMP_DTYPES.get(config.amp)
        self.scaler = torch.amp.GradScaler(device.type) if config.amp == "fp16" else None
        self.non_blocking = config.pin_memory and device.type == "cuda"
        self.output_dtype: torch.dtype | None = None
        self.optimizer_steps = 0
        self.micro_steps = 0
        self.accepts, self.target_into = accepts, target_into
        self.left_out: set[str] = set()
        """Keys of dict batches the forward does not take, left out of the call."""
        # CUDA graphs replay the backward graph into the same pool: a gradient that became
        # .grad on the first micro-step (stolen, not copied) is overwritten by the next replay
        # (pytorch/pytorch#169545). Gradients kept as tensors of their own, zeroed in place,
        # take each micro-step's gradient by an in-place add instead.
        self.keep_grads = (
            config.compile in GRAPH_CAPTURING_MODES
            and device.type == "cuda"
            and config.grad_accum_steps > 1
        )
        optimizer.register_step_post_hook(self._count_step)
        self.in_backward = InBackward(optimizer) if config.optimizer_in_backward else None
        """The per-parameter optimizers stepped in backward (``optimizer_in_backward``), where
        ``optimizer`` itself is never stepped."""

    def _count_step(self, *_: Any) -> None:
        self.optimizer_steps += 1

    def _sync_context(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        model: Any = self.model
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
            model.set_requires_gradient_sync(sync)
            return contextlib.nullcontext()
        if not sync and hasattr(model, "no_sync"):  # DDP
            return model.no_sync()  # type: ignore[no-any-return]
        return contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _materialize_grads(self) -> None:
        """Give every trainable parameter a zero gradient of its own (``keep_grads``)."""
        with torch.no_grad():
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    if param.requires_grad and param.grad is None:
                        param.grad = torch.zeros_like(param)

    def _clip(self, max_norm: float) -> None:
        """Clip the gradients of the optimizer's parameters to a total norm of ``max_norm``,
        fp16's unscaled first (the scaler's step then skips unscaling them again). Under FSDP
        the gradients are DTensor shards and the norm is taken over all of them."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    def run(self, batches: Iterator[Any]) -> StepStats:
        """One optimizer step over ``grad_accum_steps`` micro-batches drawn from ``batches``."""
        accum = self.config.grad_accum_steps
        if self.keep_grads:
            self._materialize_grads()
        start = time.perf_counter()
        data_wait = 0.0
        total_loss = torch.zeros((), device=self.device)
        hook_calls = []
        for micro in range(accum):
            fetch_start = time.perf_counter()
            batch = next(batches)
            data_wait += time.perf_counter() - fetch_start
            moved = move_to(batch, self.device, self.non_blocking, self.config.channels_last)
            args, kwargs, target = split_batch(moved, self.accepts, self.target_into)
            if isinstance(moved, Mapping) and kwargs:
                self.left_out.update(moved.keys() - kwargs.keys())
            calls_before = self.hooks.calls
            if self.keep_grads:  # each micro-step is a new replay of the graphs
                torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
            with self._sync_context(micro == accum - 1):
                with self._autocast():
                    try:
                        output = self.model(*args, **kwargs)
                    except Exception as error:
                        from autotune.runner.hints import (  # imports torch
                            cuda_hint,
                            dict_hint,
                            diverged_hint,
                            double_hint,
                            fsdp_dtype_hint,
                            group_hint,
                            input_hint,
                            target_hint,
                            target_input_hint,
                            tuple_hint,
                        )

                        hint = (
                            diverged_hint(self.model)
                            or dict_hint(moved, args, self.accepts)
                            or input_hint(args, kwargs)
                            or cuda_hint(error, self.device)
                            or tuple_hint(error, moved)
                            or double_hint(error, self.model, (args, kwargs))
                            or fsdp_dtype_hint(error, self.config)
                            or target_hint(error, target, forward=True)
                            or group_hint(error, self.model)
                            or target_input_hint(kwargs, target)
                        )
                        if hint:
                            error.add_note(hint)
                        raise
                    try:
                        loss = call_loss(self.loss_fn, output, target, kwargs)
                    except Exception as error:
                        from autotune.runner.hints import target_hint  # imports torch

                        hint = target_hint(error, target)
                        if hint:
                            error.add_note(hint)
                        raise
                    check_loss(loss)
                    loss = loss / accum
                if self.output_dtype is None:
                    self.output_dtype = _output_dtype(output)
                try:
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
                except RuntimeError as error:
                    from autotune.runner.hints import compiled_write_hint  # imports torch

                    if hint := compiled_write_hint(error, self.config):
                        error.add_note(hint)
                    raise
            hook_calls.append(self.hooks.calls - calls_before)
            total_loss += loss.detach().float()
            self.micro_steps += 1
        if self.config.max_grad_norm is not None:
            try:
                self._clip(self.config.max_grad_norm)
            except Exception as error:
                error.add_note(CLIPPING)
                raise
        if self.in_backward is not None:  # each parameter stepped as backward reached it
            self._count_step()
        else:
            try:
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
            except Exception as error:  # said with the error: the user's optimizer, not the model
                error.add_note(f"{OPTIMIZER_STEP} ({type(self.optimizer).__name__})")
                raise
            self.optimizer.zero_grad(set_to_none=not self.keep_grads)
        loss_value = float(total_loss.item())  # also waits for the device to finish the step
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepStats(time.perf_counter() - start, data_wait, loss_value, hook_calls)


def _output_dtype(output: Any) -> torch.dtype | None:
    tensor = first_tensor(output)
    return tensor.dtype if isinstance(tensor, torch.Tensor) else None


def loop_calls(model: nn.Module, batch: Any) -> dict[int, int] | None:
    """How often one forward of ``batch`` calls each of ``model``'s modules
    (``checkpointing.count_calls``), where its checkpointing units depend on it (a model with
    no stack of layers: ``blocks.may_loop``); None where they do not."""
    if not may_loop(model):
        return None
    args, kwargs, _ = split_batch(batch, forward_keywords(model))
    return count_calls(model, lambda: model(*args, **kwargs))


def prepare_model(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    calls: Mapping[int, int] | None = None,
) -> tuple[nn.Module, HookCounter, int, int]:
    """Checkpoint, move and wrap ``model``; return (wrapped, hook counter, ckpt'd, repeated).
    ``calls`` (``loop_calls``) finds the layers a model without stacks loops over."""
    repeated = checkpoint_units(model, calls).count
    checkpointed = apply_checkpointing(
        model, config.checkpoint_segments, calls, config.checkpoint_policy
    )
    if config.channels_last:  # before the wrap: DDP and FSDP take the parameters as they are
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    hooks = HookCounter()
    wrapped = wrap_model(model, config, device, hooks, checkpointed)
    if config.compile != "off":
        mode = None if config.compile == "default" else config.compile
        wrapped = torch.compile(wrapped, mode=mode)  # type: ignore[assignment]
    return wrapped, hooks, len(checkpointed), repeated

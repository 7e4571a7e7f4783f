"""A training session for one configuration in this process: device, process group, wrapped
model, optimizer, DataLoader and step.

The trial runner measures through this code and ``autotune.apply`` hands the same code to
users' own loops, so what was measured is what users run. ``prepare`` applies the knobs in the
order the trials measured them (checkpointing, device, parallel wrap, comm hook), builds the
DataLoader with the tuned settings and a ``DistributedSampler``; ``Training.step`` runs autocast,
the gradient scaler and accumulation with no gradient sync on all but the last micro-batch.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from autotune.config import TrainConfig
from autotune.runner.blocks import may_loop
from autotune.runner.fake_group import holds_sync_batch_norm
from autotune.runner.lazy_modules import first_batch, materialize_from_data
from autotune.runner.lightning import LightningStep, trained_as
from autotune.runner.loss import default_loss
from autotune.runner.memory import child_pids
from autotune.runner.optimizer import chosen_optimizer, with_implementation
from autotune.runner.training import (
    HookCounter,
    StepStats,
    TrainStep,
    forward_keywords,
    loop_calls,
    prepare_model,
    target_into,
)

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


def device_for(config: TrainConfig, local_rank: int | None = None) -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` for CUDA configs (made current), else CPU."""
    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


_PROCESS_MATMUL_PRECISION = torch.get_float32_matmul_precision()
"""This process's own setting, from before any trial: what ``matmul_precision=default`` keeps,
also in a process that ran a trial with another setting before."""


def set_matmul_precision(config: TrainConfig) -> None:
    """Apply ``config.matmul_precision`` to this process (a process-wide setting)."""
    wanted = config.matmul_precision
    torch.set_float32_matmul_precision(_PROCESS_MATMUL_PRECISION if wanted == "default" else wanted)


def init_distributed(config: TrainConfig, device: torch.device, timeout_s: float = 600.0) -> int:
    """Join the default process group if the config needs one; return this process's rank.

    The rank, world size and rendezvous come from the environment torchrun sets (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT). An existing process group is reused.
    """
    if config.parallel not in ("ddp", "fsdp"):
        return 0
    if not dist.is_initialized():
        world = int(os.environ.get("WORLD_SIZE", config.world_size))
        if world != config.world_size:
            raise RuntimeError(
                f"the config asks for world_size={config.world_size} but this job has "
                f"WORLD_SIZE={world}; launch it with --nproc-per-node={config.world_size}"
            )
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=int(os.environ.get("RANK", 0)),
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return dist.get_rank()


def join_group_of_one(config: TrainConfig, device: torch.device, model: nn.Module) -> None:
    """Join a process group of one where a trial of a one-process config (single device,
    DataParallel) finds none: a model that calls ``torch.distributed`` in its step (negatives
    gathered from every rank, ``dist.get_world_size()`` unguarded) runs in the group its
    script makes under ``torchrun``, even of one process, and fails without it. A trial's rank
    stays in it (its process ends, or runs the next trial of its gang in it); ``prepare`` makes
    none, as a user's script makes its own. A gloo group on CPU; NCCL on CUDA, which creates its
    communicator only when the model first calls a collective. None on a CPU beside
    ``nn.SyncBatchNorm``, which refuses any group there and trains as a batch norm without."""
    if config.processes > 1 or not dist.is_available() or dist.is_initialized():
        return
    if device.type != "cuda" and holds_sync_batch_norm(model):
        return
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1
    )


def make_loader(
    config: TrainConfig,
    dataset: Dataset[Any],
    rank: int,
    seed: int = 0,
    collate: Callable[[list[Any]], Any] | None = None,
) -> tuple[DataLoader[Any], DistributedSampler[Any] | None]:
    """A DataLoader with the config's worker settings, over this rank's share of ``dataset``:
    a ``DistributedSampler`` shares a map-style dataset out; an ``IterableDataset`` (a stream)
    yields its own share, reading its rank and its DataLoader worker (README, "Your model").
    ``collate`` makes a batch of samples (None: torch's ``default_collate``)."""
    replicas = config.world_size if config.parallel in ("ddp", "fsdp") else 1
    sampler: DistributedSampler[Any] | None = None
    if not isinstance(dataset, IterableDataset):
        sampler = DistributedSampler(
            dataset, num_replicas=replicas, rank=rank, seed=seed, drop_last=True
        )
    per_process = config.micro_batch_size * (config.world_size if config.parallel == "dp" else 1)
    loader = DataLoader(
        dataset,
        batch_size=per_process,
        sampler=sampler,
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor,
        pin_memory=config.pin_memory,
        persistent_workers=config.persistent_workers,
        drop_last=True,
        collate_fn=collate,
    )
    return loader, sampler


@dataclass
class Training:
    """A model, optimizer and DataLoader set up for one configuration, and its step."""

    config: TrainConfig
    device: torch.device
    rank: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loader: DataLoader[Any]
    sampler: DistributedSampler[Any] | None  # None: a stream, which shards itself
    runner: TrainStep
    hooks: HookCounter
    checkpointed_blocks: int
    repeated_blocks: int
    worker_pids: list[list[int]] = field(default_factory=list)
    owns_process_group: bool = False  # prepare() joined it, so close() leaves it

    epochs_started: int = 0
    epoch_start_s: float = 0.0  # waited for epochs' first batches (workers started), in all
    _restart: bool = False

    def batches(self) -> Iterator[Any]:
        """Batches forever, epoch after epoch (``set_epoch`` each time, on the sampler or on a
        stream that has one), for ``step``; a stream that ends starts again."""
        epoch = 0
        while True:
            target = self.sampler if self.sampler is not None else self.loader.dataset
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
            self.epochs_started += 1
            self._restart = False
            first, started = True, time.perf_counter()
            iterator = iter(self.loader)
            for batch in iterator:
                if first:
                    self.epoch_start_s += time.perf_counter() - started
                    if self.loader.num_workers:
                        self.worker_pids.append(sorted(child_pids()))
                first = False
                yield batch
                if self._restart:
                    break
            del iterator  # a non-persistent iterator shuts its workers down, as at an epoch end
            if first:
                raise RuntimeError(
                    "the DataLoader produced no batch: the dataset is smaller than one batch "
                    f"({self.loader.batch_size} samples) per rank"
                )
            epoch += 1

    def start_next_epoch(self) -> None:
        """End the current epoch early: the next batch from ``batches`` starts a new one, with
        what an epoch boundary costs (workers stopped and started unless persistent, the
        sampler's reshuffle, the prefetch queue refilled). The trials measure that cost."""
        self._restart = True

    @property
    def batches_per_epoch(self) -> int | None:
        """This process's batches in one epoch (None when the loader has no length)."""
        try:
            return len(self.loader)
        except TypeError:
            return None

    def step(self, batches: Iterator[Any]) -> StepStats:
        """One optimizer step: ``grad_accum_steps`` micro-batches from ``batches``."""
        return self.runner.run(batches)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds, as your own model and optimizer would hold it whatever
        the configuration wrapped: ``{"model": ..., "optimizer": ...}`` (and ``"scaler"``
        under fp16), full tensors on the CPU, the model's keys without DDP's ``module.``,
        ``torch.compile``'s ``_orig_mod.`` or checkpointing's wrapper, FSDP's shards gathered.
        A collective under a process group: call it on every rank; rank 0 gets the state, the
        others empty dicts (save it from rank 0). ``state["model"]`` loads into the plain model
        (``Net().load_state_dict``); ``load_state_dict`` takes the whole back, under this
        configuration or another (a resume on more devices)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer, options=_full_state())
        prefix = self._prefix
        state = {
            "model": _own_names(model, prefix, ""),
            "optimizer": _optimizer_names(optimizer, prefix, ""),
        }
        if self.runner.scaler is not None:
            state["scaler"] = self.runner.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` gave into the model and optimizer as this configuration
        holds them. On every rank; rank 0's ``state`` is the one loaded (``torch.load`` of the
        saved file there; the other ranks may pass the same or anything, ``{}``), its tensors
        broadcast and sharded as this configuration shards them."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        ranked = dist.is_initialized()
        scaler = [state.get("scaler")]
        if ranked:  # the scale too, or the ranks would scale their gradients apart
            dist.broadcast_object_list(scaler, src=0)
            if self.rank != 0:
                state = {"model": {}, "optimizer": {}}
        # apart: set_state_dict takes an empty model state (the other ranks') as none to load
        options = _full_state(broadcast=ranked)
        prefix = self._prefix
        model = _own_names(state["model"], "", prefix)
        set_model_state_dict(self.model, model, options=options)
        optimizer = _optimizer_names(state["optimizer"], "", prefix)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer, options=options)
        if self.runner.scaler is not None and scaler[0]:
            self.runner.scaler.load_state_dict(scaler[0])

    @property
    def _prefix(self) -> str:
        """The wrapper of a LightningModule (``LightningStep``) holds it as ``module``: the
        prefix its keys carry that the LightningModule's own do not."""
        return "module." if any(isinstance(m, LightningStep) for m in self.model.modules()) else ""

    def close(self) -> None:
        """Leave the process group ``prepare`` joined (one it found is left alone). Call it at
        the end of training: a gloo group torn down by interpreter exit can abort a rank
        ("terminate called without an active exception") after training succeeded. Cyclic
        garbage still holding collective work (comm-hook futures) is collected first; without
        that, destroying the group aborted a rank about one run in four. A barrier then makes
        every rank finish its collectives before any rank closes its connections: a rank that
        tore down first could still abort a peer mid-receive."""
        if self.owns_process_group and dist.is_initialized():
            leave_process_group()
            self.owns_process_group = False


def _full_state(broadcast: bool = False) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=broadcast)


def _own_names(state: dict[str, Any], drop: str, add: str) -> dict[str, Any]:
    """``state``'s keys with the prefix ``drop`` taken off and ``add`` put on."""
    return {add + key.removeprefix(drop): value for key, value in state.items()}


def _optimizer_names(state: dict[str, Any], drop: str, add: str) -> dict[str, Any]:
    """A full optimizer state (``get_state_dict``'s: parameters by name) renamed so."""
    if not state or (not drop and not add):
        return state
    groups = [
        {**group, "params": [add + name.removeprefix(drop) for name in group["params"]]}
        for group in state["param_groups"]
    ]
    return {"state": _own_names(state["state"], drop, add), "param_groups": groups}


def leave_process_group() -> None:
    """Destroy this process's gloo/NCCL group the way ``Training.close`` explains: collect the
    cyclic garbage holding collective work, wait for every rank, then tear down."""
    gc.collect()
    if dist.get_world_size() > 1:  # a group of one has no peer to wait for
        dist.barrier()
    dist.destroy_process_group()


def prepare(
    config: TrainConfig,
    model: nn.Module,
    dataset: Dataset[Any],
    loss: Callable[[Any, Any], Any] | None = None,
    *,
    optimizer: OptimizerFactory | None = None,
    device: torch.device | None = None,
    seed: int = 0,
    collate: Callable[[list[Any]], Any] | None = None,
) -> Training:
    """Apply ``config`` to ``model`` and ``dataset`` in this process (one rank of the job).

    ``loss(output, target)`` defaults to the model's own loss or the rules of
    ``autotune.runner.loss.default_loss``; ``optimizer`` is a factory taking the parameters of the
    wrapped model, or the model where its first parameter is named ``model`` (when omitted:
    the model's own, else AdamW with lr=1e-4); ``collate`` makes a batch of samples, the
    DataLoader's ``collate_fn`` (torch's ``default_collate`` when omitted).
    A LightningModule trains as the trials trained it: its ``training_step`` is the forward and
    its loss, its ``configure_optimizers`` the optimizer (``autotune.runner.lightning``).
    """
    model = trained_as(model)
    device = device or device_for(config)
    config = config.resolved(device.type)  # type: ignore[arg-type]
    set_matmul_precision(config)
    joined = not dist.is_initialized()
    rank = init_distributed(config, device)
    accepts = forward_keywords(model)  # before wrapping: a wrapper's forward takes anything
    materialize_from_data(model, dataset, collate)  # lazy modules' shapes, before any wrapper
    # the layer a model without stacks loops over, by a forward of two samples
    looping = config.checkpoint_segments > 0 and may_loop(model)
    calls = loop_calls(model, first_batch(dataset, collate)) if looping else None
    wrapped, hooks, checkpointed, repeated = prepare_model(model, config, device, calls)
    make_optimizer = chosen_optimizer(optimizer, model)
    opt = with_implementation(make_optimizer(wrapped.parameters()), config.optimizer_impl)
    loader, sampler = make_loader(config, dataset, rank, seed, collate)
    loss = loss or default_loss
    into = target_into(model, loss)
    runner = TrainStep(wrapped, opt, loss, config, device, hooks, accepts, into)
    return Training(
        config,
        device,
        rank,
        wrapped,
        opt,
        loader,
        sampler,
        runner,
        hooks,
        checkpointed,
        repeated,
        owns_process_group=joined and dist.is_initialized(),
    )

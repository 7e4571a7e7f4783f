"""What a model itself rules out, told from a build on the meta device before any trial.

A knob's value that no trial of the model could run (FSDP over sparse gradients, or on a CPU DDP
over several of them, which corrupts gloo's ranks now and then; a TorchScript module or one
unit of two dtypes; FSDP's bf16 parameters beside a parametrization's float32 buffers, or where
a forward so held fails, run for real since the meta device cannot show it; a compiled
TorchScript model; PowerSGD and fused optimizers for complex parameters or sparse gradients,
and on a CPU the fp16 hook for sparse ones), or would run for nothing (autocast over float64
parameters), is a ``Refusal``: the search's probe drops it (``probe.restrict_space``), ``plan``
leaves it out, and a configuration given alone asking for one is refused in one line
(``check_refusals``; so is clipping sparse gradients, ``check_clipping``, a setting rather than
a knob). A dataset GPU code keeps on the GPU rules out DataLoader workers on CUDA, and pinned
memory where its samples are CUDA's (``dataset_refusals``: the workload's, not the model's).
Each refusal that stands for a limit of torch is pinned by a test that fails should
torch lift it (gloo's crash now and then, ``GLOO_SPARSE``, by a script that counts it instead);
a refusal measured on one device type only holds there.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import get_args

from autotune.config import Compile, TrainConfig
from autotune.errors import ConfigError, error_line, first_three
from autotune.records import Value
from autotune.runner.fake_group import group_of_one, needs_group
from autotune.runner.tensor_hooks import fsdp_drops_hooks
from autotune.runner.workload import WorkloadSpec
from autotune.search.coupled import built_for_real
from autotune.search.meta_build import forget as forget_built
from autotune.search.meta_build import meta_model, on_gpu
from autotune.search.model_facts import parameters_dtype
from autotune.units import format_bytes


def fsdp_refusal(model_reference: str) -> str | None:
    """Why FSDP cannot train the model, told from a build on the meta device: a lookup with
    sparse gradients (``nn.Embedding`` or ``nn.EmbeddingBag`` with ``sparse=True``: FSDP's
    reduce-scatter takes none), gradient hooks on its parameters (``tensor_hooks``: FSDP's
    sharded parameters do not carry them), or a unit it shards (a repeated block, or the rest of the
    model) whose trainable parameters differ in dtype (complex spectral weights beside real
    ones: FSDP flattens a unit's parameters into one). None when neither holds, or when the
    model cannot be built there (its trials will tell)."""
    from autotune.runner.blocks import find_repeated_blocks, is_scripted  # imports torch

    built = meta_model(model_reference)
    if built is None:
        return None
    model = built[1]
    names = {module: name for name, module in model.named_modules()}
    if lookups := sparse_lookups(model_reference):
        return (
            f"FSDP cannot shard sparse gradients (sparse=True in {first_three(lookups)}; DDP "
            "reduces them)"
        )
    every = [names[m] for m in model.modules() if is_scripted(m)]
    # a scripted module's own modules are scripted too: the outermost are named
    outer = [n for n in every if not any(n.startswith(f"{o}.") for o in every if o)]
    scripted = ["the model"] if "" in every else outer
    if scripted:
        return (
            f"FSDP cannot shard a model holding a TorchScript module ({first_three(scripted)}): "
            "fully_shard hooks the modules it wraps, and a ScriptModule refuses hooks"
        )
    if hooks := fsdp_drops_hooks(model):
        return hooks
    blocks = find_repeated_blocks(model)
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    rest = [p for p in model.parameters() if id(p) not in in_blocks]
    for name, params in [*((names[b], list(b.parameters())) for b in blocks), ("the rest", rest)]:
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.requires_grad})
        if len(dtypes) > 1:
            return (
                f"FSDP shards a unit's parameters as one, of one dtype, and {name or 'the model'}"
                f" holds {' and '.join(dtypes)} ones"
            )
    return None


def sparse_lookups(model_reference: str) -> list[str]:
    """The model's lookups with sparse gradients (``nn.Embedding`` or ``nn.EmbeddingBag`` with
    ``sparse=True``), named, from a build on the meta device; [] where it has none or cannot be
    built there."""
    import torch

    built = meta_model(model_reference)
    if built is None:
        return []
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [
        name or "the model"
        for name, m in built[1].named_modules()
        if isinstance(m, kinds) and m.sparse
    ]


GLOO_SPARSE = (
    "DDP over gloo corrupts a rank's memory now and then where more than one lookup has sparse "
    "gradients ({lookups}): ranks died of SIGABRT or SIGSEGV ('malloc(): unaligned tcache "
    "chunk detected') in 5 of 12 runs of 300 steps with four such lookups, 1 of 12 with two, "
    "0 of 12 with one, in plain PyTorch 2.13 on a CPU; a search's short trials pass or crash "
    "by chance, and a long run crashes; on CUDA (NCCL) its trials tell"
)
"""Why DDP is refused on a CPU for a model of several sparse lookups (a DLRM's embedding bags).
The crash comes now and then, not every run, so no test can pin it: ``scripts/bench_gloo_sparse.py``
counts it (plain PyTorch), to be run again on a new torch."""


def sparse_refusals(lookups: str) -> list[Refusal]:
    """What sparse gradients rule out (the model's ``lookups``, named): a fused optimizer,
    PowerSGD, and on a CPU the fp16 hook. Each failed a trial of a lookup with
    ``sparse=True`` that the search had proposed."""
    given = f"the lookups {lookups} give sparse gradients (sparse=True)"
    return [
        Refusal(
            "optimizer_impl",
            "fused",
            f"a fused optimizer takes no sparse gradients ('does not support sparse "
            f"gradients'), and {given}",
            "use foreach or default",
        ),
        Refusal(
            "comm_hook",
            "powersgd",
            f"PowerSGD's hook compresses dense gradients, and {given}: once it compressed "
            "the dense layers beside them, the ranks timed out or waited in its allreduce for "
            "good (a trial, until its timeout; most runs in plain PyTorch over gloo)",
            "use comm_hook none",
        ),
        Refusal(
            "comm_hook",
            "fp16",
            f"gloo sums sparse gradients without a float16 kernel ('cadd_sparse' not "
            f"implemented for 'Half'), and {given}: the fp16 hook fails the first step",
            "use comm_hook none on a CPU",
            device="cpu",
        ),
    ]


def clipping_refusals(max_grad_norm: float | None) -> tuple[Refusal, ...]:
    """What clipping (``max_grad_norm``, the user's, in every configuration) rules out: the
    optimizer stepped in backward, whose parameters are updated before the total norm of their
    gradients is known."""
    if max_grad_norm is None:
        return ()
    return (
        Refusal(
            "optimizer_in_backward",
            True,
            f"max_grad_norm={max_grad_norm:g} clips by the norm of every gradient together, "
            "and a step in backward updates each parameter before the others' gradients exist",
            "optimizer_in_backward=false",
        ),
    )


def check_clipping(max_grad_norm: float | None, model_reference: str) -> None:
    """One line, before anything runs, where the gradients are clipped (``max_grad_norm``) and
    the model has lookups with sparse gradients: torch's ``clip_grad_norm_`` takes the norm of
    each gradient, and no norm kernel takes a sparse one, so every trial would fail its first
    step."""
    if max_grad_norm is None or not (lookups := sparse_lookups(model_reference)):
        return
    raise ConfigError(
        f"max_grad_norm={max_grad_norm:g}: torch's clip_grad_norm_ takes no sparse gradients "
        f"(no norm kernel for them), and the lookups {first_three(lookups)} give sparse "
        "gradients (sparse=True); leave --max-grad-norm (max_grad_norm) unset"
    )


def fake_quantization(model_reference: str) -> str | None:
    """The modules of quantization-aware training in the model (torch's fake quantization:
    ``prepare_qat``'s), named, from a build on the meta device; None when it has none."""
    from torch.ao.quantization import FakeQuantizeBase

    built = meta_model(model_reference)
    if built is None:
        return None
    kinds = sorted(
        {type(m).__name__ for m in built[1].modules() if isinstance(m, FakeQuantizeBase)}
    )
    return ", ".join(kinds) or None


def sync_batch_norms(model_reference: str) -> list[str]:
    """The model's ``nn.SyncBatchNorm`` modules (``convert_sync_batchnorm``'s), named, from a
    build on the meta device; [] where it has none or cannot be built there."""
    import torch

    built = meta_model(model_reference)
    if built is None:
        return []
    synced = torch.nn.SyncBatchNorm
    return [n or "the model" for n, m in built[1].named_modules() if isinstance(m, synced)]


SCRIPTED_COMPILE = "torch.compile does not compile a TorchScript model (torch.jit.script's)"


def scripted_model(model_reference: str) -> bool:
    """Whether the model is itself a TorchScript module (a factory returning
    ``torch.jit.script(model)``), from a build on the meta device."""
    from autotune.runner.blocks import is_scripted  # imports torch

    built = meta_model(model_reference)
    return built is not None and is_scripted(built[1])


def fsdp_mixed_precision_refusal(model_reference: str) -> str | None:
    """Why FSDP's bf16 parameters cannot train the model, told from a build on the meta device:
    a parametrization holding floating-point buffers (``spectral_norm``'s power-iteration
    vectors), which FSDP does not cast and which then meet its bf16 weight in one op ("addmv
    input tensors must have the same dtype"); or a module keeping its weight or bias as a
    floating-point buffer (a frozen batch norm: torchvision's ``FrozenBatchNorm2d``, Hugging Face
    DETR's), whose float32 output then meets the next layer's bf16 weight ("Input type
    (torch.FloatTensor) and weight type (CPUBFloat16Type) should be the same"). None when none
    does, or the model cannot be built there (its trials will tell)."""
    from torch.nn.utils import parametrize

    built = meta_model(model_reference)
    if built is None:
        return None
    holding = [
        name or "the model"
        for name, module in built[1].named_modules()
        if parametrize.is_parametrized(module)
        and any(
            b.is_floating_point() for p in module.parametrizations.values() for b in p.buffers()
        )
    ]
    frozen = [
        name or "the model"
        for name, module in built[1].named_modules()
        if any(
            b.is_floating_point()
            for key, b in module.named_buffers(recurse=False)
            if key in ("weight", "bias")
        )
    ]
    if holding:
        return (
            f"FSDP casts parameters to bf16 but not buffers, and a parametrization in "
            f"{first_three(holding)} computes with floating-point buffers of its own "
            "(spectral_norm's power iteration): its first step fails on mixed dtypes"
        )
    if frozen:
        return (
            f"FSDP casts parameters to bf16 but not buffers, and {first_three(frozen)} keep their "
            "weight or bias as floating-point buffers (a frozen batch norm): their float32 "
            "output meets the next layer's bf16 weight, and the first step fails"
        )
    return None


def fsdp_bf16_failure(workload: WorkloadSpec) -> tuple[str, bool] | None:
    """Why a forward held as FSDP's bf16 parameters hold the model fails, from one such forward
    of the dataset's first two samples through the model built for real on this CPU
    (``runner.bf16_forward``): (the error's line, whether it is a kernel this CPU lacks for
    bf16 rather than two dtypes meeting in one op). None where it runs, fails otherwise (the
    trials will say), or the model is not built here (``coupled.built_for_real``)."""
    from autotune.runner.hints import MIXED_DTYPES  # imports torch

    error = _bf16_forward_error(workload)
    if error is not None and needs_group(str(error)):  # a gather from every rank
        with group_of_one():
            error = _bf16_forward_error(workload)
    if error is None:
        return None
    text = str(error)
    if "not implemented for 'BFloat16'" in text:
        return error_line(error), True
    if any(words in text for words in MIXED_DTYPES):
        return error_line(error), False
    return None


def _bf16_forward_error(workload: WorkloadSpec) -> BaseException | None:
    from autotune.runner.bf16_forward import bf16_forward_error  # imports torch

    built = built_for_real(workload)
    if isinstance(built, str):
        return None
    model, loss, samples, collate = built
    try:
        return bf16_forward_error(model, collate(samples), loss)
    except Exception:  # the samples do not batch: the search says so before any trial
        return None


def forget() -> None:
    """Drop what is kept of the workloads refused here, and of their builds on the meta device."""
    fsdp_bf16_refusals.cache_clear()
    model_refusals.cache_clear()
    forget_built()


@functools.cache
def fsdp_bf16_refusals(workload: WorkloadSpec) -> tuple[Refusal, ...]:
    """FSDP's bf16 parameters, ruled out where a forward held as they hold the model fails
    (``fsdp_bf16_failure``): everywhere for two dtypes meeting in one op, on a CPU alone for a
    kernel this CPU lacks. None where the build on the meta device rules them out already
    (``fsdp_mixed_precision_refusal``: ``model_refusals`` says so)."""
    if fsdp_mixed_precision_refusal(workload.model):
        return ()
    failure = fsdp_bf16_failure(workload)
    if failure is None:
        return ()
    line, kernel = failure
    reason = (
        "a forward of two samples held as FSDP's bf16 parameters hold the model (its "
        f"parameters and each unit's inputs cast, no buffer) failed here: {line}"
    )
    return tuple(
        Refusal(
            "fsdp_mixed_precision",
            value,
            reason,
            "use amp=bf16 (autocast casts per op)",
            device="cpu" if kernel else None,
        )
        for value in ("bf16", "bf16-reduce-fp32")
    )


def autocast_ignored(model_reference: str) -> str | None:
    """Why AMP would change nothing for the model: every floating parameter float64, which
    autocast leaves alone (a physics-informed network trained in double precision: amp=bf16
    ran it in float64 and was reported as bf16). None otherwise, or when the model cannot be
    built on the meta device."""
    if parameters_dtype(model_reference) != "float64":
        return None
    return "the model's parameters are all float64, which autocast leaves alone"


def complex_parameters(model_reference: str) -> str | None:
    """The complex dtypes among the model's trainable parameters ("complex64"), from a build on
    the meta device: a Fourier layer's spectral weights. None where there are none, or it
    cannot be built there."""
    built = meta_model(model_reference)
    if built is None:
        return None
    dtypes = sorted(
        {
            str(p.dtype).removeprefix("torch.")
            for p in built[1].parameters()
            if p.is_complex() and p.requires_grad
        }
    )
    return " and ".join(dtypes) or None


@dataclass(frozen=True)
class Refusal:
    """A knob's value the model itself rules out, why, and what to ask for instead."""

    knob: str
    value: Value
    reason: str
    instead: str
    device: str | None = None  # the device type it holds on (measured there); None: every one

    def holds(self, device: str) -> bool:
        """Whether it holds for a configuration's ``device`` (cpu, cuda, or auto)."""
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return self.device in (None, device)


@functools.cache
def model_refusals(model_reference: str) -> tuple[Refusal, ...]:
    """The knob values no trial of this model could run, or would run for nothing, told from a
    build on the meta device before any trial: the search's probe drops them, ``plan`` leaves
    them out, and a configuration given alone asking for one is refused in one line."""
    refusals: list[Refusal] = []
    if refusal := fsdp_refusal(model_reference):
        refusals.append(Refusal("parallel", "fsdp", refusal, "use ddp or single"))
    if mixed := fsdp_mixed_precision_refusal(model_reference):
        refusals += [
            Refusal("fsdp_mixed_precision", value, mixed, "use amp=bf16 (autocast casts per op)")
            for value in ("bf16", "bf16-reduce-fp32")
        ]
    if synced := sync_batch_norms(model_reference):
        reason = (
            f"torch synchronises batch norms across ranks on GPUs only, and {first_three(synced)} "
            "are SyncBatchNorm (DDP: 'SyncBatchNorm layers only work with GPU modules'; FSDP: "
            "its first step fails); on CUDA they train"
        )
        refusals += [
            Refusal("parallel", mode, reason, "use single on a CPU", device="cpu")
            for mode in ("ddp", "fsdp")
        ]
    if len(lookups := sparse_lookups(model_reference)) > 1:
        reason = GLOO_SPARSE.format(lookups=first_three(lookups))
        refusals.append(Refusal("parallel", "ddp", reason, "use single on a CPU", device="cpu"))
    if lookups:
        refusals += sparse_refusals(first_three(lookups))
    if scripted_model(model_reference):
        refusals += [
            Refusal("compile", mode, SCRIPTED_COMPILE, "use compile=off")
            for mode in get_args(Compile)
            if mode != "off"
        ]
    if fake_quantized := fake_quantization(model_reference):
        reason = (
            f"quantization-aware training's fake quantization ({fake_quantized}) takes float32 "
            "only on a CPU: 16-bit activations or weights fail its first step "
            "(pytorch/pytorch#94371; on CUDA its trials tell)"
        )
        refusals += [
            Refusal(knob, value, reason, f"use {knob}=off", device="cpu")
            for knob, values in (
                ("amp", ("fp16", "bf16")),
                ("fsdp_mixed_precision", ("bf16", "bf16-reduce-fp32")),
            )
            for value in values
        ]
    if ignored := autocast_ignored(model_reference):
        refusals += [Refusal("amp", amp, ignored, "use amp=off") for amp in ("fp16", "bf16")]
    if dtypes := complex_parameters(model_reference):
        refusals.append(
            Refusal(
                "comm_hook",
                "powersgd",
                f"PowerSGD's hook never returns for {dtypes} gradients (a trial hung until "
                "its timeout)",
                "use comm_hook none, fp16 or bf16",
            )
        )
        refusals.append(
            Refusal(
                "optimizer_impl",
                "fused",
                f"a fused optimizer takes real floating-point parameters only, and the model "
                f"trains {dtypes} ones",
                "use foreach or default",
            )
        )
    return tuple(refusals)


def dataset_refusals(
    workload: WorkloadSpec, device: str, workers: Iterable[int], pinned: bool
) -> tuple[Refusal, ...]:
    """What a dataset GPU code keeps on the GPU, or whose samples it makes there, rules out on
    CUDA (``meta_build.on_gpu``): DataLoader workers (of ``workers``, the counts asked for),
    forked processes, which cannot use CUDA; and pinned memory (where ``pinned`` asks for it)
    where its samples are CUDA's, since only host tensors pin. None on ``device`` cpu, where
    neither is asked for (the dataset is not built), or where it uses no GPU."""
    workers = sorted({count for count in workers if count > 0})
    if device == "cpu" or not (workers or pinned):
        return ()
    kept, samples = on_gpu(workload)
    if not kept and not samples:
        return ()
    held = (
        f"the dataset keeps {format_bytes(kept)} of tensors on the GPU"
        if kept
        else "the dataset makes its samples on the GPU"
    )
    forked = (
        f'{held}, and a DataLoader worker, a forked process, cannot use CUDA ("Cannot '
        're-initialize CUDA in forked subprocess"); its samples need no loading'
    )
    refusals = [
        Refusal("num_workers", count, forked, "use num_workers=0", device="cuda")
        for count in workers
    ]
    if samples and pinned:
        host_only = f"{held}, and its samples are CUDA's: only host tensors can be pinned"
        refusals.append(Refusal("pin_memory", True, host_only, "use pin_memory=false", "cuda"))
    return tuple(refusals)


def check_refusals(
    config: TrainConfig, model_reference: str, refusals: tuple[Refusal, ...] | None = None
) -> None:
    """A configuration given alone (a trial, a plan of one): one line, before anything runs,
    where it asks for a value the model rules out (``refusals``, else ``model_refusals``), or
    clips gradients the model makes sparse (``check_clipping``)."""
    check_clipping(config.max_grad_norm, model_reference)
    for refusal in model_refusals(model_reference) if refusals is None else refusals:
        if getattr(config, refusal.knob) == refusal.value and refusal.holds(config.device):
            raise ConfigError(
                f"{refusal.knob}={refusal.value}: {refusal.reason}; {refusal.instead}"
            )

"""Whether a micro-batch's size moves the model's numerics: its batch norms' statistics and a
loss that couples its samples (``recipe.Coupling``). The loss's part is told by running the
model, built for real on the search's own CPU, on the dataset's first two samples, within the
bounds below; a model too large for that has its loss taken as its samples' mean.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import error_line
from autotune.runner.compile_state import eager_compiles
from autotune.runner.fake_group import WORLD_PROBE, group_of_one, needs_group
from autotune.runner.fake_memory import TraceError, trace_step
from autotune.runner.instances import names_an_instance, real_copy
from autotune.runner.workload import WorkloadSpec, load_collate, load_loss, load_model
from autotune.search.meta_build import BATCH_CHECKED, meta_inputs, meta_model, read_samples
from autotune.search.model_facts import batch_norm
from autotune.search.recipe import Coupling

COUPLING_BUILD_BYTES = 2**30
"""The largest model (bytes of parameters and buffers) the coupling check builds for real on
this machine; a larger one is not checked, and its loss is taken as its samples' mean (the
README says so)."""

COUPLING_FORWARD_FLOPS = 3e9
"""The most floating-point operations (counted on the meta device in under 0.1 s, before
anything runs) a forward of two samples may take for the coupling check to run it: four such
forwards in float64 on the search's own CPU. On the AMD EPYC of docs/benchmarks.md,
``gpt_small`` counts 1.7e9 and its whole check took 0.9 s; GPT-2 small at 1,024 tokens counts
5.8e11 (5 s a forward in float32) and is not checked."""

COUPLING_FORWARD_S = 1.0
"""The longest first forward of two samples the coupling check goes on after: it runs four on
the search's own CPU before any trial (GPT-2 small at 1,024 tokens: 5 s each on the AMD EPYC of
docs/benchmarks.md), and a longer one leaves the loss unchecked."""


def built_for_real(workload: WorkloadSpec) -> tuple[Any, Any, list[Any], Any] | str:
    """(model, loss, the dataset's first two samples, collate), the model and its loss built
    for real here for a check that runs it on the search's own CPU; where that is not done, why,
    in a few words: a model over ``COUPLING_BUILD_BYTES`` or a forward counted over
    ``COUPLING_FORWARD_FLOPS``, one that does not build here, fewer than two samples."""
    from torch.nn.parameter import is_lazy
    from torch.utils.data import default_collate

    built = meta_model(workload.model)
    if built is None:
        return "the model does not build on the meta device"
    first = read_samples(workload, BATCH_CHECKED)  # read once for every probe
    if not first or len(first) < 2:
        return "the dataset gives fewer than two samples here"
    samples = list(first[:2])
    held = [t for t in (*built[1].parameters(), *built[1].buffers()) if not is_lazy(t)]
    size = sum(t.numel() * t.element_size() for t in held)
    if size > COUPLING_BUILD_BYTES:
        return (
            f"the model holds {size / 2**30:.1f} GiB, over the {COUPLING_BUILD_BYTES / 2**30:g} "
            "GiB the check builds"
        )
    try:
        collate = load_collate(workload, built[0])[0] or default_collate
        flops = _meta_forward_flops(built[1], collate(samples))
        if flops is not None and flops > COUPLING_FORWARD_FLOPS:  # before it is built for real
            return (
                f"a forward of two samples counts {flops:.1e} operations, over the "
                f"{COUPLING_FORWARD_FLOPS:.0e} the check runs"
            )
        module, model = load_model(workload.model)
        if names_an_instance(workload.model):  # the caller's own: the checks change it
            model = real_copy(model, workload.model)
        loss, _ = load_loss(workload, module)
    except Exception as error:  # the trials will say
        return f"the model or its loss did not load here: {error_line(error)}"
    return model, loss, samples, collate


def loss_coupling(workload: WorkloadSpec) -> bool | str:
    """Whether the workload's loss of a micro-batch couples its samples
    (``runner.coupling.loss_couples_samples``), from the model built for real here and the
    dataset's first two samples (``built_for_real``); where that cannot be told, why, in a few
    words: what ``built_for_real`` says, a loss that draws at random, a forward over
    ``COUPLING_FORWARD_S``."""
    told = _loss_coupling(workload)
    if needs_group(told):  # it gathers from every rank: one rank's gather is its own rows
        with group_of_one():
            told = _loss_coupling(workload)
    return told


def _loss_coupling(workload: WorkloadSpec) -> bool | str:
    from autotune.runner.coupling import loss_couples_samples  # imports torch

    built = built_for_real(workload)
    if isinstance(built, str):
        return built
    model, loss, samples, collate = built
    return loss_couples_samples(
        model,
        samples,
        collate,
        loss,
        budget_s=COUPLING_FORWARD_S,
        float64=True,  # the model was built for this check alone
    )


def gathers(workload: WorkloadSpec, device_type: str = "cpu") -> bool:
    """Whether the workload's step holds more as one rank of many than alone: its loss covers
    what it gathers from every rank (``fake_group``), told by two traces of a micro-batch of
    two for the trials' ``device_type`` (False where it cannot be traced: FlexAttention, say,
    for a CPU)."""
    try:
        one, many = (
            trace_step(workload, 2, world_size=w, device_type=device_type) for w in (1, WORLD_PROBE)
        )
    except TraceError:
        return False
    return not one.held_alike(many)


def _meta_forward_flops(model: Any, batch: Any) -> int | None:
    """The floating-point operations of a forward of ``batch`` through ``model`` (built on the
    meta device), counted by torch's ``FlopCounterMode`` on the batch's shapes; None where the
    model cannot run on the meta device (a size the data decides)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from autotune.runner.fake_bias import causal_biases  # imports torch

    args, kwargs = meta_inputs(model, batch)
    try:
        counting = FlopCounterMode(display=False)
        with counting as counter, torch.no_grad(), eager_compiles(), causal_biases():
            model(*args, **kwargs)
    except Exception:  # the forwards themselves are timed instead
        return None
    return int(counter.get_total_flops())


def coupling(workload: WorkloadSpec, device_type: str = "cpu") -> Coupling | None:
    """What makes the workload's forward follow the micro-batch (``recipe.Coupling``), and why
    the loss's part could not be told; None where nothing does and all was told.
    ``device_type``: the trials' (``gathers``)."""
    told = loss_coupling(workload)
    untold = "" if isinstance(told, bool) else told
    gathered = told is True and gathers(workload, device_type)
    found = Coupling(
        batch_norm(workload.model), loss=told is True, loss_untold=untold, loss_gathered=gathered
    )
    return found if found or untold else None

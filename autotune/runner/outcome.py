"""From the reports of a trial's ranks to one ``TrialResult``, whoever ran the ranks."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.result import (
    Platform,
    RankReport,
    TrialResult,
    TrialStatus,
    rank_times,
    summarise_steps,
)
from autotune.runner.request import TrialRequest
from autotune.units import format_rate

_PEER_FAILURE_HINTS = ("connection closed by peer", "connection reset", "broken pipe", "timed out")

# Which failure explains a trial best when several ranks failed: the root cause first.
_PRIORITY: dict[TrialStatus, int] = {
    "invalid": 0,
    "oom": 1,
    "crashed": 2,
    "error": 3,
    "timed_out": 4,
    "pruned": 5,
    "ok": 6,
}


def is_peer_failure(message: str) -> bool:
    """Whether an error only echoes another rank's failure (a broken collective)."""
    return any(hint in message.lower() for hint in _PEER_FAILURE_HINTS)


def _is_echo(report: RankReport) -> bool:
    """A rank that only waited for, or broke on, another rank's failure."""
    return report.status == "timed_out" or (
        report.status == "error" and is_peer_failure(report.message)
    )


UNUSED_PARAMETERS_ERROR = "Expected to have finished reduction in the prior iteration"
"""What DDP says when a step left some parameters without a gradient."""
UNUSED_PARAMETERS_HINT = (
    "the model leaves some parameters without a gradient in a step (an unused head, a "
    "conditional branch): DDP needs find_unused_parameters (autotune trial "
    "--find-unused-parameters; a search sets it itself)"
)


UNEVEN_SAMPLES_ERROR = "stack expects each tensor to be equal size"
"""What torch's ``default_collate`` says of samples of different shapes."""
UNEVEN_SAMPLES_HINT = (
    "if the dataset's samples differ in shape, torch's default_collate cannot stack them: "
    "give a collate function that pads them (--collate module:attr, or autotune_collate in the "
    "model's module)"
)
UNBATCHABLE_ERROR = "default_collate: batch must contain"
"""What torch's ``default_collate`` says of samples of a kind it cannot batch (a dataclass)."""
UNBATCHABLE_HINT = (
    "torch's default_collate batches tensors, numbers, dicts and lists: make each sample one of "
    "those (a dataclass's fields a dict), or give a collate function that batches them "
    "(--collate module:attr, or autotune_collate in the model's module)"
)


def collate_hint(message: str) -> str | None:
    """How to make batches of samples that torch's ``default_collate`` failed on, going by its
    error ``message``; None for any other error."""
    if UNEVEN_SAMPLES_ERROR in message:
        return UNEVEN_SAMPLES_HINT
    if UNBATCHABLE_ERROR in message:
        return UNBATCHABLE_HINT
    return None


def unused_parameters_failure(config: TrainConfig, message: str) -> bool:
    """Whether a DDP run without ``find_unused_parameters`` failed for parameters a step left
    without a gradient."""
    return (
        config.parallel == "ddp"
        and not config.find_unused_parameters
        and UNUSED_PARAMETERS_ERROR in message
    )


def choose_failure(reports: list[RankReport]) -> RankReport:
    failed = [r for r in reports if r.status != "ok"]
    return min(failed, key=lambda r: (_is_echo(r), _PRIORITY[r.status], r.rank))


def assemble_result(
    request: TrialRequest,
    platform: Platform | None,
    reports: list[RankReport],
    *,
    launch_s: float,
    total_s: float,
) -> TrialResult:
    """The trial's result: measurements when every rank is ok, else the root-cause failure."""
    config, options = request.config, request.options
    common = {
        "config": config,
        "platform": platform,
        "workload": request.workload.model_dump(
            include={"model", "data", "loss", "optimizer", "collate"}
        ),
        "optimizer": next((r.optimizer for r in reports if r.optimizer), ""),
        "collate": next((r.collate for r in reports if r.collate), ""),
        "data": next((r.data for r in reports if r.data), ""),
        "loss_rule": next((r.loss_rule for r in reports if r.loss_rule), ""),
        "loss_source": next((r.loss_source for r in reports if r.loss_source), ""),
        "warmup_steps": options.warmup_for(request.config),
        "launch_s": launch_s,
        "total_s": total_s,
        "ranks": reports,
    }
    if reports and all(r.status == "ok" for r in reports):
        pruned = next((r for r in reports if r.pruned), None)
        summary = summarise_steps(config, reports)
        if pruned is not None:  # every rank stopped after the same step: they agree on it
            return TrialResult(status="pruned", message=pruned.pruned, **common, **summary)
        return TrialResult(status="ok", **common, **summary)
    failure = choose_failure(reports)
    if failure.status == "pruned":  # ended mid-step from outside (``executor.cut_reason``)
        slowest = max(s for r in reports for s in r.step_times_s)
        bound = config.global_batch_size / slowest
        return TrialResult(
            status="pruned",
            message=f"{failure.message}: at most {format_rate(bound)}",
            samples_per_s=bound,
            measured_steps=0,
            **common,
        )
    message = f"rank {failure.rank}: {failure.message}"
    if unused_parameters_failure(config, message):
        message = f"{UNUSED_PARAMETERS_HINT}; {message}"
    hint = collate_hint(message) if request.workload.collate is None else None
    if hint:
        message = f"{message} ({hint})"
    if failure.status == "timed_out":
        message = f"no result within timeout_s={options.timeout_s:g}; {message}"
    return TrialResult(
        status=failure.status,
        message=message,
        measured_steps=options.measured_steps,
        **common,
        **rank_times(reports),
    )

"""One rank of a trial: join the process group, build, warm up, measure, report.

``run_rank`` never raises: whatever happens becomes a ``RankReport`` with a status. It is the
same function whoever starts the rank (the local launcher's subprocess, or a Ray actor).

Run as a process: ``python -m autotune.runner.rank REQUEST.json RANK OUT_DIR``, with
MASTER_ADDR, MASTER_PORT and WORLD_SIZE set; it writes ``OUT_DIR/rank-RANK.json``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.config import TrainConfig
from autotune.errors import (
    RANK_HINTS,
    ConfigError,
    WorkloadError,
    error_line,
)
from autotune.result import RankReport, StepDiagnostics, TrialStatus
from autotune.runner.compile_state import compiled_graphs, compiled_since
from autotune.runner.cuda_allocator import apply_expandable_segments
from autotune.runner.loss import DefaultLoss
from autotune.runner.memory import MemoryTracker, release_earlier_trials
from autotune.runner.optimizer import OPTIMIZER_STEP, chosen_optimizer, running_implementation
from autotune.runner.platform import usable_cpus
from autotune.runner.request import TrialRequest
from autotune.runner.session import device_for, init_distributed, join_group_of_one, prepare
from autotune.runner.training import CLIPPING
from autotune.runner.window import AFTER_FASTER, STEP_PHASES, Decision, Window, warmup_phase
from autotune.runner.workload import BUILDING, WorkloadCache, build_workload


class Progress:
    """The current phase and since when, also written to a file (whose modification time is
    the phase's start) so that a launcher can say where a hung rank stopped, and see a step
    that has run too long."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.phase, self.since = path, "starting", time.perf_counter()

    def __call__(self, phase: str) -> None:
        self.phase, self.since = phase, time.perf_counter()
        if self.path is not None:
            self.path.write_text(phase)

    def where(self) -> tuple[str, float]:
        """The current phase and the seconds spent in it so far."""
        return self.phase, time.perf_counter() - self.since


def classify_exception(error: BaseException) -> tuple[TrialStatus, str]:
    """Map an exception raised inside a rank to a trial status and a one-line reason."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, ConfigError):
        return "invalid", text
    if isinstance(error, WorkloadError):
        return "error", text
    lowered = str(error).lower()
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError)
        and ("out of memory" in lowered or "can't allocate memory" in lowered)
    ):
        return "oom", error_line(error, 500)
    return "error", error_line(error, 500)


def raised_at(error: BaseException) -> str | None:
    """Where in code outside torch, autotune and Python's own library ``error`` was raised, or
    last passed through ("lucid.py:21, in autotune_loss"; a library's file from its package
    down: "transformers/models/gpt2/modeling_gpt2.py:..."): the line of the user's model, loss,
    dataset or optimizer a trial's one-line reason names, since the rank's traceback is shown
    only by `autotune trial --debug`. None where no frame lies outside them."""
    # torch's package and autotune's (above this one); Python's library (where os lives)
    packages = tuple(
        os.path.dirname(path) + os.sep
        for path in (torch.__file__, os.path.dirname(os.path.abspath(__file__)))
    )
    library = os.path.dirname(os.__file__) + os.sep
    installed = "site-packages" + os.sep  # under the library's directory, outside a venv
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        name = frame.filename
        if name.startswith(("<", *packages)):
            continue
        if installed in name:
            name = name.rsplit(installed, 1)[1]
        elif name.startswith(library):
            continue
        elif name.startswith(os.getcwd() + os.sep):
            name = os.path.relpath(name)
        return f"{name}:{frame.lineno}, in {frame.name}"
    return None


def apply_memory_limit(limit: int | None) -> None:
    """Impose (or lift, with None) a CPU memory limit on this process: RLIMIT_DATA's soft limit.

    Only the soft limit is set, so a process that runs many trials can raise it again.
    """
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = resource.RLIM_INFINITY if limit is None else limit
    if hard != resource.RLIM_INFINITY:
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _watch_parent(parent: int) -> None:
    """End this rank if the launcher that started it is gone (no orphans after a SIGKILL)."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _Agreement:
    """Makes every rank decide on the same numbers (the slowest rank's step time and elapsed
    time), so that all of them stop measuring, or prune, after the same step: a rank that
    stopped alone would leave the others in a collective. One-process trials need nothing."""

    def __init__(self, device: torch.device | None) -> None:
        self.device, self.spent_s = device, 0.0

    def __call__(self, *seconds: float) -> list[float]:
        """Each of ``seconds`` as its largest over the ranks."""
        if self.device is None:
            return list(seconds)
        started = time.perf_counter()
        value = torch.tensor(seconds, dtype=torch.float64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        self.spent_s += time.perf_counter() - started
        agreed: list[float] = value.tolist()
        return agreed

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a step that compiled on one is compile time on
        all: they judge the same step alike)."""
        if self.device is None:
            return flag
        value = torch.tensor([float(flag)], dtype=torch.float64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())


def _agreement(config: TrainConfig, device: torch.device) -> _Agreement:
    many = config.processes > 1 and dist.is_available() and dist.is_initialized()
    return _Agreement(device if many else None)


def run_rank(
    request: TrialRequest,
    rank: int,
    progress: Progress | None = None,
    workloads: WorkloadCache | None = None,
) -> RankReport:
    """Run this rank's share of the trial; every outcome is returned, none raised.

    A process that runs many trials passes the same ``workloads`` cache each time, so that the
    user's module, dataset and initial model are built once; each trial still gets a fresh copy
    of the model. An existing default process group is reused.
    """
    progress = progress or Progress(None)
    spawned_at = float(os.environ.get("AUTOTUNE_SPAWNED_AT", time.time()))
    report: dict[str, Any] = {"rank": rank}
    try:
        _measure(request, rank, progress, report, spawned_at, workloads)
        return RankReport(status="ok", **report)
    except BaseException as error:  # a rank must report, whatever went wrong
        # whole, in the rank's own output: `autotune trial --debug` shows it; the report's
        # message is one line of it
        traceback.print_exception(error, file=sys.stderr)
        status, message = classify_exception(error)
        notes = getattr(error, "__notes__", ())
        where = [n for n in notes if n.startswith((OPTIMIZER_STEP, CLIPPING))]
        hints = [f" ({n})" for n in notes if n.startswith(RANK_HINTS)]
        phase = progress.phase.removesuffix(AFTER_FASTER)  # how the pruning rule read it: not news
        # autotune's own errors name what is wrong already
        at = None if isinstance(error, (ConfigError, WorkloadError)) else raised_at(error)
        message = ": ".join([phase, *where[:1], message]) + (f" (at {at})" if at else "")
        message += "".join(hints[:1])
        return RankReport(status=status, message=message, **report)


def _measure(
    request: TrialRequest,
    rank: int,
    progress: Progress,
    report: dict[str, Any],
    spawned: float,
    workloads: WorkloadCache | None,
) -> None:
    config, options = request.config, request.options
    device = device_for(config, int(os.environ.get("LOCAL_RANK", rank)))
    if device.type == "cuda":  # every trial sets it: the process may have run a limited one
        limit = options.memory_limit_bytes
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (limit or total) / total), device)
    # On CPU, compute threads and DataLoader workers share the cores: leave the workers theirs,
    # or OpenMP's spinning threads starve them.
    cores = usable_cpus() // config.processes
    threads = max(1, cores - (config.num_workers if device.type == "cpu" else 0))
    torch.set_num_threads(threads)
    report["torch_threads"] = threads

    progress("joining the process group")
    init_distributed(config, device, timeout_s=max(30.0, options.timeout_s))
    started = time.time()
    report["startup_s"] = started - spawned

    compiling = config.compile != "off"  # dynamo's import costs ~1 s: only when compiling
    graphs_before = compiled_graphs() if compiling else 0
    progress(BUILDING)
    release_earlier_trials(device)  # what earlier trials held must not count in this one's peak
    allocator = apply_expandable_segments(config.expandable_segments)  # every trial: reused ranks
    torch.manual_seed(options.seed)
    workload = workloads.get(request.workload) if workloads else build_workload(request.workload)
    progress("applying the configuration")
    join_group_of_one(config, device, workload.model)
    training = prepare(
        config,
        workload.model,
        workload.dataset,
        workload.loss,
        optimizer=chosen_optimizer(workload.optimizer, workload.model, options.learning_rate),
        device=device,
        seed=options.seed,
        collate=workload.collate,
    )
    report["optimizer"] = type(training.optimizer).__name__
    report["collate"] = workload.collate_source
    if not isinstance(workload.loss, DefaultLoss):  # the user's: named where it came from
        report["loss_source"] = workload.loss_source
    report["data"] = workload.data_source
    batches = training.batches()
    step = training.runner
    report["build_s"] = time.time() - started

    losses: list[float] = []
    hook_calls: list[int] = []
    window = Window(options, config.global_batch_size)
    agree = _agreement(config, device)
    data_wait = 0.0

    def run_step(since: float | None = None) -> tuple[float, float, float]:
        """One step; (step time, seconds since ``since`` less agreement, the step's wait for an
        epoch's first batch), as all ranks agree: the slowest rank's step, and the wait that
        leaves the slowest step without it."""
        epoch_start_s = training.epoch_start_s
        stats = step.run(batches)
        epoch_start_s = training.epoch_start_s - epoch_start_s
        losses.append(stats.loss)
        hook_calls.extend(stats.hook_calls)
        nonlocal data_wait
        data_wait += stats.data_wait_s
        elapsed = 0.0 if since is None else time.perf_counter() - since - agree.spent_s
        step_s, elapsed, without = agree(stats.wall_s, elapsed, stats.wall_s - epoch_start_s)
        return step_s, elapsed, step_s - without

    decision: Decision = "measure"
    warm_start = time.perf_counter()
    compile_steps_s: list[float] = []
    for i in range(options.warmup_for(config)):
        progress(
            window.phase(warmup_phase(i, compiling, compile_steps_s[0] if compile_steps_s else 0.0))
        )
        graphs = compiled_graphs() if compiling else 0
        step_s, _, epoch_start_s = run_step()
        if compiling and (i == 0 or agree.any((compiled_since(graphs) or 0) > 0)):
            # It compiled (the first step) or compiled again (a guard the first step broke:
            # Hugging Face's classifiers set config.problem_type in their first forward): paid
            # once per run, reported as compile time, never judged or measured.
            compile_steps_s.append(step_s)
            continue
        decision = window.warmup_step(step_s, epoch_start_s)
        if decision == "prune":
            break
    report["warmup_s"] = time.perf_counter() - warm_start

    tracker = MemoryTracker(device)
    tracker.start()
    data_wait, epochs_before = 0.0, training.epochs_started
    agree.spent_s = 0.0  # from here on, the agreement's time is not the training's
    measure_start = time.perf_counter()
    while decision == "measure":
        progress(window.phase(f"{STEP_PHASES[1]} {len(window.steps) + 1}"))
        step_s, elapsed_s, epoch_start_s = run_step(since=measure_start)
        decision = window.measured_step(step_s, elapsed_s, epoch_start_s)
    # At least the steps themselves: a trial pruned in warm-up measured that one step.
    elapsed = time.perf_counter() - measure_start - agree.spent_s
    report["measured_s"] = max(elapsed, sum(window.steps))
    report["epochs_crossed"] = training.epochs_started - epochs_before
    report["data_wait_s"] = data_wait
    if decision == "done" and training.batches_per_epoch:
        progress("measuring an epoch boundary")
        training.start_next_epoch()
        report["epoch_boundary_s"] = max(0.0, run_step()[0] - window.interval().mean)
        report["batches_per_epoch"] = training.batches_per_epoch
    if decision == "prune":
        report["pruned"] = window.reason
    if compile_steps_s and window.steps:
        steady = window.interval().mean
        report["compile_s"] = sum(max(0.0, s - steady) for s in compile_steps_s)
        report["compiled_before"] = (graphs_before or 0) > 0  # reset; imports, kernels stay
    peak = tracker.stop()
    progress("reporting")
    report.update(
        step_times_s=window.steps,
        peak_memory_bytes=peak.peak_bytes,
        peak_reserved_bytes=peak.reserved_bytes,
        peak_device_used_bytes=peak.device_used_bytes,
        losses=losses,
        loss_rule=_loss_rule(workload),
        **(
            {
                "data": f"{workload.data_source}; left out of the forward's call, which does not "
                f"take them: {', '.join(sorted(step.left_out))}"
            }
            if step.left_out
            else {}
        ),
        diagnostics=StepDiagnostics(
            optimizer_steps=step.optimizer_steps,
            micro_steps=step.micro_steps,
            comm_hook_calls_per_micro_step=hook_calls,
            output_dtype=str(step.output_dtype).removeprefix("torch."),
            checkpointed_blocks=training.checkpointed_blocks,
            repeated_blocks=training.repeated_blocks,
            dataloader_worker_pids=training.worker_pids,
            grad_scaler_scale=step.scaler.get_scale() if step.scaler else None,
            powersgd_lowrank_calls=step.hooks.lowrank_calls,
            compiled_graphs=compiled_since(graphs_before) if compiling else 0,
            matmul_precision=torch.get_float32_matmul_precision(),
            optimizer_impl=running_implementation(training.optimizer),
            allocator_settings=allocator,
        ),
    )


def _loss_rule(workload: Any) -> str:
    """Which of the default loss's rules made the trial's loss, and from what the model's step
    returned where that is not its forward (a LightningModule's training step)."""
    rule = str(getattr(workload.loss, "rule", ""))
    stepped = getattr(workload.model, "step_source", "")
    return f"{rule}, returned by {stepped}" if rule and stepped else rule


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    request_path, rank, out_dir = Path(args[0]), int(args[1]), Path(args[2])
    _watch_parent(os.getppid())
    request = TrialRequest.model_validate_json(request_path.read_text())
    if request.config.device == "cpu" and request.options.memory_limit_bytes is not None:
        try:
            apply_memory_limit(request.options.memory_limit_bytes)
        except (ValueError, OSError) as error:
            print(f"cannot impose the memory limit: {error}", file=sys.stderr)
    report = run_rank(request, rank, Progress(out_dir / f"phase-{rank}.txt"))
    partial = out_dir / f"rank-{rank}.json.part"
    partial.write_text(report.model_dump_json())
    partial.rename(out_dir / f"rank-{rank}.json")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a broken process group or DataLoader can hang it, and the
    # launcher ends this rank's process group (DataLoader workers included) anyway.
    os._exit(0 if report.status == "ok" else 1)


if __name__ == "__main__":
    main()

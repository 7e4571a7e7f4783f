"""Readable summaries of results for the terminal."""

from __future__ import annotations

from typing import Any

from autotune.recommendation import ROUNDS_IN_REACH, Recommendation
from autotune.records import TrialRecord, exclusion_lines
from autotune.result import TrialResult, drift_words
from autotune.runner.fake_memory import UNUSED_PARAMETERS
from autotune.search.driver import stored_recommendation
from autotune.search.log import stored_records
from autotune.search.memory_model import budget_scope
from autotune.search.model_facts import EVERY_BLOCK_AT_ONE
from autotune.search.plan import Plan
from autotune.search.race import race_runs
from autotune.search.storage import abandoned, load_stored_study, pick_study, stored_studies
from autotune.secrets import mask_url
from autotune.units import format_bytes, format_rate, format_speed


def format_trial(result: TrialResult) -> str:
    """A few aligned lines describing one trial; the JSON record holds everything else."""
    config = result.config
    lines = [f"trial {result.status}  {config.summary()}"]
    if result.status not in ("ok", "pruned"):
        lines.append(f"  reason        {result.message}")
    else:
        if result.status == "pruned":
            lines.append(f"  reason        {result.message} (a partial measurement)")
        assert result.samples_per_s is not None and result.step_time_median_s is not None
        assert result.step_time_p10_s is not None and result.step_time_p90_s is not None
        interval = _range(result.samples_per_s_low, result.samples_per_s_high)
        epoch = ""
        if result.epoch_boundary_s is not None and result.steps_per_epoch:
            epoch = (
                f"  epoch         a boundary costs {result.epoch_boundary_s * 1e3:.1f} ms every "
                f"{result.steps_per_epoch:g} steps: included (window alone "
                f"{format_rate(result.steady_samples_per_s or 0)})"
            )
        lines += [
            f"  throughput    {format_rate(result.samples_per_s)}{interval} "
            f"(global batch {config.global_batch_size}, micro-batch {config.micro_batch_size})",
            *([epoch] if epoch else []),
            f"  step time     median {result.step_time_median_s * 1e3:.1f} ms, "
            f"p10-p90 {result.step_time_p10_s * 1e3:.1f}-{result.step_time_p90_s * 1e3:.1f} ms "
            f"(spread {result.step_time_spread:.0%}) over {result.measured_steps} steps",
            *(
                [
                    f"  not steady    {drift_words(result.step_time_drift)}: the rate depends "
                    "on how many steps ran; raise --warmup-steps until it holds level"
                ]
                if result.step_time_drift is not None
                else []
            ),
            f"  data wait     {result.data_wait_share:.1%} of measured time",
            f"  peak memory   {format_bytes(result.peak_memory_bytes or 0)} per rank "
            f"(largest of {len(result.ranks)}; {_memory_kind(result)})",
            f"  loss          {'finite' if result.loss_finite else 'NOT FINITE'} "
            f"({_loss_trend(result)})" + (f": {said}" if (said := _loss_words(result)) else ""),
            *(
                [f"  diverged      {diverged}: a search never recommends such a configuration"]
                if (diverged := result.diverged)
                else []
            ),
        ]
        if result.optimizer:
            given = result.workload.get("optimizer")
            lines.append(
                f"  optimizer     {result.optimizer}" + (f" (--optimizer {given})" if given else "")
            )
        if result.data:
            lines.append(f"  samples       {result.data}")
        if result.collate:
            lines.append(f"  collate       {result.collate}")
        if result.compile_s is not None:
            warm = ", in processes that had compiled before: a run of its own compiles longer"
            lines.append(
                f"  compile       {result.compile_s:.1f} s once per run (the warm-up steps that "
                f"compile; never in the measured steps{warm if result.compiled_before else ''})"
            )
    lines.append(
        f"  time          {result.total_s:.1f} s: overhead {result.overhead_s:.1f} s (launch "
        f"{result.launch_s:.1f}, start-up {result.startup_s:.1f}, build {result.build_s:.1f}), "
        f"warm-up {result.warmup_s:.2f} s, measured {result.measured_s:.2f} s"
    )
    if result.platform is not None:
        p = result.platform
        lines.append(
            f"  platform      {p.device_name} ({p.device_type}), torch {p.torch_version}, "
            f"{p.backend}"
        )
    return "\n".join(lines)


def _memory_kind(result: TrialResult) -> str:
    if result.platform is not None and result.platform.device_type == "cuda":
        return "CUDA allocator peak"
    return "resident high-water mark incl. DataLoader workers"


def _loss_trend(result: TrialResult) -> str:
    losses = result.ranks[0].losses if result.ranks else []
    if not losses:
        return "no steps"
    return f"first {losses[0]:.4g}, last {losses[-1]:.4g}"


def baseline_cells(r: Recommendation) -> tuple[str, str]:
    """(samples/s, speed-up) of the recommendation's baseline column."""
    if r.baseline is None:
        return "-", "-"
    if r.baseline_failed:
        return f"{r.baseline.status}", "-"
    speed = format_speed(r.baseline_samples_per_s) if r.baseline_samples_per_s else "-"
    raced = race_runs(r.trials, r.baseline.config) if r.baseline.config else {}
    if r.baseline_samples_per_s and raced and len(raced) != len(r.samples_per_s_runs):
        # It left the race before the recommended did: its mean and the recommended's cover
        # different rounds (a slow stretch in one and not the other), while the speed-up
        # pairs the rounds both ran. Say so rather than let the two means read as a ratio.
        speed += f" ({len(raced)} race runs)"
    return speed, "1.00x" if r.baseline_samples_per_s else "-"


def baseline_memory_cell(r: Recommendation) -> str:
    """The baseline column's peak memory: the largest over its runs, as the recommended's is."""
    base = r.baseline
    used = r.baseline_memory_used_bytes or (base.memory_used_bytes if base else None)
    over = " (over the limit)" if r.baseline_over_limit else ""
    return f"{format_bytes(used)}{over}" if used else "-"


def baseline_over_limit_line(r: Recommendation) -> str | None:
    """Why the baseline's speed-up compares with a configuration that does not fit, or None."""
    if r.baseline is None or not r.baseline_over_limit or r.baseline.config is None:
        return None
    accum = r.baseline.config.grad_accum_steps
    return (
        f"the baseline does not fit: over the memory limit {format_bytes(r.memory_limit_bytes)} "
        f"at accumulation {accum}, the last the search tried; its speed-up is over a "
        "configuration that does not fit"
    )


def _loss_words(result: TrialResult) -> str:
    """What the trial's loss was: the default's rule, or where the user's came from ("yours,
    mymodel.py:autotune_loss"); '' where neither is known."""
    if result.loss_rule:
        return result.loss_rule
    return f"yours, {result.loss_source}" if result.loss_source else ""


def loss_rule(r: Recommendation) -> str | None:
    """What the recommended configuration's verification run trained on (the default loss's
    rule: the model's own loss, or one from the target, with what it left out; the user's,
    where it came from); None where no run said."""
    if r.verification is None:
        return None
    return _loss_words(r.verification) or None


def verification_line(r: Recommendation) -> str:
    """What the longer run showed, in one sentence that never calls a coin toss a confirmation."""
    v = r.verification
    if v is None:
        return "not verified: no verification run"
    if not v.ok or r.verification_error is None:
        return f"NOT verified: the verification run ended {v.status}: {v.message}"
    within = "within" if r.memory_confirmed else "OVER"
    memory = f"{within} the memory limit {format_bytes(r.memory_limit_bytes)}"
    run = f"a {v.measured_steps}-step run at {format_rate(v.samples_per_s or 0)}"
    tolerance = f"tolerance ±{r.throughput_tolerance:.0%}"
    if r.throughput_verdict == "too noisy":
        return (
            f"NOT verified: too noisy to confirm the throughput (its runs spread {r.spread:.0%}, "
            f"more than the {tolerance}); {run} ({r.verification_error:+.1%}) stays {memory}"
        )
    agrees = "confirms" if r.throughput_confirmed else "does NOT confirm"
    return (
        f"{'verified' if r.verified else 'NOT verified'}: {run} {agrees} the estimate "
        f"({r.verification_error:+.1%}, {tolerance}) and stays {memory}"
    )


def _range(low: float | None, high: float | None, spec: str = "", level: str = "95%") -> str:
    """ " [95%: low-high]" for an interval, "" when there is none; each end formatted by
    ``spec``, a throughput's way (``format_speed``) without one."""
    if low is None or high is None:
        return ""
    if not spec:
        return f" [{level}: {format_speed(low)}-{format_speed(high)}]"
    return f" [{level}: {low:{spec}}-{high:{spec}}]"


def runner_up_line(r: Recommendation) -> str | None:
    """How the race's next-fastest finalist compares, saying so when the race could not tell
    the two apart; None when no other finalist finished the race."""
    other = r.runner_up
    if other is None:
        return None
    head = f"runner-up {other.config.summary()}"
    if other.ratio is None:
        return f"{head}: raced in fewer than 2 rounds beside the recommended, not compared"
    interval = _range(other.ratio_low, other.ratio_high, ".2f", "90%")
    ratio = f"{head}: {other.ratio:.2f}x the recommended's samples/s{interval} over {other.rounds}"
    if other.ruled_out:
        return f"{ratio} paired race rounds: slower with confidence"
    if other.faster:
        return (
            f"{ratio} paired race rounds: faster at the race's one-sided 95%, not beyond the 95% "
            "interval the speed-ups are given with; the recommended changes less (above)"
        )
    return (
        f"{ratio} paired race rounds: too close to call on this machine's run-to-run noise, "
        f"either may be the faster{_split_clause(other.rounds_to_split)}"
    )


def _split_clause(rounds: int | None) -> str:
    """What it would take to tell them apart, projected from the rounds so far."""
    if rounds is None:
        return ""
    if rounds >= ROUNDS_IN_REACH:
        return f" (projected: not within {ROUNDS_IN_REACH} rounds; as alike as it can tell)"
    return f" (projected: about {rounds} rounds would split them, --race-rounds {rounds})"


def compile_line(r: Recommendation) -> str:
    """What torch.compile costs the recommended config: once per run, outside samples/s; what
    its trials measured in processes that had compiled before is said to be less than a run of
    its own pays."""
    head = f"torch.compile mode={r.config.compile}: "
    steps = "the warm-up steps that compile, the first and any that compiles again"
    if r.compile_s is None:
        return f"{head}compiling, once per run, was not measured ({steps}; not in samples/s)"
    if not r.compiled_before:
        return (
            f"{head}compiling takes {r.compile_s:.1f} s once per run ({steps}, measured in its "
            "trials; not in samples/s)"
        )
    warm = (
        f"{head}compiling took {r.compile_s:.1f} s in its trials, whose processes had compiled "
        f"before ({steps}; not in samples/s): a run of its own compiles longer"
    )
    fresh = r.fresh_compile
    if fresh is None or fresh.config is None or fresh.compile_s is None:
        return warm
    return (
        f"{warm}; the search's first compile in fresh processes took {fresh.compile_s:.1f} s "
        f"(#{fresh.number}, {fresh.config.summary()})"
    )


def throughput_cell(r: Recommendation) -> str:
    """The recommended throughput with its interval and how many race runs it rests on."""
    interval = _range(r.samples_per_s_low, r.samples_per_s_high)
    runs = len(r.samples_per_s_runs)
    return f"{format_speed(r.samples_per_s)}{interval} ({runs} race runs, spread {r.spread:.0%})"


def selection_line(r: Recommendation) -> str | None:
    """What the recommended samples/s and speed-up took out for the winner's luck; None when
    it is under half a percent."""
    if r.selection_factor >= 0.995:
        return None
    mean = r.samples_per_s / r.selection_factor
    return (
        f"samples/s and speed-up: the race runs' mean {format_speed(mean)} less "
        f"{1 - r.selection_factor:.1%} for having been chosen among finalists the noise could "
        "not split (the best of close means is flattered: the winner's curse)"
    )


def speedup_cell(r: Recommendation) -> str:
    """The speed-up over the baseline with its interval; "-" when there is none."""
    if not r.speedup:
        return "-"
    return f"{r.speedup:.2f}x{_range(r.speedup_low, r.speedup_high, '.2f')}"


def recipe_lines(r: Recommendation) -> list[str]:
    """The recommendation against the standard recipe (what a skilled engineer writes by
    hand), or that the recipe is the recommendation; nothing for a study without one."""
    if r.recipe is None:
        return []
    if r.recipe_won:
        return [
            "the standard recipe is the recommendation: tuning found nothing the race could "
            f"show faster than {r.recipe.summary()}"
        ]
    speed = format_rate(r.recipe_samples_per_s) if r.recipe_samples_per_s else "-"
    over = "-"
    if r.speedup_over_recipe:
        interval = _range(r.speedup_over_recipe_low, r.speedup_over_recipe_high, ".2f")
        over = f"{r.speedup_over_recipe:.2f}x{interval}"
    return [f"over the standard recipe ({r.recipe.summary()}, {speed}): {over}{_recipe_over(r)}"]


def _recipe_over(r: Recommendation) -> str:
    """Where a run of the recipe went over the memory limit: it fits only some of the time
    (on CPU the heap moves a peak by several percent between runs), and the race left it."""
    assert r.recipe is not None
    runs = [t for t in r.trials if t.config == r.recipe and t.status == "ok"]
    over = [t.memory_used_bytes or 0 for t in runs if not t.fits]
    if not over:
        return ""
    return (
        f"; the recipe went over the memory limit {format_bytes(r.memory_limit_bytes)} in "
        f"{len(over)} of its {len(runs)} runs (up to {format_bytes(max(over))}), so the race "
        "left it"
    )


SHORT_DTYPES = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def numerics_line(r: Recommendation) -> str:
    """Every change the recommendation makes to the training's arithmetic, on its own line."""
    if not r.numerics_changes:
        own = SHORT_DTYPES.get(r.parameter_dtype or "float32", r.parameter_dtype)
        return f"numerics: unchanged ({own} arithmetic, uncompressed gradients)"
    return f"numerics changed: {', '.join(r.numerics_changes)}"


def format_recommendation(recommendation: Recommendation, out: str | None = None) -> str:
    """The recommendation against the baseline, what was excluded, and where things are."""
    r = recommendation
    base = r.baseline
    base_speed, base_speedup = baseline_cells(r)
    rows = [("", "recommended", "baseline")]
    rows.append(
        ("config", r.config.summary(), base.config.summary() if base and base.config else "-")
    )
    rows.append(("samples/s", throughput_cell(r), base_speed))
    rows.append(("speed-up", speedup_cell(r), base_speedup))
    rows.append(
        (
            "peak memory",
            format_bytes(r.memory_used_bytes),
            baseline_memory_cell(r),
        )
    )
    rows.append(
        (
            "headroom",
            f"{format_bytes(r.headroom_bytes)} of {format_bytes(r.memory_budget_bytes)}",
            "-",
        )
    )
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    if base is not None and r.baseline_failed:
        lines.append(f"baseline {base.status}: {base.message} (no speed-up can be given)")
    elif (over := baseline_over_limit_line(r)) is not None:
        lines.append(over)
    elif base is not None and base.config == r.config:
        lines.append("the baseline itself is the fastest configuration found: keep it")
    lines.extend(recipe_lines(r))
    lines.append(numerics_line(r))
    lines.extend(f"memory caveat: {caveat}" for caveat in r.memory_caveats)
    lines.extend(f"throughput caveat: {caveat}" for caveat in r.throughput_caveats)
    if r.simpler_choice:
        lines.append(f"chosen for changing less: {r.simpler_choice}")
    if r.made_room:
        lines.append(f"moved to fit: every finalist went over the memory limit; {r.made_room}")
    if (luck := selection_line(r)) is not None:
        lines.append(luck)
    if (close := runner_up_line(r)) is not None:
        lines.append(close)
    lines.append(verification_line(r))
    lines.append(f"global batch {r.config.global_batch_size} ({r.global_batch_source})")
    if r.optimizer or r.optimizer_source:
        lines.append(f"optimizer {r.optimizer or '?'} ({r.optimizer_source})")
    if (rule := loss_rule(r)) is not None:
        lines.append(f"loss {rule}")
    if r.config.compile != "off":
        lines.append(compile_line(r))
    counts: dict[str, int] = {}
    for t in r.trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    lines.append("trials: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    lines.extend(f"excluded {line}" for line in exclusion_lines(r.exclusions))
    lines.append(f"study {r.study_name!r} stored in {mask_url(r.storage)}")
    if out:
        lines.append(f"recommended config written to {out}")
    return "\n".join(lines)


def format_costs(recommendation: Recommendation, train_samples: int, price: float | None) -> str:
    """Time (and cost) to train ``train_samples`` samples: recommended against baseline."""
    lines = [f"to train {train_samples:,} samples:"]
    for name, entry in recommendation.training_cost(train_samples, price).items():
        cost = f", cost {entry['cost']:,.2f}" if "cost" in entry else ""
        lines.append(
            f"  {name:12} {entry['hours']:,.2f} h on the devices "
            f"({entry['device_hours']:,.2f} device-hours{cost})"
        )
    return "\n".join(lines)


def memory_cell(record: TrialRecord) -> str:
    """A record's peak memory: measured, with the prediction made before it ran and its error
    beside it (no error where the trial stopped early: its peak may be partial), or marked as
    the prediction it is ('' if neither)."""
    predicted = record.predicted_memory_bytes
    if record.memory_used_bytes:
        measured = format_bytes(record.memory_used_bytes)
        miss = record.prediction_miss
        if predicted is None:
            return measured
        if miss is None:
            return f"{measured} (~{format_bytes(predicted)} predicted)"
        return f"{measured} (~{format_bytes(predicted)} predicted, {miss})"
    if predicted:
        return f"~{format_bytes(predicted)} predicted"
    return ""


def format_study(storage: str, study_name: str | None) -> str:
    """Every trial of a stored study, one line each; the storage's studies where it holds
    several and none is named."""
    import optuna

    backend, summaries = stored_studies(storage)
    if study_name is None and len(summaries) > 1:
        return f"studies in {mask_url(storage)}:\n" + "\n".join(
            f"  {s.study_name}" for s in summaries
        )
    study_name = pick_study(storage, summaries, study_name).study_name
    study = optuna.load_study(study_name=study_name, storage=backend)
    lines = [
        f"study {study_name} ({mask_url(storage)})",
        f"{'#':>4}  {'role':9}  {'status':9}  {'samples/s':>10}  {'memory':>36}  config",
    ]
    for t in stored_records(study):
        speed = format_speed(t.samples_per_s) if t.samples_per_s else "-"
        memory = memory_cell(t) or "-"
        fits = "" if t.feasible is None else (" fits" if t.feasible else " over")
        what = t.config.summary() if t.config else t.message
        lines.append(
            f"{t.number:>4}  {t.role:9}  {t.status:9}  {speed:>10}  {memory:>36}{fits}  {what}"
        )
        if t.status != "ok" and t.config and t.message:  # why: the numbers alone mislead
            lines.append(f"{'':>4}  why: {t.message}")
    for number, left in running_trials(study):
        lines.append(
            f"{number:>4}  {'':9}  {'running':9}  "
            + (
                "left by a search that stopped: the same search command runs it again"
                if left
                else "being measured by a search that is running"
            )
        )
    return "\n".join(lines)


def running_trials(study: Any) -> list[tuple[int, bool]]:
    """(number, left by a stopped search) of each trial the study holds as running."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [(t.number, abandoned(t)) for t in running]


def study_json(storage: str, study_name: str | None) -> dict[str, Any]:
    """A stored study as one object (``autotune show --json``): its trials' records, the
    trials it holds as running, and the recommendation where the search finished."""
    study, summary = load_stored_study(storage, study_name)
    recommendation = stored_recommendation(summary)
    return {
        "study": summary.study_name,
        "storage": mask_url(storage),
        "trials": [r.model_dump(mode="json") for r in stored_records(study)],
        "running": [
            {"number": number, "left_by_a_stopped_search": left}
            for number, left in running_trials(study)
        ],
        "recommendation": recommendation.model_dump(mode="json") if recommendation else None,
    }


def format_plan(plan: Plan, model: str) -> str:
    """The plan as a table, smallest predicted peak first: every number a prediction."""
    lines = [
        f"memory plan for {model} on {plan.devices} {plan.device_type} device(s), limit "
        f"{format_bytes(plan.limit_bytes)} {budget_scope(plan.device_type)}: every number below "
        "is a prediction",
        "traced under fake tensors on this machine's CPU kernels"
        + (
            ", under CUDA's autocast op lists, F.scaled_dot_product_attention as the planned "
            "GPU's kernels hold it (fused where it has one for the call, else the math path; "
            "cuBLAS workspaces and the allocator differ; on an H200, GPT-2 "
            "small's bf16 tensors lay within 5% of the allocator's peak in 11 of 12 "
            "configurations)"
            if plan.device_type == "cuda"
            else ""
        ),
        *([f"planned for: {plan.gpu}"] if plan.gpu else []),
        f"beyond the tensors: {plan.calibration}",
        *([f"optimizer whose state is counted: {plan.optimizer}"] if plan.optimizer else []),
        *([f"assumed: {plan.assumption}"] if plan.assumption else []),
        *(
            [
                f"DDP needs find_unused_parameters=True: {UNUSED_PARAMETERS} (autotune trial "
                "--find-unused-parameters; a search sets it itself)"
            ]
            if plan.needs_find_unused_parameters and plan.devices > 1
            else []
        ),
        *(f"left out: {line}" for line in plan.left_out),
        *(f"added: {line}" for line in plan.added),
    ]
    if plan.trace_error:
        lines.append(
            f"the model could not be traced under fake tensors: {plan.trace_error}; "
            "a search predicts it by a fit over measured trials instead"
        )
        return "\n".join(lines)
    lines.append(f"{'predicted peak':>15}  {'fits':4}  config")
    for row in sorted(plan.rows, key=lambda r: r.prediction.peak_bytes):
        fits = "yes" if row.fits(plan.limit_bytes) else "no"
        peak = f"~{format_bytes(row.prediction.peak_bytes)}"
        lines.append(f"{peak:>15}  {fits:4}  {row.config.summary()}")
    largest = plan.largest_micro_batches()
    if largest:
        lines.append("largest micro-batch that fits, per parallel mode and precision:")
        for (mode, precision), row in sorted(largest.items()):
            lines.append(
                f"  {mode} {precision}: micro-batch {row.config.micro_batch_size} "
                f"(~{format_bytes(row.prediction.peak_bytes)}): {row.config.summary()}"
            )
    least = plan.least_memory()
    if not plan.fitting() and least is not None:
        over = least.prediction.peak_bytes - plan.limit_bytes
        lines.append(
            f"nothing fits: the least memory is {least.config.summary()} at "
            f"~{format_bytes(least.prediction.peak_bytes)}, {format_bytes(over)} over the "
            "limit; more devices (FSDP shards the model state), a smaller global batch or "
            "devices with more memory"
        )
    if plan.beyond is not None:
        beyond = plan.beyond
        needs = beyond.prediction.peak_bytes
        verdict = (
            "fits (give a space that offers it: --space FILE)"
            if beyond.fits(plan.limit_bytes)
            else f"{format_bytes(needs - plan.limit_bytes)} over the limit too"
        )
        lines.append(
            f"beyond the space: {beyond.config.summary()} ({EVERY_BLOCK_AT_ONE}) predicted "
            f"~{format_bytes(needs)}: {verdict}"
        )
    return "\n".join(lines)

"""The recommendation in the forms trainers read: HF TrainingArguments, Lightning, Accelerate.

Each export is YAML: settings the target reads, with comments (``# note:``) for every knob the
target cannot express and what comes closest. ``notes_for`` returns the same notes, for the
terminal.
"""

from __future__ import annotations

from typing import Any

import yaml

from autotune.config import TrainConfig

_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
_HOOK_FUNCTIONS = {
    "fp16": f"{_HOOKS}.default_hooks.fp16_compress_hook",
    "bf16": f"{_HOOKS}.default_hooks.bf16_compress_hook",
    "powersgd": f"{_HOOKS}.powerSGD_hook.powerSGD_hook",
}


def _dataloader(config: TrainConfig) -> dict[str, Any]:
    values: dict[str, Any] = {
        "batch_size": config.micro_batch_size,
        "num_workers": config.num_workers,
        "pin_memory": config.pin_memory,
    }
    if config.num_workers:
        values["prefetch_factor"] = config.prefetch_factor or 2
        values["persistent_workers"] = config.persistent_workers
    return values


_ACCELERATE_HOOKS = {"fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD"}
"""Members of accelerate.utils.DDPCommunicationHookType."""


def _powersgd_state(config: TrainConfig) -> str:
    return (
        f"PowerSGDState(process_group=None, matrix_approximation_rank={config.powersgd_rank}, "
        f"start_powerSGD_iter={config.powersgd_start_iter})"
    )


def _hook_note(config: TrainConfig, where: str) -> str:
    state = _powersgd_state(config) if config.comm_hook == "powersgd" else "None"
    return (
        f"comm_hook={config.comm_hook} cannot be set in {where}; closest equivalent: after the "
        f"model is wrapped in DDP, call ddp_model.register_comm_hook({state}, "
        f"{_HOOK_FUNCTIONS[config.comm_hook]})"
        + (
            f" (powersgd_rank={config.powersgd_rank}, "
            f"powersgd_start_iter={config.powersgd_start_iter})"
            if config.comm_hook == "powersgd"
            else ""
        )
    )


def _fsdp_mp_note(config: TrainConfig) -> str:
    reduce = "torch.float32" if config.fsdp_mixed_precision == "bf16-reduce-fp32" else "None"
    return (
        f"fsdp_mixed_precision={config.fsdp_mixed_precision}: fully_shard(..., mp_policy="
        f"MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype={reduce})) on each "
        "block and the root"
    )


EXPANDABLE_NOTE = (
    "expandable_segments=true is a process setting: start training with "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment"
)

IN_BACKWARD_NOTE = (
    "optimizer_in_backward=true is set in code, no trainer has it: after building the "
    "optimizer, stepper = autotune.runner.in_backward.InBackward(optimizer) steps each "
    "parameter in backward (an optimizer per parameter, by its post-accumulate-grad hook); "
    "optimizer.step() and zero_grad() then find no gradient and change nothing (a trainer may "
    "still call them); a scheduler on optimizer still sets every parameter's rate, and "
    "optimizer.state_dict() holds every parameter's state"
)

CHANNELS_LAST_NOTE = (
    "channels_last=true is set in code: model.to(memory_format=torch.channels_last) before "
    "training, and each 4-D image batch .to(memory_format=torch.channels_last)"
)


def _optimizer_note(config: TrainConfig) -> str:
    return (
        f"optimizer_impl={config.optimizer_impl} is set where the optimizer is built: "
        f"{config.optimizer_impl}=True (e.g. torch.optim.AdamW(params, ..., "
        f"{config.optimizer_impl}=True)"
        + (
            "; Hugging Face: optim='adamw_torch_fused' for AdamW"
            if config.optimizer_impl == "fused"
            else ""
        )
        + ")"
    )


def _in_code_notes(config: TrainConfig, matmul: bool = True) -> list[str]:
    """The knobs no trainer's settings express, each as the line of code that sets it."""
    notes = []
    if matmul and config.matmul_precision != "default":
        notes.append(_matmul_note(config))
    if config.channels_last:
        notes.append(CHANNELS_LAST_NOTE)
    if config.optimizer_impl != "default":
        notes.append(_optimizer_note(config))
    if config.optimizer_in_backward:
        notes.append(IN_BACKWARD_NOTE)
    if config.expandable_segments:
        notes.append(EXPANDABLE_NOTE)
    return notes


def _matmul_note(config: TrainConfig) -> str:
    return (
        f"matmul_precision={config.matmul_precision} is a process setting: call "
        f'torch.set_float32_matmul_precision("{config.matmul_precision}") before training'
    )


def _ddp_in_code(argument: str, where: str) -> str:
    return (
        f"{argument} cannot be set in {where}; set it where the model is wrapped: "
        f"DistributedDataParallel(model, ..., {argument})"
    )


def _checkpoint_note(config: TrainConfig, where: str) -> str | None:
    if not config.checkpoint_segments:
        return None
    return (
        f"checkpoint_segments={config.checkpoint_segments} checkpoints only the first "
        f"{config.checkpoint_segments} repeated blocks; {where} checkpoints every layer "
        "(closest equivalent: more memory saved, a little slower than measured)"
    )


def _selective_note(config: TrainConfig, flag: str, looped: bool) -> str:
    return (
        "checkpoint_policy=selective (each checkpointed block keeps its matmuls', "
        f"convolutions' and attention's outputs) is applied in code: {flag} recomputes "
        f"everything and is off here; call {apply_call(config, looped)} before training, "
        "which checkpoints as the trials did"
    )


def hugging_face(
    config: TrainConfig, looped: bool = False, refused_by: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Keyword arguments for ``transformers.TrainingArguments`` and the notes on them;
    ``refused_by``: the model's class where it has no gradient checkpointing of its own
    (``checkpointing.refuses_own_checkpointing``), which the flag would make the Trainer raise."""
    kwargs: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "bf16": config.amp == "bf16",
        "fp16": config.amp == "fp16",
        "gradient_checkpointing": config.checkpoint_segments > 0,
        "dataloader_num_workers": config.num_workers,
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers,
    }
    if config.num_workers:
        kwargs["dataloader_prefetch_factor"] = config.prefetch_factor or 2
    if config.device == "cpu":
        kwargs["use_cpu"] = True
    notes = []
    if config.parallel == "fsdp":
        strategy = "full_shard" if config.reshard_after_forward else "shard_grad_op"
        offload = " offload" if config.fsdp_cpu_offload else ""
        kwargs["fsdp"] = f"{strategy} auto_wrap{offload}"
        notes.append(f"parallel=fsdp maps to the Trainer's FSDP {strategy} with auto-wrap")
    if config.fsdp_mixed_precision != "off":
        kwargs["bf16"] = True  # the Trainer's FSDP casts as its mixed-precision policy
        notes.append(_fsdp_mp_note(config))
    if config.parallel in ("ddp", "fsdp"):
        notes.append(f"launch with torchrun --nproc-per-node={config.world_size}")
    if config.parallel == "dp":
        notes.append(
            f"run in one process on {config.world_size} GPUs: the Trainer then uses "
            "DataParallel, as measured"
        )
    if config.comm_hook != "none":
        notes.append(_hook_note(config, "TrainingArguments"))
    if config.static_graph:
        notes.append(
            "static_graph=true cannot be set in TrainingArguments; closest: "
            "ddp_find_unused_parameters=False"
        )
        kwargs["ddp_find_unused_parameters"] = False
    if config.find_unused_parameters:
        kwargs["ddp_find_unused_parameters"] = True
    if config.bucket_cap_mb != 25:
        kwargs["ddp_bucket_cap_mb"] = config.bucket_cap_mb
    if config.max_grad_norm is not None:
        kwargs["max_grad_norm"] = config.max_grad_norm
    elif config.optimizer_in_backward:
        kwargs["max_grad_norm"] = 0.0
        notes.append(
            "max_grad_norm=0.0: the Trainer's clipping off, as in the trials (stepped in "
            "backward, no gradient is left to clip)"
        )
        notes.append(
            "optimizer_in_backward=true: pass the optimizer to the Trainer "
            "(optimizers=(optimizer, scheduler)) after InBackward(optimizer) took it"
        )
    else:
        notes.append(
            "the trials clipped no gradients; the Trainer clips at max_grad_norm=1.0 unless "
            "told otherwise (give --max-grad-norm to measure yours)"
        )
    if config.matmul_precision != "default":
        kwargs["tf32"] = config.matmul_precision == "high"
    if config.gradient_as_bucket_view:
        notes.append(_ddp_in_code("gradient_as_bucket_view=True", "TrainingArguments"))
    if config.compile != "off":
        kwargs["torch_compile"] = True
        if config.compile != "default":
            kwargs["torch_compile_mode"] = config.compile
    note = _checkpoint_note(config, "gradient_checkpointing")
    if refused_by and config.checkpoint_segments:
        kwargs["gradient_checkpointing"] = False
        notes.append(
            f"{refused_by} refuses the Trainer's gradient_checkpointing ('does not support "
            f"activation checkpointing'): it is false here; call {apply_call(config, looped)} "
            "before the Trainer, which checkpoints as the trials did"
        )
    elif config.checkpoint_policy == "selective":
        kwargs["gradient_checkpointing"] = False
        notes.append(_selective_note(config, "the Trainer's gradient_checkpointing", looped))
    elif note:
        notes.append(note)
    if looped and config.checkpoint_segments and not refused_by:
        notes.append(
            "the model loops over one layer (its checkpointing measured call by call); where "
            "its class refuses gradient_checkpointing (ALBERT's: 'does not support activation "
            f"checkpointing'), set it false and call {apply_call(config, looped)} before the "
            "Trainer"
        )
    notes += _in_code_notes(config, matmul=False)  # tf32 above says the matmul precision
    return kwargs, notes


def _lightning_strategy(config: TrainConfig) -> Any:
    if config.parallel == "fsdp":
        fsdp: dict[str, Any] = {}
        if not config.reshard_after_forward:
            fsdp["sharding_strategy"] = "SHARD_GRAD_OP"
        if config.fsdp_cpu_offload:
            fsdp["cpu_offload"] = True
        if not fsdp:
            return "fsdp"
        return {"class_path": "lightning.pytorch.strategies.FSDPStrategy", "init_args": fsdp}
    if config.parallel != "ddp":
        return "auto"
    init: dict[str, Any] = {}
    if config.comm_hook != "none":
        init["ddp_comm_hook"] = _HOOK_FUNCTIONS[config.comm_hook]
    if config.comm_hook == "powersgd":
        init["ddp_comm_state"] = {
            "class_path": f"{_HOOKS}.powerSGD_hook.PowerSGDState",
            "init_args": {
                "process_group": None,
                "matrix_approximation_rank": config.powersgd_rank,
                "start_powerSGD_iter": config.powersgd_start_iter,
            },
        }
    if config.static_graph:
        init["static_graph"] = True
    if config.find_unused_parameters:
        init["find_unused_parameters"] = True
    if config.bucket_cap_mb != 25:
        init["bucket_cap_mb"] = config.bucket_cap_mb
    if config.gradient_as_bucket_view:
        init["gradient_as_bucket_view"] = True
    if not init:
        return "ddp"
    return {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": init}


def apply_call(config: TrainConfig, looped: bool = False) -> str:
    """The call that checkpoints as the trials did: a looped layer's calls need a batch to be
    counted (``training.loop_calls``)."""
    calls = ", autotune.runner.training.loop_calls(model, batch)" if looped else ""
    policy = "" if config.checkpoint_policy == "full" else f', policy="{config.checkpoint_policy}"'
    return (
        "autotune.runner.checkpointing.apply_checkpointing("
        f"model, {config.checkpoint_segments}{calls}{policy})"
    )


def lightning(config: TrainConfig, looped: bool = False) -> tuple[dict[str, Any], list[str]]:
    """``trainer`` arguments (LightningCLI form) and ``dataloader`` arguments, with notes."""
    precision = {"off": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}[config.amp]
    trainer: dict[str, Any] = {
        "accelerator": "cpu" if config.device == "cpu" else "gpu",
        "devices": config.world_size,
        "strategy": _lightning_strategy(config),
        "precision": precision,
        "accumulate_grad_batches": config.grad_accum_steps,
    }
    if config.max_grad_norm is not None:
        trainer["gradient_clip_val"] = config.max_grad_norm  # by norm, Lightning's default
    notes = []
    if config.parallel == "dp":
        notes.append("Lightning has no DataParallel strategy any more; closest: strategy ddp")
        trainer["strategy"] = "ddp"
    if config.amp == "fp16" and config.device == "cpu":
        notes.append(
            "Lightning does not run fp16 AMP on CPU (it would switch silently); "
            "closest: precision bf16-mixed"
        )
        trainer["precision"] = "bf16-mixed"
    if config.parallel == "fsdp" and config.device == "cpu":
        notes.append(
            "Lightning runs FSDP on GPUs only; closest on CPU: strategy ddp (no "
            "sharding: more memory per rank than measured)"
        )
        trainer["strategy"] = "ddp"
    notes += _in_code_notes(config)
    if config.fsdp_mixed_precision != "off":
        trainer["precision"] = "bf16-mixed"
        notes.append(_fsdp_mp_note(config))
    if config.checkpoint_segments:
        notes.append(
            f"checkpoint_segments={config.checkpoint_segments}: Lightning has no Trainer flag "
            f"for activation checkpointing; closest: call {apply_call(config, looped)} in "
            "configure_model()"
        )
    if config.compile != "off":
        mode = "" if config.compile == "default" else f', mode="{config.compile}"'
        notes.append(
            f"compile={config.compile} has no Trainer flag; in code: "
            f"trainer.fit(torch.compile(model{mode})); the trials compiled the model after its "
            "DDP/FSDP wrap"
        )
    return {"trainer": trainer, "dataloader": _dataloader(config)}, notes


def accelerate(
    config: TrainConfig, block_class: str | None = None, looped: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """An ``accelerate launch --config_file`` configuration and the notes on it."""
    distributed = {"single": "NO", "dp": "NO", "ddp": "MULTI_GPU", "fsdp": "FSDP"}[config.parallel]
    if config.device == "cpu" and config.parallel == "ddp":
        distributed = "MULTI_CPU"
    values: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": config.processes,
        "mixed_precision": {"off": "no", "fp16": "fp16", "bf16": "bf16"}[config.amp],
        "use_cpu": config.device == "cpu",
        "main_training_function": "main",
    }
    notes = [
        f"gradient accumulation is set in code: Accelerator(gradient_accumulation_steps="
        f"{config.grad_accum_steps}), batch size {config.micro_batch_size} per process",
        "DataLoader settings are yours to pass: "
        + ", ".join(f"{k}={v}" for k, v in _dataloader(config).items()),
    ]
    if config.fsdp_mixed_precision != "off":
        values["mixed_precision"] = "bf16"
        notes.append(_fsdp_mp_note(config))
    if config.parallel == "fsdp":
        values["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": config.reshard_after_forward,
            "fsdp_offload_params": config.fsdp_cpu_offload,
            "fsdp_activation_checkpointing": config.checkpoint_segments > 0
            and config.checkpoint_policy == "full",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            **({"fsdp_transformer_layer_cls_to_wrap": block_class} if block_class else {}),
        }
    if config.compile != "off":
        values["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": config.compile,
            "dynamo_use_fullgraph": False,
            "dynamo_use_dynamic": False,
        }
    notes += _in_code_notes(config)
    if config.max_grad_norm is not None:
        notes.append(
            f"max_grad_norm={config.max_grad_norm:g} is applied in code: "
            f"accelerator.clip_grad_norm_(model.parameters(), {config.max_grad_norm:g}) "
            "before optimizer.step(), when accelerator.sync_gradients"
        )
    if config.parallel == "fsdp" and config.checkpoint_policy == "selective":
        notes.append(_selective_note(config, "fsdp_activation_checkpointing", looped))
    elif config.parallel != "fsdp" and config.checkpoint_segments:
        notes.append(
            f"checkpoint_segments={config.checkpoint_segments} is applied in code: "
            f"{apply_call(config, looped)}"
        )
    ddp_kwargs = []
    if config.comm_hook != "none":
        ddp_kwargs.append(
            f"comm_hook=DDPCommunicationHookType.{_ACCELERATE_HOOKS[config.comm_hook]}"
        )
    if config.comm_hook == "powersgd":
        ddp_kwargs.append(
            f'comm_state_option={{"matrix_approximation_rank": {config.powersgd_rank}, '
            f'"start_powerSGD_iter": {config.powersgd_start_iter}}}'
        )
    if config.static_graph:
        ddp_kwargs.append("static_graph=True")
    if config.find_unused_parameters:
        ddp_kwargs.append("find_unused_parameters=True")
    if config.bucket_cap_mb != 25:
        ddp_kwargs.append(f"bucket_cap_mb={config.bucket_cap_mb}")
    if config.gradient_as_bucket_view:
        ddp_kwargs.append("gradient_as_bucket_view=True")
    if ddp_kwargs:
        knobs = [f"comm_hook={config.comm_hook}"] if config.comm_hook != "none" else []
        if config.comm_hook == "powersgd":
            knobs += [
                f"powersgd_rank={config.powersgd_rank}",
                f"powersgd_start_iter={config.powersgd_start_iter}",
            ]
        knobs += ["static_graph=true"] if config.static_graph else []
        knobs += ["find_unused_parameters=true"] if config.find_unused_parameters else []
        knobs += [f"bucket_cap_mb={config.bucket_cap_mb}"] if config.bucket_cap_mb != 25 else []
        knobs += ["gradient_as_bucket_view=true"] if config.gradient_as_bucket_view else []
        notes.append(
            f"{', '.join(knobs)} cannot be set in an Accelerate config file; set in code: "
            "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
            + ", ".join(ddp_kwargs)
            + ")])"
        )
    return values, notes


def render_yaml(data: dict[str, Any], notes: list[str], title: str) -> str:
    lines = [f"# {title}"] + [f"# note: {n}" for n in notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(data, sort_keys=False)

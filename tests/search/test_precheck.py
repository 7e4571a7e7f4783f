from __future__ import annotations

from autotune.config import make_config
from autotune.search.precheck import Observation, precheck

MiB = 1 << 20


def _config(accum: int, ckpt: int = 0, workers: int = 0, policy: str = "full"):
    return make_config(
        {
            "checkpoint_policy": policy,
            "global_batch_size": 64,
            "parallel": "ddp",
            "world_size": 2,
            "grad_accum_steps": accum,
            "checkpoint_segments": ckpt,
            "num_workers": workers,
            "device": "cpu",
        }
    )


def test_configs_hungrier_than_an_oom_are_skipped() -> None:
    history = [Observation(_config(accum=2), None, 3)]  # micro-batch 16 ran out
    verdict = precheck(_config(accum=1), history, 1000 * MiB)  # micro-batch 32
    assert verdict is not None and "trial 3, which ran out of memory" in verdict[0]
    assert precheck(_config(accum=4), history, 1000 * MiB) is None  # smaller: try it
    assert precheck(_config(accum=2, ckpt=2), history, 1000 * MiB) is None  # checkpointed


def test_a_trend_in_micro_batch_predicts_what_will_not_fit() -> None:
    history = [
        Observation(_config(accum=8), 300 * MiB, 1),  # micro-batch 4
        Observation(_config(accum=4), 500 * MiB, 2),  # micro-batch 8
    ]
    verdict = precheck(_config(accum=1), history, 1000 * MiB)  # predicts 1700 MiB at 32
    assert verdict is not None and "predicted peak 1700 MiB" in verdict[0]
    assert precheck(_config(accum=2), history, 1000 * MiB) is None  # predicts 900 MiB at 16


def test_a_knob_that_moves_memory_either_way_is_never_judged_by_dominance() -> None:
    fsdp = {"global_batch_size": 64, "parallel": "fsdp", "world_size": 2, "device": "cuda"}
    ran_out = make_config(fsdp)
    history = [Observation(ran_out, None, 1)]
    for knob in ("fsdp_cpu_offload", "fsdp_mixed_precision", "optimizer_impl", "compile"):
        moved = {"fsdp_cpu_offload": True, "fsdp_mixed_precision": "bf16",
                 "optimizer_impl": "foreach", "compile": "default"}[knob]  # fmt: skip
        assert precheck(make_config({**fsdp, knob: moved}), history, 1000 * MiB) is None, knob
    assert precheck(make_config(fsdp), history, 1000 * MiB) is not None


def test_selective_checkpointing_keeps_at_least_what_full_checkpointing_of_as_many_keeps() -> None:
    full = [Observation(_config(accum=2, ckpt=2), None, 1)]  # 2 blocks fully checkpointed: out
    for hungrier in (
        _config(2, ckpt=2, policy="selective"),
        _config(2, ckpt=1, policy="selective"),
    ):
        verdict = precheck(hungrier, full, 1000 * MiB)
        assert verdict is not None and "trial 1" in verdict[0]
    selective = [Observation(_config(accum=2, ckpt=2, policy="selective"), None, 4)]
    assert precheck(_config(2, ckpt=2), selective, 1000 * MiB) is None  # keeps less: try it
    assert precheck(_config(2, ckpt=1), selective, 1000 * MiB) is None  # not known either way
    assert precheck(_config(2, ckpt=0), selective, 1000 * MiB) is not None  # keeps everything


def test_a_step_in_backward_that_ran_out_rules_out_the_same_step_after_backward() -> None:
    single = {"global_batch_size": 64, "parallel": "single", "device": "cpu"}
    in_backward = make_config({**single, "optimizer_in_backward": True})
    after = make_config(single)
    verdict = precheck(after, [Observation(in_backward, None, 2)], 1000 * MiB)
    assert verdict is not None and "trial 2" in verdict[0]  # holds every gradient too
    assert precheck(in_backward, [Observation(after, None, 2)], 1000 * MiB) is None  # holds less

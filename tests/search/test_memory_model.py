"""The memory model's arithmetic: parallel modes, calibration, its error, interpolation."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.config import TrainConfig
from autotune.runner.fake_memory import TensorPeak
from autotune.runner.workload import WorkloadSpec
from autotune.search.calibration import (
    CPU_FORKED_SHARE,
    CPU_HEAP_SHARE,
    CUDA_PRIOR_MARGIN,
    MIN_MARGIN,
    PRIOR_MARGIN,
    Calibration,
    Point,
    fit,
    prior_for,
)
from autotune.search.memory_model import MemoryModel, device_parts

MiB = 2**20
PEAK = TensorPeak(
    total_bytes=1000 * MiB,
    parameters_bytes=100 * MiB,
    gradients_bytes=100 * MiB,
    optimizer_bytes=200 * MiB,
    block_parameters_bytes=10 * MiB,
    outside_blocks_bytes=20 * MiB,
    gradient_bytes_full=100 * MiB,
)


def _config(**values: object) -> TrainConfig:
    return TrainConfig(global_batch_size=16, device="cpu", **values)  # type: ignore[arg-type]


def test_ddp_adds_a_copy_of_the_gradients_and_powersgd_another() -> None:
    single = sum(device_parts(PEAK, _config()).values())
    ddp = device_parts(PEAK, _config(parallel="ddp", world_size=2))
    assert single == PEAK.total_bytes
    assert sum(ddp.values()) == single + 100 * MiB
    powersgd = device_parts(PEAK, _config(parallel="ddp", world_size=2, comm_hook="powersgd"))
    assert sum(powersgd.values()) == single + 200 * MiB
    fp16 = device_parts(PEAK, _config(parallel="ddp", world_size=2, comm_hook="fp16"))
    assert sum(fp16.values()) == single + 100 * MiB + 12.5 * MiB  # one 25 MB bucket, halved
    views = _config(parallel="ddp", world_size=2, gradient_as_bucket_view=True, bucket_cap_mb=10)
    assert sum(device_parts(PEAK, views).values()) == single  # the buckets are the gradients
    hooked = views.model_copy(update={"comm_hook": "fp16"})
    assert sum(device_parts(PEAK, hooked).values()) == single + 5 * MiB  # a 10 MB bucket


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_fsdp_shards_the_model_state_and_gathers_the_root_and_a_few_blocks(shards: int) -> None:
    parts = device_parts(PEAK, _config(parallel="fsdp", world_size=shards))
    state = 400 * MiB
    gathered = 20 * MiB + 3 * 10 * MiB  # whole copies: the root, two blocks, one's gradients
    assert sum(parts.values()) == 600 * MiB + state // shards + gathered
    assert parts["activations"] == 600 * MiB  # the batch's share is not sharded


def test_offloaded_fsdp_shards_leave_a_cuda_device_but_not_a_cpu_host() -> None:
    values = {"parallel": "fsdp", "world_size": 2, "fsdp_cpu_offload": True}
    on_cpu = device_parts(PEAK, _config(**values))
    assert on_cpu == device_parts(PEAK, _config(**{**values, "fsdp_cpu_offload": False}))
    cuda = TrainConfig(global_batch_size=16, device="cuda", **values)  # type: ignore[arg-type]
    parts = device_parts(PEAK, cuda)
    assert parts["parameters"] == parts["gradients"] == parts["optimizer state"] == 0
    assert sum(on_cpu.values()) - sum(parts.values()) == 400 * MiB // 2  # the state's shard
    assert parts["fsdp gathered"] == on_cpu["fsdp gathered"]  # computed on the device still


def test_a_fit_recovers_scale_offset_and_workers_and_measures_its_error() -> None:
    truth = Calibration(scale=1.4, offset_bytes=300 * MiB, per_worker_bytes=40 * MiB)
    points = [
        Point(t * MiB, w, truth.apply(t * MiB, w))
        for t, w in [(100, 0), (400, 0), (900, 0), (400, 2), (100, 4)]
    ]
    fitted = fit(points, Calibration())
    assert fitted.scale == pytest.approx(1.4, rel=0.02)
    assert fitted.offset_bytes == pytest.approx(300 * MiB, rel=0.03)
    assert fitted.per_worker_bytes == pytest.approx(40 * MiB, rel=0.05)
    assert fitted.trials == 5 and max(abs(e) for e in fitted.errors) < 0.01
    assert fitted.margin == MIN_MARGIN  # exact points: the floor


def test_compiled_trials_teach_what_compiling_adds_and_eager_ones_are_not_charged_it() -> None:
    # A search of a Hugging Face Mamba: compiled ranks held ~145 MiB more than eager ones, and
    # one fit over both predicted the eager trials 24% high (22 of 27 within 10%; now 27).
    truth = Calibration(scale=1.2, offset_bytes=400 * MiB, compile_bytes=150 * MiB)
    runs = [(100, False), (300, False), (100, True), (300, True), (200, True)]
    points = [Point(t * MiB, 0, truth.apply(t * MiB, 0, 0, c), 0, c) for t, c in runs]
    fitted = fit(points, Calibration())
    assert fitted.compiled_trials == 3 and "+ 150 MiB compiled" in fitted.describe()
    assert fitted.compile_bytes == pytest.approx(150 * MiB, rel=0.03)
    assert max(abs(e) for e in fitted.errors) < 0.01
    eager = fit([p for p in points if not p.compiled], Calibration())
    assert eager.compile_bytes == 0 and eager.compiled_trials == 0  # nothing to learn it from
    assert "compiled" not in eager.describe()


def test_one_point_sets_the_offset_and_the_margin_stays_wide_until_errors_are_measured() -> None:
    prior = Calibration(offset_bytes=200 * MiB)
    one = fit([Point(100 * MiB, 0, 500 * MiB)], prior)
    assert one.apply(100 * MiB, 0) == pytest.approx(500 * MiB, rel=0.01)
    assert one.margin == PRIOR_MARGIN[1] and prior.margin == PRIOR_MARGIN[0]
    on_cuda = fit([Point(100 * MiB, 0, 500 * MiB)], prior_for("cuda"))
    assert on_cuda.margin == CUDA_PRIOR_MARGIN[1] > PRIOR_MARGIN[1]  # not measured there yet
    noisy = fit(
        [
            Point(100 * MiB, 0, 500 * MiB),
            Point(200 * MiB, 0, 900 * MiB),
            Point(300 * MiB, 0, 650 * MiB),
        ],
        prior,
    )
    assert noisy.margin > 0.2  # the leave-one-out errors of scattered points are large
    assert noisy.margin == max(-e for e in noisy.errors)


def test_the_cpu_prior_holds_the_heaps_share_and_one_trial_sets_the_level() -> None:
    # Before any trial a CPU rank is taken as x1.1 its tensors plus its process; one trial sets
    # the level, and the slope it extrapolates with stays near the prior's 1.1.
    prior = Calibration(scale=1 + CPU_HEAP_SHARE, offset_bytes=200 * MiB)
    assert prior.apply(1000 * MiB, 0) == int((1 + CPU_HEAP_SHARE) * 1000 * MiB + 200 * MiB)
    assert "x1.10 the tensors + 200 MiB" in prior.describe()
    one = fit([Point(1000 * MiB, 0, 1500 * MiB)], prior)
    assert one.scale == pytest.approx(1 + CPU_HEAP_SHARE, abs=0.01)
    assert one.apply(1000 * MiB, 0) == pytest.approx(1500 * MiB, rel=0.01)
    assert one.apply(2000 * MiB, 0) == pytest.approx(2600 * MiB, rel=0.01)


def test_the_margin_to_skip_counts_only_predictions_above_the_truth() -> None:
    # Predicting low never skips a configuration that fits (it runs, and shows its peak): only
    # how far predictions lay above what was measured widens the margin.
    low = Calibration(trials=3, errors=(0.30, 0.05, 0.20))
    high = Calibration(trials=3, errors=(0.30, -0.18, 0.20))
    assert low.margin == MIN_MARGIN and high.margin == pytest.approx(0.18)
    assert "error up to 30%, at most 18% high" in high.describe()


def test_a_compiled_configuration_keeps_the_first_guesss_margin_until_a_compiled_trial() -> None:
    # Its prediction is the eager one until a compiled trial measures what compiling changes
    # (on an H200, 36% less): eager trials' narrow margin would skip compiled ones that fit.
    eager = Calibration(trials=3, errors=(0.02, -0.03, 0.01))
    compiled = Calibration(trials=3, errors=(0.02, -0.03, 0.01), compiled_trials=1)
    plain = TrainConfig(global_batch_size=8, device="cuda")
    fused = plain.model_copy(update={"compile": "default"})
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    before = MemoryModel(spec, "cuda", prior_for("cuda"), calibration=eager)
    after = MemoryModel(spec, "cuda", prior_for("cuda"), calibration=compiled)
    assert before.margin_for(plain) == MIN_MARGIN == after.margin_for(fused)
    assert before.margin_for(fused) == CUDA_PRIOR_MARGIN[0]


def test_interpolation_is_exact_for_a_bilinear_peak() -> None:
    def peak(micro_batch: int, segments: int) -> TensorPeak:
        activations = micro_batch * (64 - 6 * segments) * MiB + 5 * MiB
        return TensorPeak(activations + 400 * MiB, 100 * MiB, 100 * MiB, 200 * MiB, 0, 0, 0)

    model = MemoryModel(WorkloadSpec(model="tests.fixtures.models:Small"), "cuda")
    configs = [
        _config(grad_accum_steps=a, checkpoint_segments=k) for a in (1, 2, 4) for k in (0, 1, 2)
    ]
    model.interpolate_between(configs)
    for mb in (4, 16):
        for k in (0, 2):
            model.steps.held[(mb, "fp32", k, "default", 1, "full", False)] = peak(mb, k)
    for config in configs:
        got = model.tensor_peak(config)
        assert got == peak(config.micro_batch_size, config.checkpoint_segments)
    prediction = model.predict(_config(grad_accum_steps=2, checkpoint_segments=1))
    assert prediction is not None and "interpolated" in prediction.source


@pytest.mark.parametrize("segments", [(0,), (0, 2)])
def test_interpolation_along_one_axis_when_the_table_has_one_checkpointing(
    segments: tuple[int, ...],
) -> None:
    # One checkpointing value (or one micro-batch) makes two corners one: their weights add up.
    def peak(micro_batch: int, k: int) -> TensorPeak:
        return TensorPeak((micro_batch * 10 - k) * MiB + 400 * MiB, 100 * MiB, 100 * MiB,
                          200 * MiB, 0, 0, 0)  # fmt: skip

    model = MemoryModel(WorkloadSpec(model="tests.fixtures.models:Small"), "cuda")
    configs = [_config(grad_accum_steps=a, checkpoint_segments=k) for a in (1, 4) for k in segments]
    model.interpolate_between(configs)
    for mb in (4, 16):
        for k in segments:
            model.steps.held[(mb, "fp32", k, "default", 1, "full", False)] = peak(mb, k)
    middle = _config(grad_accum_steps=2, checkpoint_segments=segments[-1])  # micro-batch 8
    assert model.tensor_peak(middle) == peak(8, segments[-1])


def test_accumulation_adds_the_gradients_the_traced_peak_did_not_hold() -> None:
    # PEAK holds every gradient at its peak (the optimizer step): nothing to add
    assert "accumulated gradients" not in device_parts(PEAK, _config())
    assert device_parts(PEAK, _config(grad_accum_steps=2))["accumulated gradients"] == 0
    # a peak in backward, before any gradient existed: the earlier micro-steps' are added
    backward = TensorPeak(1000 * MiB, 100 * MiB, 0, 200 * MiB, 10 * MiB, 20 * MiB, 100 * MiB,
                          backward_bytes=1000 * MiB, backward_gradients_bytes=0)  # fmt: skip
    for values in ({}, {"parallel": "ddp", "world_size": 2}):
        parts = device_parts(backward, _config(grad_accum_steps=4, **values))
        assert parts["accumulated gradients"] == 100 * MiB


def test_a_routed_models_cpu_autocast_peak_is_said_to_be_a_lower_bound() -> None:
    # oneDNN compiles and caches a kernel per shape under CPU autocast; routing brings new
    # shapes every step, so a long run holds more than a trial measured.
    routed = MemoryModel(WorkloadSpec(model="tests.fixtures.traced:Routed"), "cpu")
    bf16 = TrainConfig(global_batch_size=64, amp="bf16", device="cpu")
    fp32 = TrainConfig(global_batch_size=64, device="cpu")
    assert routed.predict(bf16) is not None and routed.predict(fp32) is not None
    assert "lower bound for a long run" in routed.caveats(bf16)[0]
    assert routed.caveats(fp32) == []
    dense = MemoryModel(WorkloadSpec(model="tests.fixtures.traced:Stack"), "cpu")
    assert dense.predict(bf16) is not None and dense.caveats(bf16) == []
    # so do lengths read from the batch (a packed BiLSTM tagger's bf16 trial: 1,130 MiB on a
    # fresh gang, 1,563-1,599 after other bf16 trials in it)
    packed = MemoryModel(WorkloadSpec(model="tests.fixtures.packed:PackedTagger"), "cpu")
    small = TrainConfig(global_batch_size=8, amp="bf16", device="cpu")
    assert packed.predict(small) is not None and packed.sampled
    assert "lower bound for a long run" in packed.caveats(small)[0]
    # and so do batches whose shapes the samples decide: a graph batch's nodes (a graph
    # network's bf16 DDP trials on CPU measured 1,578-1,656 MiB against 1,004-1,088 in fp32);
    # a collate function whose batches keep one shape does not
    graph = MemoryModel(WorkloadSpec(model="tests.fixtures.graph_objects:Classifier"), "cpu")
    assert graph.predict(small) is not None and graph.varying and not graph.sampled
    assert "a graph batch's nodes" in graph.caveats(small)[0]
    encoded = MemoryModel(WorkloadSpec(model="tests.fixtures.encodings:Classifier"), "cpu")
    assert encoded.predict(small) is not None and encoded.caveats(small) == []
    on_cuda = MemoryModel(WorkloadSpec(model="tests.fixtures.traced:Routed"), "cuda")
    cuda = TrainConfig(global_batch_size=64, amp="bf16", device="cuda")
    assert on_cuda.predict(cuda) is not None and on_cuda.caveats(cuda) == []


def test_a_cpu_search_that_compiles_starts_from_a_measured_compile_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A memory-bound search of a small GPT: its first compiled trial (the standard recipe) was
    # predicted as eager, 28-41% under what it measured, and ran over the budget.
    from autotune.runner import memory

    monkeypatch.setattr(memory, "bare_rank_bytes", lambda *args: 300 * MiB)
    monkeypatch.setattr(memory, "compile_share_bytes", lambda *args: 50 * MiB)
    monkeypatch.setattr(memory, "worker_share_bytes", lambda *args: 0)
    monkeypatch.setattr(memory, "epoch_copy", lambda *args: (0, True))
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    prior = prior_for("cpu", spec, (), compiled=True)
    assert prior.compile_bytes == 50 * MiB and prior_for("cpu", spec).compile_bytes == 0
    assert "+ 50 MiB compiled, measured on a small model" in prior.describe()
    assert prior_for("cuda", spec, (), compiled=True).compile_bytes == 0  # may hold less there
    model = MemoryModel(spec, "cpu", prior)
    model.steps.held[(16, "fp32", 0, "default", 1, "full", False)] = PEAK
    eager, compiled = _config(), _config(compile="default")
    first = model.predict(compiled)
    plain = model.predict(eager)
    assert first is not None and plain is not None
    assert first.peak_bytes - plain.peak_bytes == 50 * MiB
    assert "compiling added to a small model's rank here (50 MiB, measured" in first.source
    # eager trials alone keep it: nothing in them tells it apart
    model.calibration = fit([Point(1000 * MiB, 0, 1500 * MiB)], prior)
    assert model.calibration.compile_bytes == pytest.approx(50 * MiB, rel=0.01)


def test_a_cpu_prior_charges_workers_their_own_pages_and_what_their_rank_forked_them_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The standard recipe takes DataLoader workers: before any trial with workers, they were
    # predicted at 0 MiB, where one worker of gpt_small (fp32, one rank) added 567 MiB: the
    # old copies of every page its rank wrote after forking it at an epoch's start.
    from autotune.runner import memory

    monkeypatch.setattr(memory, "bare_rank_bytes", lambda *args: 300 * MiB)
    monkeypatch.setattr(memory, "worker_share_bytes", lambda *args: 12 * MiB)
    monkeypatch.setattr(memory, "epoch_copy", lambda *args: (0, True))
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    prior = prior_for("cpu", spec)
    assert prior.per_worker_bytes == 12 * MiB and prior.forked_scale == CPU_FORKED_SHARE
    assert "+ 12 MiB per DataLoader worker, measured beside it" in prior.describe()
    cuda = prior_for("cuda", spec)
    assert cuda.per_worker_bytes == 0 and cuda.forked_scale == 0  # no device memory
    model = MemoryModel(spec, "cpu", prior)
    model.steps.held[(16, "fp32", 0, "default", 1, "full", False)] = PEAK
    none = model.predict(_config())
    two = model.predict(_config(num_workers=2))
    kept = model.predict(_config(num_workers=2, persistent_workers=True))
    assert none is not None and two is not None and kept is not None
    tensors = sum(device_parts(PEAK, _config()).values())
    expected = 24 * MiB + CPU_FORKED_SHARE * tensors  # forked again at every epoch
    assert two.peak_bytes - none.peak_bytes == pytest.approx(expected, abs=2)
    assert two.parts["workers"] == pytest.approx(expected, abs=2)
    # persistent workers are forked once, before the first step: the parameters alone
    expected = 24 * MiB + CPU_FORKED_SHARE * PEAK.parameters_bytes
    assert kept.peak_bytes - none.peak_bytes == pytest.approx(expected, abs=2)
    assert model.forked(_config()) == 0 and MemoryModel(spec, "cuda").forked(_config()) == 0


def test_trials_with_workers_teach_the_share_their_rank_forked_them_from() -> None:
    truth = Calibration(scale=1.1, offset_bytes=300 * MiB, per_worker_bytes=10 * MiB,
                        forked_scale=1.1)  # fmt: skip
    prior = Calibration(scale=1.1, offset_bytes=300 * MiB, per_worker_bytes=10 * MiB,
                        forked_scale=0.5)  # fmt: skip
    points = [
        Point(t * MiB, w, truth.apply(t * MiB, w, forked_bytes=f * MiB), forked_bytes=f * MiB)
        for t, w, f in ((100, 0, 0), (400, 0, 0), (100, 1, 100), (400, 2, 400), (400, 1, 20))
    ]
    fitted = fit(points, prior)
    assert fitted.forked_scale == pytest.approx(1.1, abs=0.05)
    assert all(abs(e) < 0.02 for e in fitted.errors)


def test_a_dataset_of_python_objects_is_said_to_be_copied_by_each_worker_over_an_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker reading 1,000,000 strings copied 122 MiB of its rank's pages over an epoch
    # (their reference counts), 18 MiB after three batches: no trial shows it.
    from autotune.runner import memory

    monkeypatch.setattr(memory, "bare_rank_bytes", lambda *args: 300 * MiB)
    monkeypatch.setattr(memory, "worker_share_bytes", lambda *args: 10 * MiB)
    spec = WorkloadSpec(model="tests.fixtures.models:Small")
    for copied, whole, about in ((290 * MiB, True, "about"), (290 * MiB, False, "at least")):
        monkeypatch.setattr(memory, "epoch_copy", lambda *args, c=copied, w=whole: (c, w))
        model = MemoryModel(spec, "cpu", prior_for("cpu", spec))
        (said,) = model.caveats(_config(num_workers=2))
        assert f"over an epoch {about} 290 MiB a worker, 580 MiB for 2, beyond the measured" in said
        assert model.caveats(_config()) == []  # no worker copies anything
        assert (
            MemoryModel(spec, "cuda", prior_for("cuda", spec)).caveats(_config(num_workers=2)) == []
        )  # host memory: not what a GPU's budget holds
    monkeypatch.setattr(memory, "epoch_copy", lambda *args: (8 * MiB, True))
    model = MemoryModel(spec, "cpu", prior_for("cpu", spec))
    assert model.caveats(_config(num_workers=2)) == []  # too little to say


def test_a_search_that_fits_nowhere_says_what_every_block_at_micro_batch_1_would_take() -> None:
    # plan says it on its "beyond the space" line; a search over the same narrow space (no
    # checkpointing offered) said only to raise the budget or allow checkpoint_segments.
    from types import SimpleNamespace

    from autotune.search.finishing import Finishing
    from autotune.search.settings import SearchSettings

    model = MemoryModel(WorkloadSpec(model="workloads.gpt:gpt_tiny"), "cuda", prior_for("cuda"))
    least = TrainConfig(global_batch_size=64, device="cuda")

    def finishing(limit_bytes: int, choices: dict[str, list[object]]) -> Any:
        gate = SimpleNamespace(
            model=model,
            predict=model.predict,
            fits=lambda p: p.peak_bytes <= limit_bytes,
        )
        return SimpleNamespace(gate=gate, choices=choices, settings=SearchSettings())

    narrow = {"checkpoint_segments": [0], "grad_accum_steps": [1, 2]}
    said = Finishing._beyond(finishing(100 * 2**20, narrow), least)  # type: ignore[arg-type]
    assert said.startswith(
        "; beyond the space, singlex1 amp=off ckpt=4 accum=64 mbs=1 workers=0 (its blocks "
        "checkpointed, micro-batch 1) is predicted ~"
    )
    assert said.endswith("within the limit: a space that offers it would run it")
    tight = Finishing._beyond(finishing(2**20, narrow), least)  # type: ignore[arg-type]
    assert "over the limit too (a budget of" in tight
    offered = {"checkpoint_segments": [0, 4], "grad_accum_steps": [1, 64]}  # tried already
    assert Finishing._beyond(finishing(100 * 2**20, offered), least) == ""  # type: ignore[arg-type]

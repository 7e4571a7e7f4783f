"""The climb: one-knob moves from the fastest configurations, most promising first."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.result import TrialResult
from autotune.search.climb import Seen, moves, next_move
from autotune.search.space import parse_space
from tests.search.fakes import FakeExecutor, make_tuner, ok

SPACE = {
    "parallel": ["single", "ddp"],
    "world_size": {"choices": [2], "when_not": {"parallel": ["single"]}},
    "amp": ["off", "bf16"],
    "num_workers": [0, 1],
    "prefetch_factor": {"choices": [2, 4], "when_not": {"num_workers": [0]}},
}
FIXED = {"global_batch_size": 16, "device": "cpu"}
DDP = TrainConfig(parallel="ddp", world_size=2, **FIXED)


def complete(values: dict[str, object]) -> dict[str, object]:
    return {**values, **FIXED}


def test_moves_change_one_knob_and_follow_the_conditions() -> None:
    space = parse_space(SPACE, "test")
    found = {(m.knob, m.new): m.params for m in moves(space, DDP)}
    assert set(found) == {("parallel", "single"), ("amp", "bf16"), ("num_workers", 1)}
    assert found[("parallel", "single")] == {"parallel": "single", "amp": "off", "num_workers": 0}
    # a worker brings prefetch_factor into being, at its first choice
    assert found[("num_workers", 1)]["prefetch_factor"] == 2


def config(**values: object) -> TrainConfig:
    return TrainConfig(**{**dict(parallel="ddp", world_size=2), **values, **FIXED})  # type: ignore[arg-type]


def test_a_move_seen_to_help_goes_first_and_one_seen_to_hurt_is_left_out() -> None:
    space = parse_space(SPACE, "test")
    single = config(parallel="single", world_size=1)
    measured = [
        Seen(DDP, 100.0),
        Seen(config(amp="bf16"), 10.0),  # bf16 cut speed tenfold from DDP
        Seen(config(num_workers=1, prefetch_factor=2), 150.0),  # a worker helped by half
        Seen(single, 120.0),
    ]
    anchors = sorted(measured, key=lambda m: -m.samples_per_s)
    tried = {m.config.key() for m in measured}
    chosen = next_move(space, complete, anchors, measured, tried, floor=75.0)
    # From the worker config (150): single, seen to give 1.2x from DDP, one knob away; from
    # single (120): a worker, seen to give 1.5x from DDP, one knob away: the same point either
    # way. bf16, seen to cut speed tenfold, stays under the floor.
    assert chosen == {"parallel": "single", "amp": "off", "num_workers": 1, "prefetch_factor": 2}
    tried.add(TrainConfig(**chosen, **FIXED).key())  # type: ignore[arg-type]
    rest = next_move(space, complete, anchors, measured, tried, floor=75.0)
    assert rest is not None and rest.get("amp") != "bf16"  # prefetch 4: unknown, estimate 1x
    assert next_move(space, complete, anchors, measured, tried, floor=1000.0) is None


def test_a_move_seen_to_need_more_memory_than_the_limit_is_not_proposed() -> None:
    space = parse_space(SPACE, "test")
    single = config(parallel="single", world_size=1)
    measured = [
        Seen(DDP, 130.0, 800),  # a second rank doubled the memory: over a limit of 600
        Seen(single, 120.0, 400),
        Seen(config(parallel="single", world_size=1, amp="bf16"), 10.0, 400),
    ]
    anchors = [measured[1]]  # only the single-rank one fits
    tried = {m.config.key() for m in measured}
    chosen = next_move(space, complete, anchors, measured, tried, floor=50.0, limit_bytes=600)
    assert chosen is not None and chosen["parallel"] == "single"  # not ddp again, not bf16
    assert chosen["num_workers"] == 1
    without_limit = next_move(space, complete, anchors, measured, tried, floor=50.0)
    assert without_limit is not None and without_limit["parallel"] == "single"


def test_the_search_climbs_to_an_optimum_two_knobs_from_the_baseline() -> None:
    def speed(c: TrainConfig) -> float:
        value = 100.0 * (1.3 if c.parallel == "single" else 1.0)
        value *= 0.1 if c.amp == "bf16" else 1.0
        return value * (1.5 if c.num_workers else 1.0) * (1.1 if c.prefetch_factor == 4 else 1.0)

    executor = FakeExecutor(lambda c, n: ok(c, speed(c), 100))
    tuner = make_tuner(executor, SPACE, trials=6, prune_ratio=0.5)
    tuner.baseline()
    tuner.search()
    best = tuner.log.best()
    assert best is not None and best.config is not None
    assert (best.config.parallel, best.config.num_workers, best.config.prefetch_factor) == (
        "single",
        1,
        4,
    )
    assert executor.ran(amp="bf16") == 1  # seen once to be slow, never tried again


def test_persistent_workers_are_estimated_at_the_speed_without_the_epoch_boundary() -> None:
    space = parse_space(
        {
            **SPACE,
            "persistent_workers": {"choices": [False, True], "when_not": {"num_workers": [0]}},
        },
        "test",
    )
    worker = config(parallel="single", world_size=1, num_workers=1, prefetch_factor=2)
    tried = {worker.key()}
    # The same anchor, with and without a measured epoch boundary (steady: the window alone).
    plain = next_move(space, complete, [Seen(worker, 100.0)], [], tried, floor=50.0)
    assert plain is not None and plain["parallel"] == "ddp"  # unseen moves tie at 1x: the
    assert plain["persistent_workers"] is False  # first knob of the space goes first
    restarts = Seen(worker, 100.0, steady_samples_per_s=112.0)
    chosen = next_move(space, complete, [restarts], [], tried, floor=50.0)
    assert chosen is not None and chosen["persistent_workers"] is True
    assert {k: v for k, v in chosen.items() if k != "persistent_workers"} == {
        "parallel": "single",
        "amp": "off",
        "num_workers": 1,
        "prefetch_factor": 2,
    }
    # once persistence has been measured somewhere, what it did decides, not the boundary
    kept = config(parallel="single", world_size=1, num_workers=1, prefetch_factor=2,
                  persistent_workers=True)  # fmt: skip
    measured = [Seen(worker, 100.0), Seen(kept, 90.0)]
    again = Seen(config(num_workers=1, prefetch_factor=2), 100.0, steady_samples_per_s=112.0)
    tried |= {kept.key(), again.config.key()}
    chosen = next_move(space, complete, [again], measured, tried, floor=50.0)
    assert chosen is not None and not chosen.get("persistent_workers")


def test_what_a_move_did_counts_less_the_further_its_context_is_from_the_anchor() -> None:
    """Effects depend on context (on mlp, accumulation 2 was faster without a DataLoader worker
    and slower with one): a gain seen where the other knobs were as in the anchor outranks a
    larger gain seen where they were not."""
    space = parse_space(SPACE, "test")
    anchor = config(parallel="single", world_size=1, num_workers=1, prefetch_factor=2)
    near = config(parallel="single", world_size=1, amp="bf16", num_workers=1, prefetch_factor=2)
    far = config(parallel="single", world_size=1, amp="bf16")  # amp and workers differ
    measured = [
        Seen(near, 100.0),
        Seen(near.model_copy(update={"prefetch_factor": 4}), 120.0),  # prefetch 4: 1.2x, near
        Seen(far, 100.0),
        Seen(config(amp="bf16"), 130.0),  # DDP: 1.3x, two knobs away from the anchor
    ]
    tried = {m.config.key() for m in measured} | {anchor.key()}
    chosen = next_move(space, complete, [Seen(anchor, 100.0)], measured, tried, floor=50.0)
    assert chosen == {"parallel": "single", "amp": "off", "num_workers": 1, "prefetch_factor": 4}


def test_a_worker_goes_first_from_a_configuration_that_waited_for_data() -> None:
    """A loading-bound model gets its worker before a compute knob is judged where loading
    hides what that knob does (mlp on the CPU: bf16 measured 0.68x without a worker, 1.28x
    with one)."""
    space = parse_space(SPACE, "test")
    single = config(parallel="single", world_size=1)
    tried = {single.key()}
    busy = next_move(space, complete, [Seen(single, 100.0, data_wait_share=0.0)], [], tried, 50.0)
    assert busy is not None and busy["parallel"] == "ddp"  # unseen moves tie: the first knob
    waiting = Seen(single, 100.0, data_wait_share=0.4)  # estimated 100 / 0.6 = 167 with a worker
    chosen = next_move(space, complete, [waiting], [], tried, floor=50.0)
    assert chosen == {"parallel": "single", "amp": "off", "num_workers": 1, "prefetch_factor": 2}
    # once a worker has been measured, what it did decides, not the wait
    worker = config(parallel="single", world_size=1, num_workers=1, prefetch_factor=2)
    measured = [Seen(single, 100.0), Seen(worker, 95.0)]
    bf16 = Seen(config(parallel="single", world_size=1, amp="bf16"), 100.0, data_wait_share=0.4)
    tried |= {worker.key(), bf16.config.key()}
    chosen = next_move(space, complete, [bf16], measured, tried, floor=50.0)
    assert chosen is not None and chosen["num_workers"] == 0


def test_the_search_makes_workers_persistent_once_a_trial_measured_their_epoch_restart() -> None:
    space = {
        "parallel": ["ddp"],
        "world_size": [2],
        "num_workers": [0, 1],
        "prefetch_factor": {"choices": [2, 4], "when_not": {"num_workers": [0]}},
        "persistent_workers": {"choices": [False, True], "when_not": {"num_workers": [0]}},
    }

    def outcome(config: TrainConfig, before: int) -> TrialResult:
        steady = 1000.0 + 300.0 * config.num_workers
        restarts = config.num_workers > 0 and not config.persistent_workers
        result = ok(config, steady * (0.88 if restarts else 1.0), 100.0)
        return result.model_copy(update={"steady_samples_per_s": steady})

    executor = FakeExecutor(outcome)
    tuner = make_tuner(executor, space, trials=3, top_k=1)
    tuner.baseline()
    tuner.search()
    measured = [r.config for r in executor.runs]
    # baseline (no worker), then a worker (restarted each epoch: 12% lost at its boundary),
    # then, ahead of prefetch 4, the same worker kept alive
    assert [(c.num_workers, c.persistent_workers) for c in measured] == [
        (0, False),
        (1, False),
        (1, True),
    ]
    assert measured[2].prefetch_factor == 2

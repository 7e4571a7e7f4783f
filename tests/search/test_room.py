"""Room for a finalist over the limit: the least larger accumulation, else checkpointing, whose
peak is expected to fit from what the finalist measured and what the move is predicted to save."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.records import TrialRecord
from autotune.search.room import make_room, over_in_race
from tests.search.fakes import MiB

FINALIST = TrainConfig(global_batch_size=32, device="cpu", parallel="ddp", world_size=2)
CHOICES: dict[str, list[object]] = {"grad_accum_steps": [1, 2, 4, 8], "checkpoint_segments": [0, 2]}


def run(config: TrainConfig, mib: float, limit_mib: float = 1000, **fields: object) -> TrialRecord:
    values = {"number": 0, "role": "race", "race_round": 1, "status": "ok", "config": config}
    values |= {"memory_used_bytes": int(mib * MiB), "feasible": mib <= limit_mib, **fields}
    return TrialRecord(**values)  # type: ignore[arg-type]


def predicted(by_accum: dict[int, float]):  # type: ignore[no-untyped-def]
    return lambda c: int(by_accum[c.grad_accum_steps] * MiB) - 100 * MiB * c.checkpoint_segments


def test_the_least_accumulation_expected_to_fit_from_the_measured_peak_less_the_saving() -> None:
    records = [run(FINALIST, 950, role="search"), run(FINALIST, 1100)]
    predict = predicted({1: 1000, 2: 700, 4: 500, 8: 400})
    room = make_room(FINALIST, records, CHOICES, predict, 1000 * MiB)
    assert room is not None and room.config.grad_accum_steps == 2
    assert room.expected_bytes == (1100 - 300) * MiB  # the largest peak less 1000 - 700
    tight = make_room(FINALIST, records, CHOICES, predict, 750 * MiB)
    assert tight is not None and tight.config.grad_accum_steps == 4  # 1100 - 500 = 600
    assert "grad_accum_steps 1 -> 4" in tight.describe()
    assert "~600 MiB expected" in tight.describe()
    # 800 MiB expected lies under a 900 MiB limit, but not by its peaks' spread (150 of 1,100)
    kept = make_room(FINALIST, records, CHOICES, predict, 900 * MiB)
    assert kept is not None and kept.config.grad_accum_steps == 4
    assert "13.6% (its peaks' spread) or more under the limit" in kept.describe()


def test_a_value_measured_over_the_limit_is_passed_over() -> None:
    twice = FINALIST.model_copy(update={"grad_accum_steps": 2})
    records = [run(FINALIST, 1100), run(twice, 1050, role="search")]
    room = make_room(FINALIST, records, CHOICES, lambda c: None, 1000 * MiB)
    assert room is not None and room.config.grad_accum_steps == 4
    assert room.expected_bytes is None and "nothing predicted" in room.describe()


def test_where_accumulation_cannot_move_checkpointing_makes_room() -> None:
    static = FINALIST.model_copy(update={"static_graph": True})  # DDP's no_sync forbids it
    records = [run(static, 1100)]
    room = make_room(static, records, CHOICES, predicted({1: 1000}), 1000 * MiB)
    assert room is not None and room.config.checkpoint_segments == 2
    assert room.config.grad_accum_steps == 1 and room.expected_bytes == 900 * MiB


def test_a_compiled_finalist_with_no_larger_value_left_races_without_compiling() -> None:
    # A memory-bound default-space search: the compiled recipe's peaks spread 6.5% (469-495 MiB)
    # and no accumulation was expected to leave that much room; its compiled share was ~70 MiB.
    compiled = FINALIST.model_copy(update={"compile": "default", "grad_accum_steps": 8})
    records = [run(compiled, 469, role="search"), run(compiled, 495)]

    def predict(config: TrainConfig) -> int:
        return (480 if config.compile != "off" else 410) * MiB

    choices = {**CHOICES, "checkpoint_segments": [0], "compile": ["off", "default"]}
    room = make_room(compiled, records, choices, predict, 468 * MiB)
    assert room is not None and room.config.compile == "off"
    assert room.config.grad_accum_steps == 8 and room.expected_bytes == 425 * MiB
    assert "compile default -> off" in room.describe()
    assert make_room(compiled, records, CHOICES, predict, 468 * MiB) is None  # not offered


def test_no_room_where_the_space_offers_nothing_larger_or_nothing_is_expected_to_fit() -> None:
    records = [run(FINALIST, 1100)]
    assert make_room(FINALIST, records, {"grad_accum_steps": [1]}, lambda c: None, MiB) is None

    def hopeless(config: TrainConfig) -> int:  # every move saves a few MiB
        return (1000 - config.grad_accum_steps - config.checkpoint_segments) * MiB

    assert make_room(FINALIST, records, CHOICES, hopeless, 1000 * MiB) is None


def test_only_a_finalist_out_of_the_race_for_memory_alone_is_moved() -> None:
    assert over_in_race([run(FINALIST, 1100)], FINALIST)
    assert over_in_race([run(FINALIST, 900), run(FINALIST, 0, status="oom")], FINALIST)
    crashed = run(FINALIST, 0, status="crashed", race_round=2)
    assert not over_in_race([run(FINALIST, 1100), crashed], FINALIST)
    assert not over_in_race([run(FINALIST, 900)], FINALIST)  # still in
    assert not over_in_race([run(FINALIST, 1100, role="search", race_round=None)], FINALIST)


def test_a_finalist_with_workers_that_are_not_persistent_makes_them_persistent_first() -> None:
    # On CPU a worker forked again at every epoch keeps old copies of its rank's whole step
    # (gpt_small, one rank: 567 MiB with one worker, 33 persistent); persistence costs no
    # speed and changes no numerics.
    workers = FINALIST.model_copy(update={"num_workers": 2})
    records = [run(workers, 1100)]

    def predict(config: TrainConfig) -> int:
        return (700 if config.persistent_workers else 1000) * MiB - config.grad_accum_steps

    choices = {**CHOICES, "persistent_workers": [False, True]}
    room = make_room(workers, records, choices, predict, 1000 * MiB)
    assert room is not None and room.config.persistent_workers
    assert room.config.grad_accum_steps == 1 and room.expected_bytes == 800 * MiB
    assert "persistent_workers False -> True" in room.describe()
    # not offered by the space, or already persistent: accumulation as before
    assert make_room(workers, records, CHOICES, predict, 1000 * MiB) is None
    kept = workers.model_copy(update={"persistent_workers": True})
    moved = make_room(kept, [run(kept, 1100)], choices, predicted({1: 1000, 2: 700}), 1000 * MiB)
    assert moved is not None and moved.config.grad_accum_steps == 2


def test_a_selective_finalist_checkpoints_its_blocks_fully_before_more_of_them() -> None:
    selective = TrainConfig(
        global_batch_size=32,
        device="cpu",
        grad_accum_steps=8,
        checkpoint_segments=2,
        checkpoint_policy="selective",
    )
    choices = {**CHOICES, "checkpoint_segments": [0, 2, 4]}
    choices["checkpoint_policy"] = ["full", "selective"]

    def predict(c: TrainConfig) -> int:
        kept = 150 if c.checkpoint_policy == "selective" else 0
        return (1000 - 100 * c.checkpoint_segments + kept) * MiB

    room = make_room(selective, [run(selective, 1050)], choices, predict, 1000 * MiB)
    assert room is not None and room.config.checkpoint_policy == "full"
    assert room.config.checkpoint_segments == 2 and room.expected_bytes == 900 * MiB
    assert "checkpoint_policy selective -> full" in room.describe()
    fixed = {**choices, "checkpoint_policy": ["selective"]}  # the space offers no full
    room = make_room(selective, [run(selective, 1050)], fixed, predict, 1000 * MiB)
    assert room is not None and room.config.checkpoint_segments == 4


def test_a_finalist_on_one_device_steps_its_optimizer_in_backward_before_accumulating() -> None:
    # the same updates, without every gradient held at the step's end: no speed lost to a
    # smaller micro-batch, nor to recomputation
    single = TrainConfig(global_batch_size=32, device="cpu")
    choices = {**CHOICES, "optimizer_in_backward": [False, True]}

    def predict(c: TrainConfig) -> int:
        return (1000 - 200 * c.optimizer_in_backward - 100 * c.grad_accum_steps) * MiB

    room = make_room(single, [run(single, 1050)], choices, predict, 1000 * MiB)
    assert room is not None and room.config.optimizer_in_backward
    assert room.config.grad_accum_steps == 1 and room.expected_bytes == 850 * MiB
    # under DDP it cannot: accumulation as before
    ddp = make_room(FINALIST, [run(FINALIST, 1050)], choices, predict, 1000 * MiB)
    assert ddp is not None and ddp.config.grad_accum_steps == 2

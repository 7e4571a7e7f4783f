from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc

from autotune.errors import ConfigError
from autotune.search import storage
from autotune.search.settings import make_settings
from autotune.search.storage import OWNER_ATTR, UNOWNED_S, claims, open_storage, owner
from autotune.search.study import ask_fixed, open_study, requeue_abandoned
from autotune.units import format_budget


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ("lots", "'lots' is not a size"),
        (1.5, "neither a fraction in (0, 1] nor a number of bytes"),
        (-1, "neither a fraction"),
        (True, "expected a size"),
    ],
)
def test_bad_memory_budgets(budget: object, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_settings({"global_batch_size": 8, "memory_budget": budget})
    assert expected in str(error.value)


@pytest.mark.parametrize(
    ("size", "said"),
    [(20 << 30, "20.00 GiB"), (int(0.09 * 2**30), "92 MiB"), (1 << 10, "1.0 KiB"), (0, "0 B")],
)
def test_a_budget_is_said_in_a_unit_it_reads_in(size: int, said: str) -> None:
    # a 1 KiB budget read "0.00 GiB" in the search's budget line and its nothing-fits message
    assert format_budget(size) == said


def test_budget_forms() -> None:
    assert (
        make_settings({"global_batch_size": 8, "memory_budget": "2GiB"}).memory.memory_budget_bytes(
            10 << 30
        )
        == 2 << 30
    )
    assert (
        make_settings({"global_batch_size": 8, "memory_budget": 0.5}).memory.memory_budget_bytes(
            10 << 30
        )
        == 5 << 30
    )
    assert (
        make_settings({"global_batch_size": 8, "memory_budget": "0.25"}).memory.memory_budget_bytes(
            8 << 30
        )
        == 2 << 30
    )
    with pytest.raises(ConfigError, match="give a trial budget"):
        make_settings({"global_batch_size": 8, "trials": None})


def test_a_bad_storage_url_is_one_line() -> None:
    with pytest.raises(ConfigError) as error:
        open_storage("nosuchdb://host/x")
    assert "--storage 'nosuchdb://host/x' cannot be opened" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_fingerprint_mismatch_is_refused_unless_forced(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s.db"))
    open_study(storage, "s", {"model": "a", "devices": 2}, new_study=False)
    with pytest.raises(ConfigError, match="different model source; pass --new-study"):
        open_study(storage, "s", {"model": "b", "devices": 2}, new_study=False)
    # a changed value is named with the stored one and the new one
    with pytest.raises(ConfigError) as raised:
        open_study(storage, "s", {"model": "a", "devices": 4, "memory_budget_bytes": 2**31}, False)
    assert "different devices (2, now 4), memory_budget_bytes (none, now 2.0 GiB);" in str(
        raised.value
    )
    _, name, _ = open_study(storage, "s", {"model": "b", "devices": 2}, new_study=True)
    assert name == "s-2"
    _, same, _ = open_study(storage, "s", {"model": "a", "devices": 2}, new_study=False)
    assert same == "s"
    # the resume line says "--new-study to start again": it does, fingerprint alike or not
    fresh, again, _ = open_study(storage, "s", {"model": "a", "devices": 2}, new_study=True)
    assert again == "s-3" and fresh.trials == []


def test_trials_left_running_are_failed_and_requeued(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s.db"))
    study, _, _ = open_study(storage, "s", {"model": "a"}, new_study=False)
    trial = study.ask()
    trial.suggest_categorical("amp", ["off", "bf16"])
    params = dict(trial.params)
    assert requeue_abandoned(study) == 0  # just asked: its driver is about to claim it
    assert requeue_abandoned(study, now=time.time() + UNOWNED_S + 1) == 1
    states = [t.state for t in study.get_trials()]
    assert states[0] == optuna.trial.TrialState.FAIL
    assert (
        study.ask().params == {}
        and study.get_trials()[-1].system_attrs.get("fixed_params") == params
    )


def test_two_drivers_resuming_at_once_requeue_an_abandoned_trial_once(tmp_path: Path) -> None:
    # Two drivers resuming one PostgreSQL study both read a killed driver's trial as running;
    # the second's tell failed with "Trial#2 has already finished and can not be updated" (seen
    # in a fresh-clone CI run), or, told a moment later, queued the trial a second time.
    url = f"sqlite:///{tmp_path / 's.db'}"
    first, _, _ = open_study(url, "s", {"model": "a"}, new_study=False)
    trial = first.ask()
    trial.suggest_categorical("amp", ["off", "bf16"])
    second, _, _ = open_study(url, "s", {"model": "a"}, new_study=False)
    later = time.time() + UNOWNED_S + 1
    stale = second.get_trials(deepcopy=False)  # what the second read before the first's tell
    assert requeue_abandoned(first, now=later) == 1
    second.get_trials = lambda *args, **kwargs: stale  # type: ignore[method-assign]
    assert requeue_abandoned(second, now=later) == 0  # it looks again before it tells
    # the first's tell between that look and the second's: the storage refuses the second's
    second._storage.get_trial = lambda trial_id: stale[0]  # type: ignore[method-assign]
    assert requeue_abandoned(second, now=later) == 0
    waiting = first._storage.get_all_trials(first._study_id, deepcopy=False)
    fail, wait = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING
    assert [t.state for t in waiting] == [fail, wait]  # failed and queued once


def test_a_requeued_trial_is_proposed_before_the_climbs_next_move(tmp_path: Path) -> None:
    # Climb moves bypass Optuna's queue (``ask_fixed``); a trial a killed driver left running,
    # queued again on resume, was taken only by the sampler's ``ask``, so a resumed search whose
    # budget the climb filled left it waiting, never run (seen with two drivers on PostgreSQL).
    from tests.search.fakes import FakeExecutor, make_tuner, ok

    url = f"sqlite:///{tmp_path / 's.db'}"
    study, _, _ = open_study(url, "s", {"model": "a"}, new_study=False)
    tuner = make_tuner(
        FakeExecutor(lambda config, before: ok(config, 100.0, 100)),
        {"amp": ["off", "bf16"], "num_workers": [0, 1]},
        study=study,
    )
    tuner.baseline()  # amp off, no workers: the climb's next move is one knob from it
    killed = ask_fixed(study, {"amp": "bf16", "num_workers": 1})  # two knobs from it
    for name, choices in (("amp", ["off", "bf16"]), ("num_workers", [0, 1])):
        killed.suggest_categorical(name, choices)
    assert requeue_abandoned(study, now=time.time() + UNOWNED_S + 1) == 1
    assert tuner.proposer._next_move() is not None  # the climb would move first
    proposal = tuner.proposer.propose()
    assert proposal.config is not None
    assert (proposal.config.amp, proposal.config.num_workers) == ("bf16", 1)
    waiting = optuna.trial.TrialState.WAITING
    assert study.get_trials(states=(waiting,)) == []  # nothing left queued
    assert tuner.proposer.propose().number != proposal.number


def test_a_fixed_move_is_a_running_trial_of_its_own_and_leaves_nothing_queued(
    tmp_path: Path,
) -> None:
    # The climb's move went through Optuna's queue (enqueue_trial, then ask), where another
    # driver could take it or a driver's own ask pass over it, leaving it waiting forever.
    # ``ask_fixed`` uses Optuna's storage API for the same trial: this pins what it relies on.
    study, _, _ = open_study(f"sqlite:///{tmp_path}/s.db", "s", {"a": 1}, False)
    trial = ask_fixed(study, {"x": 2, "y": "b"})
    other = study.ask()  # a plain ask finds nothing of it queued
    assert trial.number == 0 and other.number == 1
    assert trial.suggest_categorical("x", [1, 2, 3]) == 2
    assert trial.suggest_categorical("y", ["a", "b"]) == "b"
    assert trial.suggest_categorical("z", [7]) == 7  # not fixed: sampled as usual
    study.tell(trial, 1.0)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {0: optuna.trial.TrialState.COMPLETE, 1: optuna.trial.TrialState.RUNNING}
    assert study.trials[0].params == {"x": 2, "y": "b", "z": 7}


def test_a_proposal_is_claimed_before_its_knobs_are_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second driver opening the study while the first samples must see the trial owned."""
    from tests.search.fakes import FakeExecutor, make_tuner, ok

    tuner = make_tuner(
        FakeExecutor(lambda config, before: ok(config, 100.0, 100)),
        {"amp": ["off", "bf16"], "num_workers": [0, 1]},
        storage=f"sqlite:///{tmp_path / 's.db'}",
    )
    owners: list[object] = []
    suggest = optuna.trial.Trial.suggest_categorical

    def watched(trial: optuna.trial.Trial, name: str, choices: list[object]) -> object:
        owners.append(trial.user_attrs.get(OWNER_ATTR))
        return suggest(trial, name, choices)

    monkeypatch.setattr(optuna.trial.Trial, "suggest_categorical", watched)
    proposal = tuner.proposer.propose()
    assert owners and all(isinstance(o, dict) and o["key"] is None for o in owners)
    assert requeue_abandoned(tuner.proposer.study) == 0
    stored = tuner.proposer.study.get_trials()[proposal.number].user_attrs[OWNER_ATTR]
    assert proposal.config is not None and stored["key"] == proposal.config.key()


def test_settings_nest_by_concern_and_take_flat_names() -> None:
    settings = make_settings(
        {"global_batch_size": 8, "trials": 5, "time_budget_s": "15m", "top_k": 2, "storage": "x.db"}
    )
    assert settings.budget.trials == 5 and settings.budget.time_budget_s == 900.0
    assert settings.finishing.top_k == 2 and settings.study.storage == "x.db"
    assert make_settings(settings.flat()) == settings
    assert settings.replace(concurrency=2).cluster.concurrency == 2


def test_measurement_defaults_are_the_trial_options_own() -> None:
    from autotune.runner.request import TrialOptions

    measured = make_settings({"global_batch_size": 8}).measurement
    defaults = TrialOptions()
    assert measured.warmup_steps == defaults.warmup_steps
    assert measured.measured_steps == defaults.measured_steps
    assert measured.trial_timeout_s == defaults.timeout_s and measured.seed == defaults.seed


def test_measurement_settings_make_the_trial_options_of_every_field() -> None:
    measured = make_settings(
        {
            "measured_steps": 7,
            "min_measure_s": 0.5,
            "target_interval": 0.05,
            "seed": 3,
            "trial_timeout_s": 60,
            "warmup_steps": 4,
            "max_measure_s": 6,
        }
    ).measurement
    options = measured.options(memory_limit_bytes=1 << 30, prune_below=12.5)
    assert (options.measured_steps, options.min_measure_s, options.max_measure_s) == (7, 0.5, 6)
    assert (options.warmup_steps, options.target_interval, options.seed) == (4, 0.05, 3)
    assert options.timeout_s == 60 and options.memory_limit_bytes == 1 << 30
    assert options.prune_below_samples_per_s == 12.5
    plain = measured.options()
    assert plain.prune_below_samples_per_s is None and plain.memory_limit_bytes is None


def test_an_unknown_or_bad_setting_names_itself_and_what_is_accepted() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting .trails.; known settings: .*trials"):
        make_settings({"global_batch_size": 8, "trails": 5})
    with pytest.raises(ConfigError) as error:
        make_settings({"global_batch_size": 8, "race_rounds": 1})
    assert str(error.value).startswith("invalid search settings: race_rounds=1:")


def test_trial_option_errors_list_the_trial_options_fields() -> None:
    from autotune.api import as_options

    with pytest.raises(ConfigError) as error:
        as_options(None, {"warm": 3})
    assert "known fields: warmup_steps, measured_steps" in str(error.value)
    assert "global_batch_size" not in str(error.value)  # not TrainConfig's fields


def _running(study: optuna.Study, driver: str, key: str | None, expires_in_s: float) -> int:
    """A trial another driver runs (or ran): its owner attribute as that driver writes it."""
    import time

    trial = study.ask()
    held = {"driver": driver, "key": key, "expires": time.time() + expires_in_s}
    trial.set_user_attr(OWNER_ATTR, held)
    return trial.number


def test_trials_of_live_drivers_are_theirs_and_those_of_dead_ones_are_requeued(
    tmp_path: Path,
) -> None:
    import socket

    storage = open_storage(str(tmp_path / "s.db"))
    study, _, _ = open_study(storage, "s", {"model": "a"}, new_study=False)
    elsewhere = _running(study, "other-host:123:456", "k1", 600)  # alive, as far as we know
    lapsed = _running(study, "other-host:123:456", "k2", -1)  # its claim ran out
    dead_here = _running(study, f"{socket.gethostname()}:999999999:1", "k3", 600)
    mine = study.ask()
    mine.set_user_attr(OWNER_ATTR, owner("k4", 600))
    assert claims(study) == {"k1": elsewhere}  # neither mine nor the dead ones
    assert requeue_abandoned(study) == 2
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[elsewhere] == states[mine.number] == "RUNNING"
    assert states[lapsed] == states[dead_here] == "FAIL"


def test_a_write_to_a_trial_another_driver_failed_is_stored_as_a_new_trial(
    tmp_path: Path,
) -> None:
    from autotune.config import make_config
    from autotune.records import TrialRecord
    from autotune.search.log import StudyLog, stored_records

    storage = open_storage(str(tmp_path / "s.db"))
    study, _, _ = open_study(storage, "s", {"model": "a"}, new_study=False)
    log = StudyLog(study, 1 << 30)
    trial = study.ask()
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)  # "abandoned" by another
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    record = TrialRecord(number=-1, role="search", status="ok", config=config, samples_per_s=5.0)
    stored = log.write(record, trial)
    assert stored.number != trial.number
    assert [r.samples_per_s for r in stored_records(study)] == [5.0]  # not lost


def test_a_log_refresh_adds_what_another_driver_stored(tmp_path: Path) -> None:
    from autotune.config import make_config
    from autotune.records import TrialRecord
    from autotune.search.log import StudyLog

    storage = open_storage(str(tmp_path / "s.db"))
    study, _, _ = open_study(storage, "s", {"model": "a"}, new_study=False)
    ours, theirs = StudyLog(study, 1 << 30), StudyLog(study, 1 << 30)
    config = make_config({"global_batch_size": 8, "device": "cpu"})
    theirs.write(TrialRecord(number=-1, role="baseline", status="ok", config=config))
    assert ours.records == [] and ours.baseline() is None
    assert [r.role for r in ours.refresh()] == ["baseline"]
    assert ours.baseline() is not None and ours.refresh() == []


def test_a_study_another_driver_just_created_is_joined_not_refused(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "s.db"))
    optuna.create_study(study_name="team", storage=storage)  # its fingerprint not stored yet
    _, name, _ = open_study(storage, "team", {"model": "a"}, new_study=False)
    assert name == "team"
    with pytest.raises(ConfigError, match="different model source"):  # once stored, it is checked
        open_study(storage, "team", {"model": "b"}, new_study=False)


class _Lossy:
    """A storage whose inner call loses its connection once (as a restarting server does)."""

    wait_s, waiting_since, shown, url = 5.0, None, "db", "db"

    def __init__(self, error: Exception) -> None:
        self.error: Exception | None = error
        self.calls: list[str] = []
        self.said: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)

    def remove_session(self) -> None:
        self.calls.append("remove_session")

    def outer(self) -> str:
        self.calls.append("outer")
        return self.inner()

    def inner(self) -> str:
        self.calls.append("inner")
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return "answered"


@pytest.mark.parametrize(
    "error",
    [
        sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection")),
        sqlalchemy.exc.PendingRollbackError("Can't reconnect until invalid transaction is rolled"),
    ],
    ids=["connection lost", "pending rollback"],
)
def test_a_lost_connection_retries_the_outermost_call_on_a_fresh_session(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # The retry starts a new session: a nested call retried alone would go on with rows of the
    # lost one (SQLAlchemy's DetachedInstanceError, PendingRollbackError under a real restart).
    monkeypatch.setattr(storage, "RETRY_S", 0.01)
    for name in ("outer", "inner"):
        monkeypatch.setattr(_Lossy, name, storage._patient(getattr(_Lossy, name)))
    lossy = _Lossy(error)
    assert lossy.outer() == "answered"
    assert lossy.calls == ["outer", "inner", "remove_session", "outer", "inner"]
    assert lossy.said[0].startswith("the study database at db stopped answering")
    assert lossy.said[1].startswith("the study database answers again")


def test_an_error_that_is_not_a_lost_connection_is_raised_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_Lossy, "outer", storage._patient(_Lossy.outer))
    lossy = _Lossy(sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate key")))
    with pytest.raises(sqlalchemy.exc.IntegrityError):
        lossy.outer()
    assert lossy.calls == ["outer", "inner"] and lossy.said == []


def test_a_trial_is_owned_as_it_is_made_so_a_killed_drivers_is_requeued_at_once(
    tmp_path: Path,
) -> None:
    # Owned a moment after Optuna's ask, a driver killed in between left a trial nobody owned;
    # drivers resuming at once could not tell it from a live driver's (for UNOWNED_S) and
    # finished the study with it still running (two drivers on PostgreSQL, under load).
    import socket

    from autotune.search.study import ask_owned

    study, _, _ = open_study(f"sqlite:///{tmp_path}/s.db", "s", {"a": 1}, False)
    held = owner(None, 600)
    running = optuna.trial.TrialState.RUNNING
    for trial in (ask_owned(study, held), ask_fixed(study, {"x": 1}, held)):
        stored = study._storage.get_trial(trial._trial_id)  # as another driver reads it
        assert stored.state == running and stored.user_attrs[OWNER_ATTR] == held
    study.enqueue_trial({"x": 3})  # a trial queued again on resume is taken first, and owned
    taken = ask_owned(study, held)
    assert taken.number == 2 and taken.suggest_categorical("x", [1, 3]) == 3
    assert study._storage.get_trial(taken._trial_id).user_attrs[OWNER_ATTR] == held
    gone = {**held, "driver": f"{socket.gethostname()}:1:0"}  # a killed driver's process
    ask_owned(study, gone)
    assert requeue_abandoned(study) == 1  # at once, not UNOWNED_S later; this driver's stay

"""The Optuna study behind a search: storage, fingerprint, sampler and resume.

Trials a killed driver left RUNNING are marked failed and their parameters re-queued when the
study is opened again. What each trial stores is ``autotune.search.log``'s business.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.runner.references import resolve_reference
from autotune.search.storage import OWNER_ATTR, abandoned
from autotune.units import format_bytes

ATTR_PREFIX = "autotune:"


def model_hash(model_reference: str) -> str:
    """A hash of the model's source file, so a changed model is a different study."""
    module, _ = resolve_reference(model_reference, "--model")
    try:
        source = Path(inspect.getsourcefile(module) or "").read_bytes()
    except (OSError, TypeError):
        source = model_reference.encode()
    return hashlib.sha256(source + model_reference.encode()).hexdigest()[:16]


def open_study(
    storage: Any, name: str, fingerprint: dict[str, Any], new_study: bool
) -> tuple[Any, str, int]:
    """Create or resume the study; return (study, its name, trials re-queued). ``new_study``:
    never resume; a stored study of that name leaves the new one a ``-2``, ``-3``... suffix."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    names = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    if name in names:
        stored = names[name].user_attrs.get(ATTR_PREFIX + "fingerprint")
        # None: another driver created the study a moment ago and has not stored it yet
        if new_study or (stored is not None and stored != fingerprint):
            if not new_study:
                raise ConfigError(
                    f"study {name!r} in this storage was made with a different "
                    f"{changes(stored or {}, fingerprint)}; pass --new-study to start a new "
                    "study, or --study-name to pick another name"
                )
            suffix = 2
            while f"{name}-{suffix}" in names:
                suffix += 1
            name = f"{name}-{suffix}"
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize",
        load_if_exists=True,
        sampler=make_sampler(fingerprint.get("seed")),
    )
    study.set_user_attr(ATTR_PREFIX + "fingerprint", fingerprint)
    study.set_metric_names(["samples_per_s"])  # what optuna-dashboard labels the value
    return study, name, requeue_abandoned(study)


HASHED = {
    "platform": "machine or library versions",
    "model": "model source",
    "space": "search space",
}
"""Fingerprint entries stored as hashes, by what a change of one means."""


def changes(stored: dict[str, Any], given: dict[str, Any]) -> str:
    """What differs between a stored study's fingerprint and this command's, each with the
    stored value and the new one ("memory_budget_bytes (4.0 GiB, now 7.5 GiB)")."""

    def shown(key: str, value: Any) -> str:
        if value is None:
            return "none"
        return format_bytes(value) if key.endswith("_bytes") else str(value)

    return ", ".join(
        HASHED[k]
        if k in HASHED
        else f"{k} ({shown(k, stored.get(k))}, now {shown(k, given.get(k))})"
        for k in sorted(set(stored) | set(given))
        if stored.get(k) != given.get(k)
    )


def ask_fixed(study: Any, params: dict[str, Any], held: dict[str, Any] | None = None) -> Any:
    """A new trial of ``study`` whose suggestions return ``params`` (the climb's next move):
    what ``enqueue_trial`` and ``ask`` do, without the queue between them. Through the queue,
    another driver's ``ask`` of the same study could take the move, and a driver's own ``ask``
    could pass over it: a move was left waiting in a shared study that no driver would run
    (1 in 4 runs of two drivers on PostgreSQL). ``held``: its owner (``storage.owner``),
    written in the same insert (``ask_owned``). Optuna's storage API (``study._storage``,
    ``study._study_id``, the trial cache ``ask`` clears) is the one way in;
    ``tests/search/test_settings_and_storage.py`` pins it."""
    return _created(study, {"fixed_params": params}, held)


def ask_owned(study: Any, held: dict[str, Any]) -> Any:
    """``study.ask()`` with the trial's owner (``storage.owner``) written as it is made. Owned
    a moment later, a driver killed in between left a trial nobody owned, which a driver
    resuming at once cannot tell from a live driver's for ``UNOWNED_S`` and so left running
    to its end (two drivers resuming a killed study on PostgreSQL). A trial queued again on
    resume is taken first, as ``ask`` takes it (``_pop_waiting_trial_id``), and owned after."""
    import optuna

    study._thread_local.cached_all_trials = None
    waiting = study._pop_waiting_trial_id()
    if waiting is None:
        return _created(study, {}, held)
    trial = optuna.Trial(study, waiting)
    trial.set_user_attr(OWNER_ATTR, held)
    return trial


def _created(study: Any, system_attrs: dict[str, Any], held: dict[str, Any] | None) -> Any:
    import optuna
    from optuna.trial import TrialState, create_trial

    study._thread_local.cached_all_trials = None  # as ``ask`` does: the sampler reads afresh
    template = create_trial(
        state=TrialState.RUNNING,
        system_attrs=system_attrs,
        user_attrs={OWNER_ATTR: held} if held is not None else {},
    )
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return optuna.Trial(study, trial_id)


def make_sampler(seed: int | None) -> Any:
    """The search's sampler: TPE over the joint space (knobs that only exist together are
    modelled together), a few random start-up trials, and lies for trials still running."""
    import optuna

    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=5, multivariate=True, group=True, constant_liar=True
    )


def requeue_abandoned(study: Any, now: float | None = None) -> int:
    """Fail the trials a killed driver left running, and queue their parameters again; the
    trials other drivers of the study are running now are theirs (``now``: the time they are
    judged at). How many it queued: a trial another driver resuming at once failed first is
    that driver's to queue (read afresh through ``study._storage``, as ``ask_fixed`` writes)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    left = [t for t in running if abandoned(t, now)]  # not another live driver's
    requeued = 0
    for trial in left:
        # another driver resuming the study may have failed it since it was read as running,
        # and queued it again itself: then it is not queued twice
        if study._storage.get_trial(trial._trial_id).state.is_finished():
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        except UpdateFinishedTrialError:  # failed by the other between that look and this
            continue
        if trial.params:
            study.enqueue_trial(trial.params, skip_if_exists=False)
        requeued += 1
    return requeued

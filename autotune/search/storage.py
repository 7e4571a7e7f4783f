"""The study's database, shared by drivers on several machines: waited for when it stops
answering, and told who runs what.

``open_storage`` gives Optuna's ``RDBStorage`` with every call made patient: a call that fails
because the database stopped answering (a restarting server, a dropped connection) is retried
whole, on a fresh session, until it answers again, for at most ``wait_s`` seconds, said once
on the terminal; past that the search stops with one line, and every trial stored before is
kept. Connections are checked before use (``pool_pre_ping``), so a restarted server is
reconnected to, not failed on.

Several drivers may run one study at once. Each trial a driver runs carries its owner
(``OWNER_ATTR``: the driver, the configuration's key, and when the claim lapses), so another
driver neither measures that configuration too nor takes the trial for one a killed driver
left behind (``abandoned``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, ConfigError
from autotune.secrets import mask_url, redact

OWNER_ATTR = "autotune:owner"
UNCLAIMED_S = 600.0
"""How long an asked trial without a configuration yet belongs to its driver."""
UNOWNED_S = 60.0
"""How long a trial without an owner yet is left to the driver that asked for it: between
Optuna's ask and the owner written next, another driver opening the study must not take it
for one a killed driver left behind."""
RETRY_S = 2.0


class StorageLost(AutotuneError):
    """The study's database stopped answering for longer than the search waits."""


@functools.cache
def driver_id() -> str:
    """This process, as other drivers of the study see it: host, pid, start time (a pid
    alone may be reused)."""
    import psutil

    started = psutil.Process().create_time()
    return f"{socket.gethostname()}:{os.getpid()}:{started:.0f}"


def owner(key: str | None, hold_s: float) -> dict[str, Any]:
    """The owner attribute of a trial this driver runs (``key``: its configuration's)."""
    return {"driver": driver_id(), "key": key, "expires": time.time() + hold_s}


def _alive(driver: str) -> bool:
    """Whether ``driver`` may still be running: another host's driver is taken to be; on this
    host, its process must exist with the same start time."""
    import psutil

    host, _, rest = driver.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname():
        return True
    try:
        return f"{psutil.Process(int(pid)).create_time():.0f}" == started
    except (psutil.NoSuchProcess, ValueError):
        return False


def abandoned(trial: Any, now: float | None = None) -> bool:
    """A running trial no live driver will finish: it has had no owner for ``UNOWNED_S`` since
    it started, its driver is gone, or its claim lapsed (a driver on another host that was
    killed)."""
    now = now or time.time()
    held = trial.user_attrs.get(OWNER_ATTR)
    if not isinstance(held, dict):
        started = trial.datetime_start
        return started is None or started.timestamp() + UNOWNED_S < now
    if held.get("driver") == driver_id():
        return False
    expired = float(held.get("expires", 0)) < now
    return expired or not _alive(str(held.get("driver")))


def running(study: Any) -> tuple[dict[str, int], bool]:
    """One look at the study's running trials: the configurations other live drivers are
    measuring now (key -> trial number), and whether any running trial is not this driver's
    (another driver's, or one just asked whose owner is not written yet)."""
    from optuna.trial import TrialState

    now, me = time.time(), driver_id()
    found: dict[str, int] = {}
    others = False
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        held = trial.user_attrs.get(OWNER_ATTR)
        theirs = not isinstance(held, dict) or held.get("driver") != me
        others = others or theirs
        if theirs and isinstance(held, dict) and held.get("key") and not abandoned(trial, now):
            found[str(held["key"])] = trial.number
    return found, others


def claims(study: Any) -> dict[str, int]:
    """Configurations other live drivers are measuring now: key -> trial."""
    return running(study)[0]


# -- the database ------------------------------------------------------------------------------


def storage_url(storage: str) -> str:
    """A plain file path becomes a SQLite URL; URLs pass through."""
    if "://" in storage:
        return storage
    return f"sqlite:///{Path(storage).expanduser().resolve()}"


def _connection_lost(error: BaseException) -> bool:
    """Whether ``error`` says the database did not answer (not that the call was wrong)."""
    import sqlalchemy.exc

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            return True
        # A connection lost inside a transaction: it is refused until rolled back, which the
        # retry does by dropping the session (``_patient``).
        if isinstance(seen, sqlalchemy.exc.PendingRollbackError):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_calling = threading.local()
"""Whether this thread is inside a patient call: only the outermost one waits and retries, since
a retry starts a fresh session, and a call made inside another still holds the lost one's rows."""


def _patient(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(self, "wait_s") or getattr(_calling, "inside", False):
            return method(self, *args, **kwargs)  # opening (open_storage says why not); nested
        deadline = None
        while True:
            try:
                _calling.inside = True
                try:
                    result = method(self, *args, **kwargs)
                finally:
                    _calling.inside = False
            except Exception as error:
                if not _connection_lost(error):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.wait_s
                    self.waiting_since = self.waiting_since or now
                    if self.wait_s > 0:
                        self.say(
                            f"the study database at {self.shown} stopped answering; waiting up "
                            f"to {self.wait_s:g} s for it"
                        )
                if now >= deadline:
                    first = redact(" ".join(str(error).split())[:160], self.url)
                    raise StorageLost(
                        f"the study database at {self.shown} did not answer for "
                        f"{self.wait_s:g} s ({first}); every trial stored before is kept: run "
                        "the same command again to resume (--storage-wait waits longer)"
                    ) from None
                with contextlib.suppress(Exception):  # a fresh session, not the lost one's
                    self.remove_session()
                time.sleep(min(RETRY_S, max(deadline - now, 0.05)))
                continue
            if self.waiting_since is not None:
                self.say(
                    f"the study database answers again after "
                    f"{time.monotonic() - self.waiting_since:.0f} s"
                )
                self.waiting_since = None
            return result

    return call


@functools.cache
def _patient_class() -> type:
    """``RDBStorage`` with every call patient, the private ones Optuna's cache makes too
    (made on first use: it imports Optuna)."""
    from optuna.storages import RDBStorage

    namespace: dict[str, Any] = {
        name: _patient(member)
        for name, member in vars(RDBStorage).items()
        if callable(member)
        and not isinstance(member, staticmethod | classmethod)
        and not name.startswith("__")
        and name != "remove_session"
    }
    return type("PatientStorage", (RDBStorage,), namespace)


NO_STUDY_YET = "a search stores its study there (autotune search --storage PATH)"


def open_storage(
    storage: str,
    wait_s: float = 0.0,
    say: Callable[[str], None] | None = None,
    existing: bool = False,
) -> Any:
    """The study's storage; one line naming the driver to install when it is missing.
    ``existing``: for a command that reads what a search stored, a SQLite file that is not
    there is an error (opening it would create an empty one)."""
    url = storage_url(storage)
    if existing and url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        raise ConfigError(f"--storage {storage!r}: no such file; {NO_STUDY_YET}")
    engine = {} if url.startswith("sqlite") else {"engine_kwargs": {"pool_pre_ping": True}}
    try:
        try:
            backend = _patient_class()(url, **engine)
        except Exception as error:
            if not _schema_race(error):
                raise
            time.sleep(RETRY_S)  # another driver is creating the tables: they exist now
            backend = _patient_class()(url, **engine)
    except ImportError:  # Optuna's word for a database driver that is not installed
        raise ConfigError(
            f"--storage {mask_url(storage)!r} needs a database driver that is not installed: "
            f"{_driver_hint(url)}"
        ) from None
    except Exception as error:  # SQLAlchemy raises many kinds; all mean "cannot open"
        first = redact(" ".join(str(error).split())[:200], storage, url)
        raise ConfigError(
            f"--storage {mask_url(storage)!r} cannot be opened ({type(error).__name__}: "
            f"{first}); use a file path such as autotune.db, or a database URL such as "
            "postgresql://host/db"
        ) from None
    backend.wait_s, backend.shown, backend.waiting_since = wait_s, mask_url(storage), None
    backend.say = say or (lambda _line: None)
    return backend


def stored_studies(storage: str) -> tuple[Any, list[Any]]:
    """(backend, study summaries) of a storage a search wrote; one line where it holds none."""
    import optuna

    backend = open_storage(storage, existing=True)
    summaries = optuna.get_all_study_summaries(backend)
    if not summaries:
        raise ConfigError(f"storage {mask_url(storage)!r} holds no study yet: {NO_STUDY_YET}")
    return backend, summaries


def load_stored_study(storage: str, study_name: str | None) -> tuple[Any, Any]:
    """(study, summary) of ``study_name`` in a storage a search wrote, or of its one study where
    none is named, the storage opened once; one line where it holds no such study."""
    import optuna

    backend, summaries = stored_studies(storage)
    summary = pick_study(storage, summaries, study_name)
    return optuna.load_study(study_name=summary.study_name, storage=backend), summary


def pick_study(storage: str, summaries: list[Any], study_name: str | None) -> Any:
    """The summary of ``study_name``, or of the storage's one study where none is named; one
    line naming the studies there where that is not one."""
    names = [s.study_name for s in summaries]
    if study_name is None:
        if len(names) != 1:
            raise ConfigError(
                f"storage {mask_url(storage)!r} holds {len(names)} studies; pick one with "
                "--study-name: " + ", ".join(names)
            )
        study_name = names[0]
    if study_name not in names:
        raise ConfigError(
            f"no study {study_name!r} in {mask_url(storage)!r}; it holds: {', '.join(names)}"
        )
    return summaries[names.index(study_name)]


def _schema_race(error: BaseException) -> bool:
    """Two drivers opening one new database at once: the second one's tables clash."""
    import sqlalchemy.exc

    return isinstance(error, sqlalchemy.exc.IntegrityError | sqlalchemy.exc.ProgrammingError)


def _driver_hint(url: str) -> str:
    scheme = url.partition("://")[0].lower()
    if scheme.startswith("postgres"):
        return "pip install 'autotune[postgres]' (psycopg 3, SQLAlchemy's postgresql:// driver)"
    if scheme.startswith("mysql"):
        return "pip install pymysql, and name it in the URL (mysql+pymysql://...)"
    return "install the driver the URL's scheme names"

"""Bad input, tried by a machine: every config file, search space, size, duration and model
reference gives a valid object or one clean line of error, never a traceback or a hang."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.config import TrainConfig, load_config
from autotune.errors import AutotuneError
from autotune.runner.workload import WorkloadSpec, check_workload
from autotune.search.space import SearchSpace, parse_space
from autotune.units import parse_bytes, parse_duration

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # CI runs the same examples every time; explore locally with a seed
)
NUMBERS = r"\s?[0-9]{0,400}\.?[0-9]{1,4}\s?[a-zA-Z]{0,4}\s?"
"""Number-like text, long digit runs included."""


def one_line(error: Exception) -> None:
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text


@FAST
@given(st.one_of(st.text(max_size=30), st.from_regex(NUMBERS, fullmatch=True)))
def test_sizes_and_durations(text: str) -> None:
    for parse in (parse_bytes, parse_duration):
        try:
            value = parse(text)
        except ValueError as error:
            one_line(error)
        else:
            assert 0 < value < float("inf")


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["ddp", "fsdp", "single", "bf16", "fp16", "off", "cpu", "auto", "none"]),
)
FIELDS = st.one_of(st.sampled_from(sorted(TrainConfig.model_fields)), st.text(max_size=10))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=6)


def _write(text: str, suffix: str) -> Path:
    handle = tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False)  # noqa: SIM115
    with handle:
        handle.write(text)
    return Path(handle.name)


@FAST
@given(
    st.one_of(
        st.dictionaries(FIELDS, VALUES, max_size=8).map(lambda d: yaml.safe_dump(d)),
        st.text(max_size=80),
    ),
    st.sampled_from([".yaml", ".json"]),
)
def test_config_files(text: str, suffix: str) -> None:
    path = _write(text, suffix)
    try:
        config = load_config(path)
    except AutotuneError as error:
        one_line(error)
    else:
        assert isinstance(config, TrainConfig)
    finally:
        path.unlink()


KNOBS = st.one_of(st.sampled_from(sorted(TrainConfig.model_fields)), st.text(max_size=8))
PARAMS: Any = st.one_of(
    st.lists(SCALARS, max_size=4),
    SCALARS,
    st.fixed_dictionaries(
        {"choices": st.lists(SCALARS, max_size=3)},
        optional={
            "when": st.dictionaries(KNOBS, st.lists(SCALARS, max_size=2), max_size=2),
            "when_not": st.dictionaries(KNOBS, st.lists(SCALARS, max_size=2), max_size=2),
            "range": st.lists(st.integers(-5, 70), max_size=4),
        },
    ),
)


@FAST
@given(st.one_of(st.dictionaries(KNOBS, PARAMS, max_size=6), VALUES))
def test_search_spaces(data: Any) -> None:
    try:
        space = parse_space(data, "generated")
    except AutotuneError as error:
        one_line(error)
    else:
        assert isinstance(space, SearchSpace)


REFERENCES = st.one_of(
    st.text(max_size=30).filter(lambda t: ":" not in t),  # no module:attr shape at all
    st.builds(  # modules that do not exist, files that do not exist
        "{}:{}".format,
        st.one_of(
            st.from_regex(r"hyp_[a-z_]{1,8}(\.[a-z]{1,4})?", fullmatch=True),
            st.from_regex(r"/nonexistent/[a-z]{1,6}\.py", fullmatch=True),
            st.just(""),
        ),
        st.text(max_size=10),
    ),
    st.builds(  # a real module, any attribute
        "tests.fixtures.models:{}".format, st.text(max_size=10)
    ),
)


@FAST
@given(REFERENCES)
def test_model_references(reference: str) -> None:
    try:
        check_workload(WorkloadSpec(model=reference))
    except AutotuneError as error:
        one_line(error)


@pytest.mark.parametrize("text", ["9" * 400, "9" * 400 + "GiB", "1" + "0" * 320 + "h"])
def test_huge_numbers_are_refused_in_one_line(text: str) -> None:
    for parse in (parse_bytes, parse_duration):
        with pytest.raises(ValueError, match="not a"):
            parse(text)


@FAST
@given(
    st.one_of(REFERENCES, st.builds("tests.fixtures.optimizers:{}".format, st.text(max_size=10)))
)
def test_optimizer_references(reference: str) -> None:
    try:
        check_workload(WorkloadSpec(model="tests.fixtures.models:Small", optimizer=reference))
    except AutotuneError as error:
        one_line(error)


@FAST
@given(
    st.sampled_from(["postgresql", "postgresql+psycopg2", "mysql+pymysql", "sqlite"]),
    st.text(min_size=1, max_size=20),
    st.text(alphabet=st.characters(blacklist_characters="@"), max_size=8),
)
def test_a_storage_password_of_any_characters_is_masked(
    scheme: str, password: str, user: str
) -> None:
    from autotune.secrets import mask_url

    user = user.replace(":", "").replace("/", "")
    url = f"{scheme}://{user}:{password}@db.example:5432/tune"
    assert mask_url(url) == f"{scheme}://{user}:***@db.example:5432/tune"


PLAN_SETTINGS = settings(FAST, max_examples=25)


@PLAN_SETTINGS
@given(
    st.one_of(st.integers(-3, 5000).map(str), st.text(max_size=6)),
    st.one_of(st.from_regex(NUMBERS, fullmatch=True), st.text(max_size=10)),
    st.one_of(st.just([]), st.just(["--device", "cpu"]), st.just(["--safety-margin", "1.5"])),
)
def test_plan_flags(devices: str, memory: str, extra: list[str]) -> None:
    import contextlib
    import io

    from autotune.cli import main

    argv = ["plan", "--model", "tests.fixtures.models:Small", "--space", "quick"]
    argv += ["--devices", devices, "--device-memory", memory, *extra]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own one-line refusals
            code = int(exit_.code or 0)
    assert code in (0, 2)
    if code == 2:
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err.getvalue()


def test_an_error_announcing_its_next_line_keeps_it() -> None:
    # transformers' missing-package error put the command on its second line, and the trial's
    # reason ended at "You can install it with pip:"
    from autotune.errors import error_line

    missing = ImportError(
        "HungarianMatcher requires the scipy library but it was not found in your environment. "
        "You can install it with pip:\n`pip install scipy`. Please note that you may need to "
        "restart your runtime after installation.\n"
    )
    assert error_line(missing).endswith(
        "You can install it with pip: `pip install scipy`. Please note that you may need to "
        "restart your runtime after installation."
    )
    assert error_line(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert error_line(ValueError("")) == "ValueError: "

"""The sampler set-up study (scripts/bench_search_setup.py) on the test landscape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from autotune.bench import setups as setup

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_search_setup.py"
LANDSCAPE = ROOT / "tests" / "data" / "landscape.json"


def test_a_set_up_row_counts_picks_per_budget_and_caps_the_reach() -> None:
    row = setup.study(str(LANDSCAPE), "climb, then tpe 5", 3, [4, 6], cap=8)
    assert 1 <= row["trials_to_98_median"] <= 9 and row["trials_to_98_p90"] <= 9  # cap + 1
    for budget in (4, 6):
        assert 0 <= row[f"pick_ge_0.97_at_{budget}"] <= 3
        assert 0 < row[f"worst_pick_at_{budget}"] <= 1
    assert setup.study(str(LANDSCAPE), "climb, then tpe 5", 3, [4, 6], cap=8) == row


def test_two_processes_give_what_one_gives(tmp_path: Path) -> None:
    def run(jobs: int) -> dict[str, object]:
        out = tmp_path / f"setup{jobs}.json"
        args = [str(LANDSCAPE), "--seeds", "2", "--budgets", "3", "--cap", "5"]
        command = [sys.executable, str(SCRIPT), *args, "--jobs", str(jobs), "--out", str(out)]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        return json.loads(out.read_text())

    one, two = run(1), run(2)
    assert one == two
    assert set(one["landscapes"][str(LANDSCAPE)]) == set(setup.SETUPS)

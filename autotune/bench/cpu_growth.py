"""How a CPU rank's resident memory grows over a long run, step by step, in a fresh process.

A trial measures a few steps; a training run takes thousands. Where a rank's memory keeps growing
after the first steps, a trial's peak is a lower bound of the run's. On CPU, autocast's matmuls
run in oneDNN, which compiles a kernel per shape and keeps it in two caches (oneDNN's primitive
cache and ideep's, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY``, 1,024 entries
each by default): a model whose shapes change from step to step (a mixture of experts' routing
gives each expert a new number of tokens every step) fills them, and its resident memory grows
until they are full. ``capped`` runs the same with both caches held to one entry, which shows
whether they are the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from autotune.runner.workload import WorkloadSpec

CAPPED_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "LRU_CACHE_CAPACITY": "1"}
"""oneDNN's primitive cache off and ideep's held to one entry (read as the process starts)."""

_RUN = """
import json, sys, time, torch
from torch.utils.data import DataLoader
from autotune.runner.memory import _status_kib
from autotune.runner.optimizer import chosen_optimizer
from autotune.runner.training import _AMP_DTYPES, move_to, split_batch
from autotune.runner.workload import WorkloadSpec, build_workload
spec, amp, micro, steps = WorkloadSpec.model_validate_json(sys.argv[1]), *sys.argv[2:5]
micro, steps = int(micro), int(steps)
work = build_workload(spec)
model = work.model
make = chosen_optimizer(work.optimizer, model)
optimizer = make(model.parameters())
loader = DataLoader(
    work.dataset, batch_size=micro, shuffle=True, drop_last=True, collate_fn=work.collate
)
dtype = _AMP_DTYPES.get(amp)
rows, batches = [], iter(())
for step in range(1, steps + 1):
    try:
        batch = next(batches)
    except StopIteration:
        batches = iter(loader)
        batch = next(batches)
    args, kwargs, target = split_batch(move_to(batch, torch.device("cpu"), False, False))
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        loss = work.loss(model(*args, **kwargs), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    rows.append([step, seconds, _status_kib("VmRSS") * 1024, _status_kib("VmHWM") * 1024])
print(json.dumps(rows))
"""


def growth(
    model: str, amp: str, micro_batch: int, steps: int, capped: bool = False
) -> dict[str, Any]:
    """One fresh process training ``model`` for ``steps`` steps: each step's seconds, resident
    memory and resident high-water mark."""
    spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
    env = {**os.environ, **(CAPPED_CACHES if capped else {})}
    out = subprocess.run(
        [sys.executable, "-c", _RUN, spec.model_dump_json(), amp, str(micro_batch), str(steps)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "model": model,
        "amp": amp,
        "micro_batch": micro_batch,
        "capped_caches": capped,
        "steps": [{"step": s, "seconds": t, "rss_bytes": r, "hwm_bytes": h} for s, t, r, h in rows],
    }


def summary(run: dict[str, Any], early: int = 3) -> dict[str, Any]:
    """The high-water mark after ``early`` steps (a trial's reach) and at the end, the step from
    which it stopped growing by more than 1%, and the median step time of the last half."""
    steps = run["steps"]
    final = steps[-1]["hwm_bytes"]
    early_hwm = steps[min(early, len(steps)) - 1]["hwm_bytes"]
    settled = next(s["step"] for s in steps if s["hwm_bytes"] >= 0.99 * final)
    times = sorted(s["seconds"] for s in steps[len(steps) // 2 :])
    return {
        "early_steps": early,
        "early_hwm_bytes": early_hwm,
        "final_hwm_bytes": final,
        "growth": final / early_hwm - 1,
        "settled_at_step": settled,
        "median_step_s": times[len(times) // 2],
    }

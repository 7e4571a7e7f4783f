"""Record one model's landscape (every configuration of a space, measured; the fastest eight
that fit measured three more times) with a time limit, resuming where an earlier call stopped.

    # on a lent GPU (no Ray there): as much as fits in 540 s, then again on the next lease
    python scripts/record_landscape.py --model examples/hf_models.py:gpt2_small_1k \
        --space search_spaces/gpu_single.yaml --device cuda --until-s 540 \
        --state results/gpu/h200_gpt2_small_1k_landscape_state.json \
        --out results/landscapes/h200_gpt2_small_1k.json
    # here, once it is complete: the tuner, random search and the recipe on it
    python scripts/bench_replay_noise.py results/landscapes/h200_gpt2_small_1k.json --seeds 20 \
        --out results/gpu/h200_gpt2_small_1k_replay.json

Each run is the search-quality benchmark's grid run (``autotune.bench.live``: the same warm-up,
adaptive window and memory line), on rank processes of this machine by default
(``--executor ray`` for the benchmark's Ray instance). The state file is written after every
run; a call that would not finish its next run within ``--until-s`` stops and says what is left.
Exit 0 when the landscape is complete (written to ``--out``), 3 when runs are left.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from autotune.bench.grid_record import GridState
from autotune.bench.live import Live
from autotune.runner.workload import WorkloadSpec

NOT_DONE = 3


def _start(args: argparse.Namespace, platform: object) -> GridState:
    from autotune.runner.platform import native_autocast
    from autotune.search.model_facts import repeated_blocks
    from autotune.search.probe import restrict_space
    from autotune.search.space import enumerate_configs, load_space

    blocks = repeated_blocks(args.model)
    space, _ = restrict_space(
        load_space(args.space), platform, args.devices, blocks[0] if blocks else None
    )
    fixed = {"global_batch_size": args.global_batch_size, "device": platform.device_type}
    configs = enumerate_configs(space, fixed)
    return GridState.start(
        configs,
        workload=args.model,
        platform=platform,
        devices=args.devices,
        space=space,
        global_batch_size=args.global_batch_size,
        warmup_steps=args.warmup_steps,
        measured_steps=args.measured_steps,
        native_amp=native_autocast(platform.device_type)[0],
    )


def _resumed(args: argparse.Namespace, state: GridState) -> GridState:
    """The saved state, if it records this model at this batch."""
    if (state.workload, state.global_batch_size) != (args.model, args.global_batch_size):
        sys.exit(
            f"{args.state} records {state.workload} at global batch {state.global_batch_size}, "
            f"not {args.model} at {args.global_batch_size}: give another --state"
        )
    return state


def _summary(state: GridState) -> None:
    landscape = state.landscape()
    ranked = sorted(
        (p for p in landscape.points if landscape.feasible(p)),
        key=lambda p: p.value or 0.0,
        reverse=True,
    )
    if not ranked:
        print("no configuration finished under the memory line")
        return
    best = ranked[0].value or 1.0
    print(
        f"memory line {landscape.memory_limit_bytes / 2**30:.2f} GiB; "
        f"{len(ranked)} of {len(landscape.points)} fit; run noise {landscape.run_noise:.1%}"
    )
    print(f"  {'of opt':>6} {'samples/s':>10} {'runs':>4} {'peak GiB':>8}  configuration")
    for p in ranked[:10]:
        peak = (p.memory_used_bytes or 0) / 2**30
        print(
            f"  {(p.value or 0) / best:>6.3f} {p.value or 0:>10.1f} {len(p.runs):>4} "
            f"{peak:>8.2f}  {p.config.summary()}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--space", default="search_spaces/gpu_single.yaml")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--measured-steps", type=int, default=5)
    parser.add_argument("--target-interval", type=float, default=0.05)
    parser.add_argument("--max-measure-s", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--executor", default="local", choices=["local", "ray"])
    parser.add_argument(
        "--until-s",
        type=float,
        default=None,
        help="Stop before a run that might not end within this many seconds.",
    )
    parser.add_argument("--state", required=True, help="The partial recording (JSON).")
    parser.add_argument("--out", required=True, help="The finished landscape (JSON).")
    args = parser.parse_args()
    started = time.perf_counter()
    sys.path.insert(0, os.getcwd())

    from autotune.runner.platform import detect_platform, resolve_device

    platform = detect_platform(resolve_device(args.device))
    state_path = Path(args.state)
    if state_path.exists():
        state = _resumed(args, GridState.load(state_path))
    else:
        state = _start(args, platform)
    args.devices_used = state.devices
    spec = WorkloadSpec(model=state.workload, search_path=(os.getcwd(),))
    print(
        f"{state.workload} on {platform.device_name}: {len(state.configs)} configurations, "
        f"{state.runs_left()} runs left",
        flush=True,
    )
    live = Live(platform, spec, args, None, local=args.executor == "local")
    longest = max((r.total_s for runs in state.runs for r in runs), default=0.0)
    try:
        while (i := state.next_run()) is not None:
            elapsed = time.perf_counter() - started
            if args.until_s is not None and elapsed + 1.5 * longest > args.until_s:
                break
            run = live.run(state.configs[i])[1]
            state = state.with_run(i, run)
            state.save(state_path)
            longest = max(longest, run.total_s)
            print(
                f"  {state.runs_left():>3} left  {run.status:<8} "
                f"{run.samples_per_s or 0:>9.1f}/s {run.total_s:>5.1f} s  "
                f"{state.configs[i].summary()}",
                flush=True,
            )
    finally:
        live.close()
    if state.next_run() is not None:
        print(
            f"stopped with {state.runs_left()} runs left: run the same command again (it "
            f"resumes from {state_path})"
        )
        sys.exit(NOT_DONE)
    state.landscape().save(args.out)
    _summary(state)
    print(f"landscape: {args.out}")


if __name__ == "__main__":
    main()

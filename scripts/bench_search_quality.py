"""Search quality: does autotune find the true optimum, cheaply, ahead of today's heuristics?

    python scripts/bench_search_quality.py                       # live: every workload
    python scripts/bench_search_quality.py --workloads gpt       # live: one workload
    python scripts/bench_search_quality.py --judge                # the paired check of saved picks
    python scripts/bench_search_quality.py --fidelity             # the fidelity run of the pick

Live, per workload, every method on its own fresh Ray instance, timed from its start:
  grid       every valid configuration of the space measured once (the oracle); the top few
             feasible ones are then measured twice more so the optimum is not a lucky draw;
  autotune   the real search (probe, baseline, TPE proposals pruned against the incumbent,
             the race of the finalists, verification), all its runs counted;
  random     configurations drawn uniformly without repeats from the grid until it has used
             the wall time autotune took;
  bs-finder  largest micro-batch that fits, AMP on (Lightning / Accelerate finders);
  deepspeed  stages in order (DDP, then FSDP), largest micro-batch per stage by binary search,
             next stage only for a >= 5% gain (DeepSpeed's autotuner, fast mode);
  recipe     the standard recipe by hand (bf16, compile, DDP, largest micro-batch that fits...).
Each pick is judged by the grid's measurement of the same configuration (its median over
runs), so one lucky measurement neither helps nor hurts a method. The memory limit is the
middle of the widest gap in the grid's peak memory that leaves 20-90% of the configurations
under it (autotune.bench.landscape.memory_line), so it binds on any machine and run-to-run
memory noise cannot decide feasibility; every method is judged against it. Then the
recommendation runs --fidelity-factor times longer than a race run (on a warmed gang), and
every method's pick runs against the optimum in interleaved rounds: a paired ratio with its
interval, since the grid value of a point measured once is one noisy run (--judge does only
that, on saved results; --fidelity only the long run).

Writes the table to stdout, results/search_quality.json, results/search_quality.png (needs
matplotlib: pip install -e ".[bench]") and each grid as a landscape under results/landscapes/.
Replay of the landscapes: scripts/bench_search_replay.py and scripts/bench_replay_noise.py.
The library: autotune.bench.live (the methods) and autotune.bench.scoring (rows, targets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from autotune.bench.landscape import Landscape
from autotune.bench.live import (
    RACE_ROUNDS,
    TOP_K,
    VERIFY_FACTOR,
    WORKLOADS,
)
from autotune.bench.output import write_json
from autotune.bench.referee import run_fidelity, run_judge
from autotune.bench.scoring import targets
from autotune.bench.search_quality import benchmark_workload, plot
from autotune.config import TrainConfig
from autotune.runner.workload import WorkloadSpec


def print_time_split(split: dict[str, float]) -> None:
    total = sum(split.values()) or 1.0
    cells = ", ".join(f"{k} {v:.1f} s ({v / total:.0%})" for k, v in split.items())
    print(f"  autotune's wall time: {cells}")


def print_judge(judged: dict[str, Any]) -> None:
    cells = [
        f"{method} {row['ratio']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
        for method, row in judged["methods"].items()
        if "ratio" in row
    ]
    print(f"  paired against the optimum, {judged['rounds']} rounds: " + "; ".join(cells))


def print_table(name: str, result: dict[str, Any]) -> None:
    grid = result["grid"]
    print(
        f"\n{name}: {result['model']}, {grid['configs']} configs, optimum "
        f"{grid['optimum_samples_per_s']:.1f} samples/s ({grid['optimum']}), memory limit "
        f"{grid['memory_limit_bytes'] / 2**20:.0f} MiB ({grid['infeasible']} configs over it)"
    )
    print(
        f"  {'method':<10} {'samples/s':>9} {'of opt':>7} {'fits':>5} {'trials':>6} "
        f"{'wall s':>7} {'of grid':>7} {'in steps':>8}  pick"
    )
    for method, row in result["methods"].items():
        own = row["own_samples_per_s"]
        print(
            f"  {method:<10} {own if own is not None else float('nan'):>9.1f} "
            f"{row['ratio_to_optimum']:>7.3f} {'yes' if row['fits_budget'] else 'NO':>5} "
            f"{row['trials']:>6} {row['wall_s']:>7.1f} {row['wall_share']:>7.0%} "
            f"{row['measured_share']:>8.0%}  {row['pick']}"
        )
    if "time_split" in result["methods"]["autotune"]:
        print_time_split(result["methods"]["autotune"]["time_split"])
    f = result["fidelity"]
    error = f"{f['error']:+.1%}" if f["error"] is not None else "n/a"
    span = f.get("estimate_interval")
    inside = {True: "inside", False: "outside"}.get(f.get("long_run_in_interval"), "")
    band = f" [{span[0]:.1f}, {span[1]:.1f}], long run {inside} it" if span and inside else ""
    print(
        f"  fidelity: {f['steps']}-step run {f['long_run_samples_per_s'] or 0:.1f} samples/s vs "
        f"estimate {f['estimate_samples_per_s']:.1f}{band} ({error}); peak "
        f"{(f['peak_memory_bytes'] or 0) / 2**20:.0f} MiB of {f['memory_limit_bytes'] / 2**20:.0f}"
    )
    if "judge" in result:
        print_judge(result["judge"])
    missed = [k for k, ok in result["targets"].items() if not ok]
    print(f"  targets: {'all met' if not missed else 'MISSED ' + ', '.join(missed)}")


def live(args: argparse.Namespace) -> None:
    from autotune.runner.platform import detect_platform, resolve_device

    device = resolve_device(args.device)
    platform = detect_platform(device)
    args.devices_used = args.devices or (platform.device_count if device == "cuda" else 2)
    hardware = (
        f"{platform.device_name} x{platform.device_count}"
        if device == "cuda"
        else f"{platform.device_name}, {platform.cpu_count} cores"
    )
    machine = (
        f"{hardware}, torch {platform.torch_version}, {platform.backend}, {args.devices_used} ranks"
    )
    out_path, results = Path(args.out), {}
    if out_path.exists() and args.keep:
        results = json.loads(out_path.read_text()).get("workloads", {})
    for name in args.workloads:
        model, gbs = WORKLOADS[device][name]
        print(f"[{name}] {model} on {machine}", file=sys.stderr, flush=True)
        results[name] = benchmark_workload(name, model, gbs, platform, args, machine)
        print_table(name, results[name])
        write(out_path, args, machine, results)
    if plot(results, Path(args.plot)):
        print(f"\nplot: {args.plot}")
    print(f"results: {args.out}; landscapes: {args.landscapes}/")


def write(path: Path, args: argparse.Namespace, machine: str, results: dict[str, Any]) -> None:
    settings = {
        k: v for k, v in vars(args).items() if k in ("space", "warmup_steps", "measured_steps",
        "target_interval", "max_measure_s", "fidelity_factor",
        "tuner_trials", "seed")
    }  # fmt: skip
    data = {
        "machine": machine,
        "command": "python " + " ".join(sys.argv),
        "settings": {**settings, "top_k": TOP_K, "race_rounds": RACE_ROUNDS,
                     "verify_factor": VERIFY_FACTOR},
        "workloads": results,
    }  # fmt: skip
    write_json(path, data, indent=1)


def rerun(args: argparse.Namespace, what: str) -> None:
    """Run again, on the saved picks and landscapes, the paired check of the picks against the
    optimum (``what="judge"``) or the fidelity run of the tuner's pick (``"fidelity"``), and
    store it in --out."""
    from autotune.runner.platform import detect_platform

    out_path = Path(args.out)
    data = json.loads(out_path.read_text())
    for name, result in data["workloads"].items():
        if name not in args.workloads:
            continue
        landscape = Landscape.load(Path(args.landscapes) / f"{name}.json")
        platform = detect_platform(landscape.platform.device_type)
        spec = WorkloadSpec(model=result["model"], search_path=(os.getcwd(),))
        picks = {
            k: TrainConfig(**row["pick_config"]) if row["pick_config"] else None
            for k, row in result["methods"].items()
            if k != "grid"
        }
        print(f"[{name}] {what}", file=sys.stderr, flush=True)
        if what == "judge":
            result["judge"] = run_judge(platform, spec, args, landscape, picks)
        else:
            own = result["methods"]["autotune"]
            tuned, estimate = picks["autotune"], own["own_samples_per_s"]
            assert tuned is not None
            result["fidelity"] = run_fidelity(
                platform, spec, args, landscape, tuned, estimate, own.get("estimate_interval")
            )
            result["targets"] = targets(result["methods"], result["fidelity"])
        print_table(name, result)
        write_json(out_path, data, indent=1)
    print(f"results: {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["mlp", "convnet", "gpt"],
                        choices=["mlp", "convnet", "gpt"])  # fmt: skip
    parser.add_argument("--space", default="bench")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--devices", type=int, default=None)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--measured-steps", type=int, default=5,
                        help="The floor of every trial's adaptive window.")  # fmt: skip
    parser.add_argument(
        "--target-interval",
        type=float,
        default=0.05,
        help="Every trial's interval target (the tool's default: 0.03).",
    )
    parser.add_argument(
        "--max-measure-s",
        type=float,
        default=4.0,
        help="Every trial's longest window (the tool's default: 10 s).",
    )
    parser.add_argument("--fidelity-factor", type=int, default=20)
    parser.add_argument(
        "--tuner-trials",
        type=int,
        default=10,
        help="The tuner's search trials (its race and verification come on top).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="Keep other workloads in --out.")
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default="results/search_quality.png")
    parser.add_argument("--landscapes", default="results/landscapes")
    parser.add_argument(
        "--judge",
        action="store_true",
        help="Only the paired check of every method's pick against the optimum, added to --out.",
    )
    parser.add_argument(
        "--fidelity",
        action="store_true",
        help="Only the fidelity run of the tuner's saved pick, replacing it in --out.",
    )
    args = parser.parse_args()
    args.out = args.out or "results/search_quality.json"
    if args.judge or args.fidelity:
        rerun(args, "judge" if args.judge else "fidelity")
    else:
        live(args)


if __name__ == "__main__":
    main()

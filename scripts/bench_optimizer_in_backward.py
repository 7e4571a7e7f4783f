"""The optimizer stepped in backward (``optimizer_in_backward``) against the same optimizer
stepped after backward, on real models: the tensors' peak of a real step, the step traced
under fake tensors (what a plan predicts; its error), and the step's time.

    python scripts/bench_optimizer_in_backward.py [--cases workloads.gpt:gpt2_124m@1:ckpt ...] \
        [--rounds 3] [--steps 1] [--out results/optimizer_in_backward.json]

A case is ``model@micro_batch``, with ``:ckpt`` for every block checkpointed in full. The
saving is every gradient that a step after backward holds at its end, where that end is the
step's peak: a large model at a small micro-batch, its blocks checkpointed; where the peak
comes earlier, beside the activations, there is none. The time is this CPU's, the two measured
in turn in each of ``--rounds`` rounds and paired round by round (the noise of a 2-core machine,
10-33% run to run, lies on both alike). About 6 minutes on 2 cores for the default cases
(`gpt2_124m`'s step at 1,024 tokens takes 8-9 s here). With ``--device cuda`` (a lent GPU;
``--amp bf16``) the steps run there and the trace is for that GPU: where the per-parameter
steps' cost in speed can be told (``bash scripts/gpu_session.sh in-backward``).
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings

from autotune.bench.in_backward import measure, paired_ratio
from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json
from autotune.runner.workload import WorkloadSpec

CASES = (
    "workloads.gpt:gpt2_124m@1:ckpt",  # the step's end its peak: every gradient beside the state
    "workloads.gpt:gpt2_124m@1",  # the peak early in backward, beside the logits' activations
    "workloads.gpt:gpt_small@8",  # activations dominate: no saving
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--out", default="results/optimizer_in_backward.json")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--amp", default="off", choices=["off", "bf16"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    rows: list[dict[str, object]] = []
    report = {"machine": machine(), "rounds": args.rounds, "steps": args.steps, "rows": rows}
    report.update(device=args.device, amp=args.amp)
    if args.device == "cuda":
        import torch

        report["gpu"] = torch.cuda.get_device_name()
    report["paired"] = paired = []
    print(
        f"{'model':28} {'mbs':>3} {'blocks':>6} {'in bwd':>6} {'real MiB':>9} {'traced':>9} "
        f"{'error':>7} {'step s':>7}"
    )
    for case in args.cases:
        model, _, rest = case.partition("@")
        micro_batch, _, checkpoint = rest.partition(":")
        spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
        measured = measure(
            spec,
            int(micro_batch),
            checkpoint == "ckpt",
            args.rounds,
            args.steps,
            device=args.device,
            amp=args.amp,
        )
        for row in measured:
            rows.append(row.as_dict())
            print(
                f"{model:28} {row.micro_batch:3} {row.segments:6} {row.in_backward!s:>6} "
                f"{row.real_bytes / 2**20:9.1f} {row.traced_bytes / 2**20:9.1f} "
                f"{row.trace_error:+7.2%} {row.step_s:7.3f}"
            )
        after, during = sorted(measured, key=lambda r: r.in_backward)
        saved = 1 - during.real_bytes / after.real_bytes
        ratio, least, most = paired_ratio(measured)
        paired.append({"case": case, "saved": saved, "time_ratio": ratio, "range": [least, most]})
        print(
            f"  in backward: {saved:.1%} less held; step time {ratio:.2f}x after backward's "
            f"(rounds {least:.2f}-{most:.2f})"
        )
        write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

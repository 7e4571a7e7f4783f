"""Activation checkpointing's policies on real models: memory held and step time with nothing
checkpointed, every block checkpointed in full, and every block checkpointed selectively
(``checkpoint_policy=selective``: the outputs of matmuls, convolutions and fused attention kept).

    python scripts/bench_checkpoint_policy.py [--models workloads.gpt:gpt_small ...] \
        [--micro-batch 8] [--rounds 5] [--steps 3] [--out results/checkpoint_policy.json]

For each model and policy (``autotune.bench.checkpoint_policies.measure``): the tensors' peak of
a real step on this CPU (MemTracker's count), the same step traced under fake tensors (what a
plan predicts; its error against the real one), the step traced for an H100 in bf16 (a
prediction: no GPU here), and the step's time (forward, backward, AdamW), the three policies
measured in turn in each of ``--rounds`` rounds, with selective's time over full's paired round
by round. With ``--device cuda`` (a lent GPU; ``--amp bf16``) the steps run there, the trace
is for that GPU and no H100 is predicted. On a CPU the time is the CPU's: recomputation costs
what the CPU's kernels cost, and the noise of a 2-core machine (10-33% run to run) lies on
every column alike. About 15
minutes on 2 cores for the default models (Llama's steps take 11 s each); Hugging Face's tiny
GPT-2 and Llama take a minute and a half:

    python scripts/bench_checkpoint_policy.py --models examples.hf_models:gpt2_tiny \
        examples.hf_models:llama_tiny --out results/checkpoint_policy_tiny.json
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings

from autotune.bench.checkpoint_policies import measure, paired_ratio
from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json
from autotune.runner.workload import WorkloadSpec

MODELS = (
    "workloads.gpt:gpt_small",  # attention written by hand: bmm, masked_fill, softmax
    "examples.hf_models:llama_small",  # Hugging Face Llama, 200M: PyTorch's fused attention
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="results/checkpoint_policy.json")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--amp", default="off", choices=["off", "bf16"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # transformers' notes on its configs
    logging.disable(logging.WARNING)

    rows: list[dict[str, object]] = []
    report = {"machine": machine(), "micro_batch": args.micro_batch, "rounds": args.rounds}
    report.update(steps=args.steps, device=args.device, amp=args.amp, rows=rows, paired=[])
    if args.device == "cuda":
        import torch

        report["gpu"] = torch.cuda.get_device_name()
    print(
        f"{'model':32} {'policy':9} {'blocks':>6} {'real MiB':>9} {'traced':>9} {'error':>7} "
        f"{'H100 bf16':>10} {'step s':>7}"
    )
    for model in args.models:
        spec = WorkloadSpec(model=model, search_path=(os.getcwd(),))
        measured = measure(
            spec, args.micro_batch, args.rounds, args.steps, device=args.device, amp=args.amp
        )
        for row in measured:
            rows.append(row.as_dict())
            cuda = f"{row.cuda_bf16_bytes / 2**20:10.1f}" if row.cuda_bf16_bytes else "         -"
            print(
                f"{model:32} {row.policy:9} {row.segments:6} {row.real_bytes / 2**20:9.1f} "
                f"{row.traced_bytes / 2**20:9.1f} {row.trace_error:+7.2%} {cuda} "
                f"{row.step_s:7.3f}"
            )
        by = {r.policy: r for r in measured}
        kept = (by["selective"].real_bytes - by["full"].real_bytes) / (
            by["none"].real_bytes - by["full"].real_bytes
        )
        ratio, least, most = paired_ratio(measured, "selective", "full")
        against_none = paired_ratio(measured, "selective", "none")[0]
        report["paired"].append(  # type: ignore[union-attr]
            {
                "model": model,
                "selective_over_full_time": ratio,
                "range": [least, most],
                "selective_over_none_time": against_none,
                "selective_share_of_savings_given_back": kept,
            }
        )
        print(
            f"  selective: {kept:.0%} of full checkpointing's saving given back; step time "
            f"{ratio:.2f}x full's (rounds {least:.2f}-{most:.2f}), {against_none:.2f}x none's"
        )
        write_json(args.out, report, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

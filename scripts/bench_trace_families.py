"""A traced training step against a real one, for Hugging Face models of many families built
from tiny configs: how far the fake-tensor trace behind every memory prediction reaches on
models nobody here wrote, and where it stops.

    python scripts/bench_trace_families.py [--zoo tests.fixtures.hf_zoo tests.fixtures.hf_more] \
        [--families longformer opt ...] [--micro-batch 4] [--out results/trace_families.json]

Each family (``FAMILIES`` of each ``--zoo`` module: ``<module>:<family>`` builds the model,
``<module>:data_<family>`` its dataset) is traced at ``--micro-batch`` in fp32 with AdamW
(``autotune.runner.fake_memory.trace_step``), then one real step is run on its dataset's first
samples and its tensors' peak taken as MemTracker counts it
(``autotune.bench.traced_step.real_step_peak``). The error is (traced - real) / real; a family
the trace cannot follow prints the one line a search would say. "for CUDA" is the same step
traced for a CUDA device, also fp32: what CUDA's fused attention does not hold (no real step
checks it here). With ``--gpus h100 t4 [--gpu-amp bf16]`` each family is also traced for CUDA
as each named GPU runs it (``autotune plan --gpu``: before capability 8.0 bf16 attention takes
the math path), one column a GPU, and the table ends with how many each holds more or less than
the first. Needs the ``trainers`` extra (transformers); about a minute on 2 CPU cores for both
zoos, and about a minute more for each two GPUs named.

    python scripts/bench_trace_families.py --gpus h100 t4 --gpu-amp bf16 \
        --out results/trace_families_gpus.json

With ``--checkpoint full`` or ``selective`` every block of each model (or each call of the layer
it loops over) is checkpointed under that ``checkpoint_policy``, in the real step and the
trace alike (not with ``--gpus``):

    python scripts/bench_trace_families.py --checkpoint selective \
        --out results/trace_families_selective.json

With ``--in-backward`` the optimizer steps in backward (``optimizer_in_backward``), in the real
step and the trace alike:

    python scripts/bench_trace_families.py --checkpoint full --in-backward \
        --out results/trace_families_in_backward.json
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings

from autotune.bench.memory_prediction import machine
from autotune.bench.output import write_json
from autotune.bench.traced_step import as_row, check, traced_for_gpus
from autotune.runner.planned_gpu import GPUS
from autotune.runner.references import resolve_reference
from autotune.runner.workload import WorkloadSpec, put_on_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--zoo", nargs="+", default=["tests.fixtures.hf_zoo", "tests.fixtures.hf_more"]
    )
    parser.add_argument("--families", nargs="*", help="only these (default: every one)")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--out", default="results/trace_families.json")
    parser.add_argument("--gpus", nargs="*", default=[], choices=list(GPUS), metavar="GPU")
    parser.add_argument("--gpu-amp", default="off", choices=["off", "fp16", "bf16"])
    parser.add_argument(
        "--checkpoint",
        choices=["full", "selective"],
        help="every block (or looped layer's call) checkpointed under this checkpoint_policy",
    )
    parser.add_argument(
        "--in-backward", action="store_true", help="the optimizer stepped in backward"
    )
    args = parser.parse_args()
    if args.checkpoint and args.gpus:
        parser.error("--checkpoint traces no GPU's column: leave out --gpus")
    warnings.filterwarnings("ignore")  # transformers' notes on each tiny config
    logging.disable(logging.WARNING)

    here = (os.getcwd(),)
    specs = []
    for zoo in args.zoo:
        put_on_path(WorkloadSpec(model=f"{zoo}:FAMILIES", search_path=here))
        for family in resolve_reference(f"{zoo}:FAMILIES", "--zoo")[1]:
            if not args.families or family in args.families:
                model, data = f"{zoo}:{family}", f"{zoo}:data_{family}"
                specs.append(WorkloadSpec(model=model, data=data, search_path=here))

    rows = []
    report = {"machine": machine(), "micro_batch": args.micro_batch, "families": rows}
    report.update(gpus=args.gpus, gpu_amp=args.gpu_amp, checkpoint=args.checkpoint)
    report["in_backward"] = args.in_backward
    gpu_heads = "".join(f" {gpu + ' ' + args.gpu_amp:>12}" for gpu in args.gpus)
    print(
        f"{'model':40} {'traced':>10} {'real step':>10} {'error':>7} {'s':>5} {'for CUDA':>10}"
        + gpu_heads
    )
    for spec in specs:
        checked = check(spec, args.micro_batch, args.checkpoint, args.in_backward)
        rows.append(as_row(checked))
        if checked.error is None:
            print(f"{spec.model:40} stops: {checked.stop}")
            write_json(args.out, report, indent=2)
            continue
        peaks = traced_for_gpus(spec, args.micro_batch, args.gpu_amp, args.gpus)
        rows[-1]["traced_for_gpus_bytes"] = peaks
        traced, real = (checked.traced_bytes or 0) / 2**20, (checked.real_bytes or 0) / 2**20
        cuda = (checked.cuda or 0) / 2**20
        print(
            f"{spec.model:40} {traced:8.3f}Mi {real:8.3f}Mi {checked.error:+7.1%} "
            f"{checked.seconds:5.1f} {cuda:8.3f}Mi"
            + "".join(
                f" {p / 2**20:10.3f}Mi" if isinstance(p, int) else f" {'stops':>12}"
                for p in peaks.values()
            )
        )
        write_json(args.out, report, indent=2)
    traced = [r for r in rows if r["error"] is not None]
    within = sum(abs(r["error"]) <= 0.01 for r in traced)
    fused = sum(r["traced_for_cuda_bytes"] < 0.99 * r["traced_bytes"] for r in traced)
    scores = sum(r["traced_for_cuda_bytes"] > 1.01 * r["traced_bytes"] for r in traced)
    print(
        f"{len(traced)} of {len(rows)} traced, {within} of those within 1% of a real step; "
        f"{fused} hold more than 1% less traced for CUDA (its fused attention), {scores} more "
        f"(CUDA's math path where the CPU's flash kernel runs); wrote {args.out}"
    )
    peaks = [r["traced_for_gpus_bytes"] for r in traced] if args.gpus else []
    complete = [p for p in peaks if all(isinstance(v, int) for v in p.values())]
    stops = len(peaks) - len(complete)
    for gpu in args.gpus[1:]:
        first = args.gpus[0]
        both = [(p[first], p[gpu]) for p in complete]
        more = sum(b > 1.01 * a for a, b in both)
        less = sum(b < 0.99 * a for a, b in both)
        print(
            f"{gpu} against {first}, {args.gpu_amp}: {more} of {len(both)} hold more than 1% "
            f"more, {less} more than 1% less, {len(both) - more - less} within 1%"
            + (f"; {stops} stopped on one of them" if stops else "")
        )


if __name__ == "__main__":
    main()

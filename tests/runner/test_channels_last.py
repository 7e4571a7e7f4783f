"""channels_last: the weights and the image batches a step feeds the model are NHWC."""

from __future__ import annotations

import torch

from autotune.config import TrainConfig
from autotune.runner.loss import default_loss
from autotune.runner.training import TrainStep, prepare_model
from autotune.runner.workload import WorkloadSpec
from autotune.search.meta_build import feeds_images
from tests.fixtures.traced import SeesLayout


def _step(channels_last: bool) -> SeesLayout:
    config = TrainConfig(global_batch_size=4, device="cpu", channels_last=channels_last)
    model = SeesLayout()
    wrapped, hooks, _, _ = prepare_model(model, config, torch.device("cpu"))
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    step = TrainStep(wrapped, optimizer, default_loss, config, torch.device("cpu"), hooks)
    step.run(iter([(torch.randn(4, 3, 16, 16), torch.randint(0, 8, (4,)))]))
    return model


def test_the_input_and_the_weights_are_channels_last_only_when_asked() -> None:
    on, off = _step(True), _step(False)
    assert on.seen == [True] and off.seen == [False]
    assert on.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not off.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_the_probe_tells_image_models_from_others() -> None:
    assert feeds_images(WorkloadSpec(model="tests.fixtures.traced:SeesLayout")) is True
    assert feeds_images(WorkloadSpec(model="workloads.gpt:gpt_tiny")) is False


def test_the_probe_drops_it_for_a_model_not_fed_images_and_says_why() -> None:
    from autotune.search.probe import restrict_space
    from autotune.search.space import parse_space
    from tests.search.fakes import PLATFORM

    space = parse_space({"channels_last": [False, True]}, "test")
    kept, dropped = restrict_space(space, PLATFORM, 1, None, run_checks=False, image_batches=True)
    assert kept.params["channels_last"].choices == (False, True) and not dropped
    cut, dropped = restrict_space(space, PLATFORM, 1, None, run_checks=False, image_batches=False)
    assert cut.params["channels_last"].choices == (False,)
    assert dropped[0].reason == "the model is not fed 4-D image batches (N, C, H, W)"

"""The default loss pairs class scores with integer targets in either layout PyTorch knows."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from autotune.errors import WorkloadError
from autotune.runner.loss import class_dimension, default_loss


def test_pytorchs_layout_class_scores_in_dimension_1_is_understood() -> None:
    scores = torch.randn(8, 50, 16)  # a sequence model returning (batch, vocab, seq)
    target = torch.randint(0, 50, (8, 16))
    assert default_loss(scores, target) == pytest.approx(float(F.cross_entropy(scores, target)))


def test_the_hugging_face_layout_class_scores_last_still_holds() -> None:
    scores, target = torch.randn(8, 16, 50), torch.randint(0, 50, (8, 16))
    expected = F.cross_entropy(scores.flatten(0, 1), target.flatten())
    assert default_loss(scores, target) == pytest.approx(float(expected))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (N, C) is both layouts at once: nothing to say
        assert class_dimension((8, 10), (8,)) == -1


def test_when_both_layouts_fit_the_last_is_taken_and_said() -> None:
    with pytest.warns(UserWarning, match="taking the last"):
        assert class_dimension((4, 7, 7), (4, 7)) == -1


def test_when_neither_fits_it_says_so_in_one_line() -> None:
    with pytest.raises(WorkloadError, match=r"cannot pair the output \[8, 10, 3\]"):
        default_loss(torch.randn(8, 10, 3), torch.randint(0, 3, (8,)))


def test_a_regression_heads_column_is_compared_with_its_targets_not_broadcast() -> None:
    # A user's regressor returned (N, 1) against a target of (N,): mean squared error broadcast
    # them to (N, N), a wrong loss whose memory and time grow with the batch squared.
    output, target = torch.randn(32, 1), torch.randn(32)
    with pytest.warns(UserWarning, match=r"output \[32, 1\] compared with the target \[32\]"):
        loss = default_loss(output, target)
    assert loss == pytest.approx(float(F.mse_loss(output.squeeze(1), target)))
    assert default_loss.rule == (
        "mean squared error against the floating targets (the output's [32, 1] as their [32])"
    )
    column = target.unsqueeze(1)  # and the other way round: a target of (N, 1), an output (N,)
    with pytest.warns(UserWarning, match=r"output \[32\] compared with the target \[32, 1\]"):
        assert default_loss(target, column) == pytest.approx(0.0)
    same = torch.randn(8, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shapes that agree: nothing to say
        assert default_loss(same, same) == pytest.approx(0.0)
    with pytest.raises(WorkloadError, match=r"cannot pair the output \[8, 3\] with the floating"):
        default_loss(same, torch.randn(8, 1))


def test_a_dict_batchs_labels_are_the_target_and_stay_out_of_a_forward_that_takes_none() -> None:
    # A user's token model took input_ids and attention_mask; the dataset's samples held labels
    # too: every trial failed with "forward() got an unexpected keyword argument 'labels'".
    from autotune.runner.training import forward_keywords, split_batch
    from tests.fixtures.unused_keys import Tagger, Tokens

    model = Tagger()
    batch = {k: torch.stack([Tokens()[i][k] for i in range(4)]) for k in Tokens()[0]}
    accepts = forward_keywords(model)
    assert accepts == frozenset({"input_ids", "attention_mask"})
    assert forward_keywords(torch.nn.DataParallel(model)) is None  # a wrapper's takes anything
    args, kwargs, target = split_batch(batch, accepts)
    assert args == () and set(kwargs) == {"input_ids", "attention_mask"} and target is batch
    assert split_batch(batch)[1] is batch  # nothing known of the forward: every key passed
    other = {"x": batch["labels"]}  # none of its keys taken: the batch goes whole
    assert split_batch(other, accepts) == ((other,), {}, other)
    loss = default_loss(model(**kwargs), target)
    with torch.no_grad():
        expected = F.cross_entropy(model(**kwargs).flatten(0, 1), batch["labels"].flatten())
    assert float(loss) == pytest.approx(float(expected))
    assert "integer targets (the batch's 'labels')" in default_loss.rule
    scores = torch.randn(4, 3)
    named_y = {"x": scores, "y": torch.tensor([0, 1, 2, 0])}
    assert float(default_loss(scores, named_y)) == pytest.approx(
        float(F.cross_entropy(scores, named_y["y"]))
    )
    assert "(the batch's 'y')" in default_loss.rule
    default_loss(scores, {"x": scores})  # no target among the keys: the output's mean square
    assert default_loss.rule.startswith("the output's mean square")


def test_a_scalar_beside_the_scores_is_said_to_be_left_out() -> None:
    # a mixture's (logits, load-balancing loss): the loss from the target drops the second
    scores, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    aux = torch.tensor(0.3)
    loss = default_loss((scores, aux), target)
    assert float(loss) == pytest.approx(float(F.cross_entropy(scores, target)))
    assert default_loss.rule.endswith(
        "; the output's scalar item 1 is left out (an auxiliary loss? add it with --loss or "
        "autotune_loss)"
    )
    default_loss({"logits": scores, "aux_loss": aux}, target)
    assert "the output's scalar 'aux_loss' is left out" in default_loss.rule
    default_loss((scores, torch.randn(8, 3)), target)  # hidden states beside: nothing to say
    assert "left out" not in default_loss.rule


def test_scores_of_an_auxiliary_head_are_said_to_be_left_out() -> None:
    # torchvision's segmentation models in training return {"out", "aux"}, GoogLeNet and
    # Inception a named tuple of logits and aux_logits: torchvision's reference training adds
    # the auxiliary heads' losses, the default loss takes the first scores alone
    from collections import namedtuple

    masks, target = torch.randn(2, 5, 8, 8), torch.randint(0, 5, (2, 8, 8))
    loss = default_loss({"out": masks, "aux": torch.randn(2, 5, 8, 8)}, target)
    assert float(loss) == pytest.approx(float(F.cross_entropy(masks, target)))
    assert default_loss.rule.endswith(
        "; the output's 'aux', shaped as these scores, is left out (an auxiliary head's? add "
        "its loss with --loss or autotune_loss)"
    )
    Outputs = namedtuple("Outputs", ["logits", "aux_logits"])
    scores, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    default_loss(Outputs(scores, torch.randn(4, 3)), labels)
    assert "the output's 'aux_logits', shaped as these scores, is left out" in default_loss.rule
    default_loss(Outputs(scores, torch.randn(4, 3)), None)  # speed only: nothing to add
    assert "left out" not in default_loss.rule


def test_a_target_outside_the_classes_says_how_to_ignore_it() -> None:
    # a segmentation mask with VOC's border label, 255: "IndexError: Target 255 is out of
    # bounds." was all a trial said
    scores, mask = torch.randn(2, 21, 4, 4), torch.randint(0, 21, (2, 4, 4))
    mask[:, 0] = 255
    with pytest.raises(WorkloadError, match=r"21 classes met a target outside 0-20 .*--loss"):
        default_loss(scores, mask)
    with pytest.raises(WorkloadError, match="ignore_index=255"):
        default_loss(torch.randn(2, 5, 3), torch.full((2, 5), 7))  # class scores last

"""Recurrent layers under the memory trace: oneDNN's LSTM workspace, and packed sequences.

**The workspace.** On CPU, ``nn.LSTM`` in training runs each layer and direction as oneDNN's
``mkldnn_rnn_layer``, which keeps a workspace for backward as large as its gates and states
over every step (a 2-layer bidirectional LSTM of width 256 over 40 steps of 16 sequences: four
workspaces of 10-14 MB, 30-51% of the step's tensors). The op's fake kernel gives it no
elements, so the trace lay that much low. ``RecurrentWorkspace`` gives it its size, learnt
from the real kernel at four small shapes (4 and 8 steps by 4 and 8 sequences, zeros) of the
layer's own widths and dtype, affine in steps, sequences and their product (within 2-5% of
the real workspace at 3-200 steps and 3-64 sequences, widths 64-1,024, fp32 and bf16; a
dtype this CPU has no LSTM kernel for, fp16 here, takes fp32's, larger than bf16's by 40%). A
plan for CUDA devices counts this CPU workspace too: cuDNN's reserve space for the same layer
has not been measured against it.

**Packed sequences.** ``pack_padded_sequence`` keeps as many rows as the batch's lengths sum
to, and the layers over a ``PackedSequence`` (and ``pad_packed_sequence`` after them) read its
``batch_sizes``' values in C++, which a fake tensor does not have: the trace stopped.
``PackedSequences`` packs the batch as if every sequence had the mean length of the dataset's
first samples (those the traced batch is made of, as ``fake_routing`` reads the batch's
values) and runs the layer over that block unpacked, on the kernel torch would run over the
packed batch: over sequences of one length torch 2.13 runs oneDNN's layer, and the real step
holds what the unpacked layer holds (a 2-layer bidirectional LSTM: 84.63 MiB packed, 84.67
MiB unpacked); over mixed lengths (and in 2.11 over any) it runs its own kernel, with no
workspace, and so does a trace for a CPU (``packed_runs_onednn``): 6.2% under a real step
over lengths of 20-58 (the GRU 2.5%), where the block run as oneDNN's lay 49.8% over it. A
trace for CUDA runs every block as oneDNN's, its workspace standing in for cuDNN's reserve
space (not measured). Lengths the trace does not know leave the call to torch, and the trace
stops as before.

``torch._VF``'s functions, the oneDNN op and ``unset_fake_temporarily`` are private:
``tests/runner/test_fake_memory.py`` pins what is relied on (LSTMs plain and packed traced at
a real step's peak).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from autotune.runner.fake_routing import UniformRouting

_RECURRENT = {torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu}
"""The layers' functions; over a packed sequence their second argument is ``batch_sizes``."""
_LAYER = torch.ops.aten.mkldnn_rnn_layer.default
_CALIBRATION = ((4, 4), (4, 8), (8, 4), (8, 8))
"""(steps, sequences) at which the real kernel's workspace is measured."""


class RecurrentWorkspace(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Enter inside ``FakeTensorMode`` and below the memory tracker."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is _LAYER and not out[3].numel():
            steps, sequences, width = args[0].shape
            hidden, biases = args[10], args[12]
            size = workspace_bytes(width, hidden, args[0].dtype, biases, steps, sequences)
            elements = size // out[3].element_size()  # bytes, in the workspace's dtype
            out = (*out[:3], torch.empty(elements, dtype=out[3].dtype, device=out[3].device))
        return out


def workspace_bytes(
    width: int, hidden: int, dtype: torch.dtype, biases: bool, steps: int, sequences: int
) -> int:
    """The workspace of one LSTM layer and direction of ``width`` inputs and ``hidden`` units
    over ``steps`` x ``sequences``, as oneDNN on this machine sizes it (see the module)."""
    k, per_sequence, per_step, per_both = _workspace_fit(width, hidden, dtype, biases)
    size = k + per_sequence * sequences + per_step * steps + per_both * steps * sequences
    return max(0, round(size))


def measured_workspace(
    width: int, hidden: int, dtype: torch.dtype, biases: bool, steps: int, sequences: int
) -> int:
    """The bytes of the workspace the real kernel makes for one LSTM layer and direction over
    ``steps`` x ``sequences`` of zeros (outside any fake mode)."""

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype)

    gates = 4 * hidden
    out = _LAYER(
        zeros(steps, sequences, width), zeros(gates, width), zeros(gates, hidden),
        zeros(gates), zeros(gates), zeros(sequences, hidden), zeros(sequences, hidden),
        False, [], 2, hidden, 1, biases, False, False, True,
    )  # fmt: skip
    return int(out[3].numel() * out[3].element_size())


@functools.lru_cache(maxsize=64)
def _workspace_fit(
    width: int, hidden: int, dtype: torch.dtype, biases: bool
) -> tuple[float, float, float, float]:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        try:
            a, b, c, d = (
                measured_workspace(width, hidden, dtype, biases, *shape) for shape in _CALIBRATION
            )
        except RuntimeError:  # a dtype this CPU's oneDNN has no LSTM for (fp16 in a CUDA plan)
            if dtype is torch.float32:
                raise
            return _workspace_fit(width, hidden, torch.float32, biases)  # fp32's: more
    (t0, s0), (_, s1), (t1, _), _ = _CALIBRATION
    per_both = (d - b - c + a) / ((t1 - t0) * (s1 - s0))
    per_sequence = (b - a) / (s1 - s0) - per_both * t0
    per_step = (c - a) / (t1 - t0) - per_both * s0
    k = a - per_sequence * s0 - per_step * t0 - per_both * t0 * s0
    return k, per_sequence, per_step, per_both


@contextlib.contextmanager
def _onednn(enabled: bool) -> Iterator[None]:
    """oneDNN's kernels on or off while entered (``torch.backends.mkldnn.flags`` would also set
    its TF32 flag, and warn of Intel GPUs)."""
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = enabled  # type: ignore[assignment]  # a module property
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


@functools.cache
def packed_runs_onednn() -> bool:
    """Whether this torch runs an LSTM over a packed sequence of one length, in training, as
    oneDNN's layer, which keeps its workspace (2.13 does; 2.11 runs its own kernel, which keeps
    none, as 2.13 does over mixed lengths): a small real one, its ops watched, outside any fake
    mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    seen: list[Any] = []

    class Watch(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with unset_fake_temporarily(), torch.enable_grad():
        layer = torch.nn.LSTM(4, 4)
        lengths = torch.tensor([3, 3])
        packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(3, 2, 4), lengths)
        with Watch():  # type: ignore[no-untyped-call]
            layer(packed)
    return _LAYER in seen


class PackedSequences(TorchFunctionMode):
    """Enter inside ``FakeTensorMode``, with the trace's ``UniformRouting`` (see the module)."""

    def __init__(self, routing: UniformRouting, cpu: bool = True) -> None:
        super().__init__()
        self.routing = routing
        self.blocks: Any = WeakIdKeyDictionary()  # batch_sizes -> (sequences, length, kernel)
        # A trace for CUDA keeps oneDNN's workspace as the stand-in for cuDNN's reserve space
        # (see the module); for a CPU, the kernel torch runs (before the trace's modes: a real
        # layer)
        self.onednn_one_length = packed_runs_onednn() if cpu else True
        self.onednn_mixed = not cpu

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch._VF._pack_padded_sequence:
            packed = self._pack(*args, **kwargs)
            if packed is not None:
                return packed
        elif func in _RECURRENT and isinstance(args[1], torch.Tensor) and args[1] in self.blocks:
            return self._recur(func, *args)
        elif func is torch._VF._pad_packed_sequence and args[1] in self.blocks:
            return self._pad(*args, **kwargs)
        return func(*args, **kwargs)

    def _pack(self, padded: Any, lengths: Any, batch_first: bool) -> tuple[Any, Any] | None:
        """The packed data of sequences all of the mean length, and ``batch_sizes`` as long as
        the longest (the steps ``pad_packed_sequence`` gives back)."""
        steps = padded.shape[1] if batch_first else padded.shape[0]
        known = self.routing.lengths(lengths)
        if known is None:
            return None
        length = max(1, min(steps, round(float(np.mean(known)))))
        longest = max(length, min(steps, int(np.max(known))))
        time_major = padded.transpose(0, 1) if batch_first else padded
        sequences = time_major.shape[1]
        data = time_major[:length].reshape(length * sequences, *time_major.shape[2:])
        # made from constants, so its values have a shadow (fake_shadows): batch_sizes[0] is read
        batch_sizes = torch.full((longest,), sequences, dtype=torch.int64)
        # the kernel torch gives such lengths (oneDNN's where all are one, on 2.13), for a CPU
        one_length = int(np.min(known)) == int(np.max(known))
        onednn = self.onednn_one_length if one_length else self.onednn_mixed
        self.blocks[batch_sizes] = (sequences, length, onednn)
        return data, batch_sizes

    def _recur(self, func: Any, data: Any, batch_sizes: Any, hx: Any, *rest: Any) -> Any:
        sequences, length, onednn = self.blocks[batch_sizes]
        block = data.reshape(length, sequences, *data.shape[1:])
        with _onednn(onednn):  # else torch's own kernel, as over packed data
            out, *hidden = func(block, hx, *rest, False)  # time-major, as packed data is
        return (out.reshape(length * sequences, *out.shape[2:]), *hidden)

    def _pad(
        self, data: Any, batch_sizes: Any, batch_first: bool, value: float, steps: int
    ) -> tuple[Any, Any]:
        sequences, length, _ = self.blocks[batch_sizes]
        out = data.new_full((max(int(steps), length), sequences, *data.shape[1:]), value)
        out[:length] = data.reshape(length, sequences, *data.shape[1:])
        lengths = torch.full((sequences,), length, dtype=torch.int64)
        return (out.transpose(0, 1) if batch_first else out), lengths

"""Launcher for argmax.cu: greedy sampling on the device (one block for
small vocabularies, many that the last to finish reduces for large ones);
-1 when a logit is not finite. In decode it also advances the step's
token and position (``feed``)."""

from __future__ import annotations

import numpy as np

from .. import launch
from ..device import DArray, Device


ARGMAX_ONE_BLOCK = 32768  # below this one block is as fast as two passes


def argmax(dev: Device, x: DArray, out: DArray, scratch: DArray | None = None,
           feed: tuple[DArray, DArray] | None = None, history: DArray | None = None) -> None:
    """out[0] (int32, device) = index of the largest element of x, lowest
    index among ties (np.argmax). ``feed`` (token, pos), the decode step's
    inputs: the same launch then sets token = out (0 where out is -1) and
    pos += 1, and history[pos] = out before that where ``history`` is given."""
    launch.check_f32(x)
    assert out.dtype == np.int32 and (history is None or (feed is not None and history.dtype == np.int32))
    token, pos = feed if feed is not None else (launch.null(), launch.null())
    history = launch.null_or(history)
    n = x.size
    if n <= ARGMAX_ONE_BLOCK:
        dev.launch(launch.function(dev, "argmax.cu", "argmax"), (1,), (1024,), [x, n, out, token, pos, history])
        return
    # ~8 elements per thread in 256-thread blocks, at most ~4 blocks per SM.
    nb = min(launch.ceil_div(n, 2048), 4 * dev.sm_count)
    buf = scratch if scratch is not None else launch.scratch(dev, "argmax", 8 * nb)
    assert buf.nbytes >= 8 * nb
    part_val = DArray(buf.ptr, (nb,), np.dtype(np.float32), dev)
    part_idx = DArray(buf.ptr + 4 * nb, (nb,), np.dtype(np.int32), dev)
    ticket = launch.counter(dev, "argmax")  # the last block reduces the partials
    dev.launch(launch.function(dev, "argmax.cu", "argmax_blocks"), (nb,), (256,),
               [x, n, part_val, part_idx, ticket, out, token, pos, history])

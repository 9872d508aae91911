"""Launcher for decode.cu: the last kernel of a captured decode step feeds
its own greedy choice back in as the next step's token and position."""

from __future__ import annotations

from .. import launch
from ..device import DArray, Device


def advance(dev: Device, next_token: DArray, token: DArray, pos: DArray) -> None:
    """token = next_token; pos += 1 (one thread, on the device)."""
    dev.launch(launch.function(dev, "decode.cu", "advance"), (1,), (1,), (next_token, token, pos))

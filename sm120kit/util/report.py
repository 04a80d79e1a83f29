"""The callbacks core code reports through, so that it never prints: the CLI passes ones built from its
console (``sm120kit.ui``), a library caller passes its own or none.

- ``progress(done, total, label)``: ``done`` of ``total`` items of a long step are finished; ``label`` names
  the last one.
- ``on_step(text)``: a line saying what a long step is about to do ("downloading ...").
- ``on_debug(text)``: detail for ``-v`` only (commands run, what was repaired).
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int, int, str], None]
Step = Callable[[str], None]


def tell(callback: Step | None, text: str) -> None:
    """``callback(text)`` when there is a callback."""
    if callback is not None:
        callback(text)

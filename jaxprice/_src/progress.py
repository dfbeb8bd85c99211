"""Progress on long runs, for the command line and experiments/ (never library code).

``Progress(total, label)`` draws one line on stderr, redrawn in place on a terminal and
written every 10% otherwise (so CI logs stay short):

    fit  [##########..........]  52/100  1.3 s  eta 1.2 s  loss 0.0412

Library code reports progress through a callback (``callback(done, total, **info)``); the
CLI passes ``Progress(...).update`` as that callback.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on a stream (stderr by default)."""

    def __init__(self, total: int, label: str = "", *, stream=None, width: int = 20, enabled: bool = True):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.enabled = enabled
        self.start = time.perf_counter()
        self.done = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_decile = -1
        self._closed = False

    def update(self, done: int | None = None, total: int | None = None, **info) -> None:
        """Set the count (or add one when ``done`` is None) and redraw; ``info`` is shown as
        ``key value`` pairs (floats with 4 significant digits)."""
        if total is not None:
            self.total = max(int(total), 0)
        self.done = self.done + 1 if done is None else int(done)
        if not self.enabled:
            return
        frac = self.done / self.total if self.total else 1.0
        decile = int(frac * 10)
        if not self._tty and decile == self._last_decile and self.done < self.total:
            return
        self._last_decile = decile
        self._draw(frac, info)

    def _draw(self, frac, info):
        elapsed = time.perf_counter() - self.start
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        eta = f"  eta {elapsed / frac - elapsed:.1f} s" if 0 < frac < 1 else ""
        extra = "".join(f"  {k} {v:.4g}" if isinstance(v, float) else f"  {k} {v}" for k, v in info.items())
        line = f"{self.label}  [{bar}]  {self.done}/{self.total}  {elapsed:.1f} s{eta}{extra}"
        if self._tty:
            self.stream.write("\r" + line + "\033[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line (on a terminal); safe to call twice."""
        if self.enabled and self._tty and not self._closed:
            self.stream.write("\n")
            self.stream.flush()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

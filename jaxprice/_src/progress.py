"""Progress on long runs, for the command line and experiments/ (never library code).

``Progress(total, label)`` draws one line on stderr, redrawn in place on a terminal; elsewhere
(a log, CI) it writes a line when the run starts, then at most one every ``interval`` seconds as
the count crosses a tenth, and the last state at close, so logs stay short however many stages
a run has:

    fit  [##########..........]  52/100  1.3 s  eta 1.2 s  loss 0.0412

A run may go through stages: an update whose ``total`` differs from the current one, or whose
count goes down, starts a new stage; the elapsed time is the run's, the eta the stage's.

Library code reports progress through a callback (``callback(done, total, **info)``); the
CLI passes ``Progress(...).update`` as that callback.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on a stream (stderr by default)."""

    def __init__(self, total: int, label: str = "", *, stream=None, width: int = 20, enabled: bool = True,
                 interval: float = 2.0, clock=time.perf_counter):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.enabled = enabled
        self.interval = interval
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stage_start = self.start
        self._last_update = self.start
        self._last_decile = -1
        self._last_written = None          # time of the last line written (not on a terminal)
        self._pending = None               # the newest state not yet written (not on a terminal)
        self._closed = False

    def update(self, done: int | None = None, total: int | None = None, **info) -> None:
        """Set the count (or add one when ``done`` is None) and redraw; ``info`` is shown as
        ``key value`` pairs (floats with 4 significant digits)."""
        now = self.clock()
        new_done = self.done + 1 if done is None else int(done)
        new_total = self.total if total is None else max(int(total), 0)
        if new_total != self.total or new_done < self.done:      # a new stage: its eta starts now
            self._stage_start, self._last_decile = self._last_update, -1
        self.total, self.done, self._last_update = new_total, new_done, now
        if not self.enabled:
            return
        frac = self.done / self.total if self.total else 1.0
        line = self._line(frac, info, now)
        if self._tty:
            self.stream.write("\r" + line + "\033[K")
            self.stream.flush()
            return
        decile = int(frac * 10)
        due = self._last_written is None or now - self._last_written >= self.interval
        if decile != self._last_decile and due:
            self._last_decile, self._last_written, self._pending = decile, now, None
            self.stream.write(line + "\n")
            self.stream.flush()
        else:
            self._pending = line

    def _line(self, frac, info, now) -> str:
        elapsed = now - self.start
        stage = now - self._stage_start
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        eta = f"  eta {stage / frac - stage:.1f} s" if 0 < frac < 1 else ""
        extra = "".join(f"  {k} {v:.4g}" if isinstance(v, float) else f"  {k} {v}" for k, v in info.items())
        return f"{self.label}  [{bar}]  {self.done}/{self.total}  {elapsed:.1f} s{eta}{extra}"

    def close(self) -> None:
        """End the line (on a terminal) or write the last state not yet written; safe to call twice."""
        if self.enabled and not self._closed:
            if self._tty:
                self.stream.write("\n")
            elif self._pending is not None:
                self.stream.write(self._pending + "\n")
            self.stream.flush()
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

"""The progress line (jaxprice/_src/progress.py) on a log and on a terminal, with a fake clock."""

import io

from jaxprice._src.progress import Progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def lines(stream):
    return stream.getvalue().splitlines()


def test_a_log_gets_the_start_a_line_per_interval_and_the_end():
    """100 updates 0.125 s apart (12.5 s): the first, then one per 2 s (every 16 updates, each in a
    new tenth), then the last at close: 8 lines, not one per tenth of every stage."""
    out, clock = io.StringIO(), Clock()
    with Progress(100, "fit", stream=out, clock=clock) as bar:
        for _ in range(100):
            clock.t += 0.125
            bar.update(loss=0.5)
    got = lines(out)
    assert got[0].startswith("fit  [....................]  1/100  0.1 s")
    assert [g.split()[2] for g in got] == [f"{n}/100" for n in (1, 17, 33, 49, 65, 81, 97, 100)]
    assert got[-1] == "fit  [####################]  100/100  12.5 s  loss 0.5"


def test_stages_restart_the_eta_not_the_elapsed_time():
    """A second stage (total changes) 10 s in: its eta counts from its own start. By hand: stage 2
    is 1 of 4 done 1 s after it began -> eta 3 s; elapsed 11 s."""
    out, clock = Tty(), Clock()
    bar = Progress(2, "size", stream=out, clock=clock)
    clock.t = 5.0
    bar.update(1, 2)
    clock.t = 10.0
    bar.update(2, 2)
    clock.t = 11.0
    bar.update(1, 4, stage="simulate")
    last = out.getvalue().split("\r")[-1]
    assert last == "size  [#####...............]  1/4  11.0 s  eta 3.0 s  stage simulate\x1b[K"
    bar.close()
    assert out.getvalue().endswith("\n")


def test_a_terminal_redraws_in_place_and_disabled_writes_nothing():
    out, clock = Tty(), Clock()
    with Progress(3, "serve", stream=out, clock=clock) as bar:
        for _ in range(3):
            clock.t += 1.0
            bar.update()
    assert out.getvalue().count("\r") == 3 and out.getvalue().count("\n") == 1
    quiet = io.StringIO()
    with Progress(3, "serve", stream=quiet, enabled=False) as bar:
        bar.update()
    assert quiet.getvalue() == "" and bar.done == 1

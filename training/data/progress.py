"""How far tokenizing a corpus has come: tqdm's bar on a terminal; in a job's log a line every INTERVAL
seconds, so that the log is not one line redrawn thousands of times."""

import sys
import time


INTERVAL = 15.0  # seconds between two lines in a log


class Progress:
    """`update(done)` with the amount done so far (bytes, or rows with
    `unit="rows"`), `close()` at the end."""

    def __init__(self, total: int, what: str, say, unit: str = "B", stream=None):
        self.total, self.what, self.say, self.unit = max(total, 1), what, say, unit
        self.started = self.last_line = time.monotonic()
        self.done = 0
        stream = stream or sys.stderr
        self.bar = None
        if stream.isatty():
            from tqdm.auto import tqdm

            scale = {"unit_scale": True, "unit_divisor": 1000} if unit == "B" else {}
            self.bar = tqdm(total=total, desc=what, unit=unit, file=stream, **scale)

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done
        now = time.monotonic()
        if self.bar is None and now - self.last_line >= INTERVAL:
            self.last_line = now
            self.say(f"{self.what}: {self.line(now)}")

    def line(self, now: float) -> str:
        seconds = max(now - self.started, 1e-9)
        rate = self.done / seconds
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        return (f"{amount(self.done, self.unit)} of {amount(self.total, self.unit)} "
                f"({100 * self.done / self.total:.0f}%), {amount(rate, self.unit)}/s, {duration(left)} left")

    def close(self) -> float:
        """Closes the bar; returns the seconds it ran."""
        if self.bar is not None:
            self.bar.close()
        return time.monotonic() - self.started


def amount(value: float, unit: str) -> str:
    return f"{value / 1e6:,.1f} MB" if unit == "B" else f"{value:,.0f} {unit}"


def duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "unknown time"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    )

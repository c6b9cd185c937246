"""Fan policy (pure): a temperature-to-duty table, and the vendor raw command that applies a duty."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FanCurve:
    points: tuple[tuple[float, int], ...]  # (celsius, duty percent), ascending

    def __post_init__(self):
        temps = [t for t, _ in self.points]
        if not self.points or temps != sorted(temps) or any(not 0 <= d <= 100 for _, d in self.points):
            raise ValueError("a fan curve needs points in ascending temperature with duties from 0 to 100")

    def duty(self, celsius: float) -> int:
        pts = self.points
        if celsius <= pts[0][0]:
            return pts[0][1]
        for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
            if celsius <= t1:
                return round(d0 + (d1 - d0) * (celsius - t0) / (t1 - t0))
        return pts[-1][1]


@dataclass(frozen=True)
class RawFanCommand:
    """A vendor's "set fan duty" raw command, e.g. netfn 0x30 cmd 0x70 data "0x66 0x01 0x00 {duty}"."""

    netfn: int
    command: int
    data_template: str

    def render(self, duty: int) -> tuple[int, tuple[int, ...]]:
        return self.command, tuple(int(tok.format(duty=duty), 0) for tok in self.data_template.split())

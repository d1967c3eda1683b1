"""The step stats between two reports of a training run, and the ``train`` record of ``--metrics`` they make:
loss, samples/s, ms per step and per phase, the summed counters, hot-lookup and popular-sample shares."""

from __future__ import annotations

import time

from hotline.tiers.base import StepStats


class StepWindow:
    """Accumulates step stats between two reports (and over a whole run: the summary's measured figures)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self._losses: list = []  # floats, or DeferredLoss read only when the window reports
        self.samples = 0
        self.steps = 0
        self.times: dict[str, float] = {}
        self.counters: dict[str, float] = {}

    def add(self, s: StepStats) -> None:
        self._losses.append(s.loss_sum)
        self.samples += s.samples
        self.steps += 1
        for k, v in s.times.items():
            self.times[k] = self.times.get(k, 0.0) + v
        for k, v in s.counters.items():
            self.counters[k] = self.counters.get(k, 0.0) + v

    def report(self, step: int) -> dict:
        from hotline.pipeline.executor import overlap_ratio

        elapsed = time.perf_counter() - self.start
        steps = max(self.steps, 1)
        rec = {
            "kind": "train",
            "step": step,
            "loss": sum(float(x) for x in self._losses) / max(self.samples, 1),
            "samples_per_s": self.samples / elapsed if elapsed > 0 else 0.0,
            "window_steps": self.steps,  # steps since the previous record: time_s / window_steps = per step
            "ms_per_step": 1e3 * elapsed / steps,
            "phase_ms_per_step": {k: round(1e3 * v / steps, 6) for k, v in self.times.items()},
            "time_s": {k: round(v, 6) for k, v in self.times.items()},
            **{k: v for k, v in self.counters.items()},
        }
        if "popular_samples" in self.counters:
            rec["popular_sample_share"] = self.counters["popular_samples"] / max(self.samples, 1)
        if self.counters.get("lookups"):  # tiered modes: the share of this window's lookups that hit hot rows
            rec["hot_lookup_share"] = self.counters["hot_lookups"] / self.counters["lookups"]
        if "stall" in self.times:
            rec["overlap_ratio"] = overlap_ratio(self.times)
        return rec

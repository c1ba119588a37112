"""``/metrics`` in Prometheus's text format, with the official client: the controller's figures
(rota.controller.metrics_view) and the projection's (its lag, GPU-seconds used per user and account)."""
from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Figures:
    """A one-shot collector over figures already gathered (a scrape reads the cluster once)."""

    def __init__(self, fig: dict, proj: dict, per_user: bool) -> None:
        self.fig, self.proj, self.per_user = fig, proj, per_user

    def collect(self) -> Iterator[Metric]:
        fig, proj = self.fig, self.proj
        queue = GaugeMetricFamily("rota_queue_jobs", "Pending jobs by partition and pending reason",
                                  labels=["partition", "reason"])
        for part, reason, n in fig["queue"]:
            queue.add_metric([part, reason], n)
        yield queue
        jobs = GaugeMetricFamily("rota_jobs", "Jobs the controller holds, by state", labels=["state"])
        jobs.add_metric(["pending"], fig["pending"])
        jobs.add_metric(["running"], fig["running"])
        yield jobs
        gpus = GaugeMetricFamily("rota_gpus", "GPUs by what they are doing: allocated, idle (free and usable), "
                                 "drained or down (free and unusable)", labels=["state"])
        for state, n in sorted(fig["gpus"].items()):
            gpus.add_metric([state], n)
        yield gpus
        yield GaugeMetricFamily("rota_gpus_allocated_unused", "Allocated GPUs of jobs their agents report idle",
                                value=fig["gpus_allocated_unused"])
        c = fig["cycle"]
        yield HistogramMetricFamily("rota_cycle_duration_seconds", "Scheduling cycles' durations",
                                    buckets=[*((repr(float(b)), n) for b, n in zip(c["buckets"], c["counts"])),
                                             ("+Inf", c["count"])], sum_value=c["sum"])
        yield CounterMetricFamily("rota_events_appended", "Events on the log (its last sequence)", value=fig["seq"])
        yield GaugeMetricFamily("rota_controller_leader", "1 while this controller leads", value=int(fig["leader"]))
        yield from self._lag(fig, proj)
        beat = GaugeMetricFamily("rota_agent_heartbeat_age_seconds", "Seconds since each node's agent was last heard",
                                 labels=["node"])
        for node, age in fig["heartbeat_age"].items():
            beat.add_metric([node], age)
        yield beat
        if self.per_user:
            yield from self._per_user(fig, proj)

    @staticmethod
    def _lag(fig: dict, proj: dict) -> Iterator[Metric]:
        yield GaugeMetricFamily("rota_projection_lag_events", "Events on the log the projection has not folded yet",
                                value=max(0, fig["seq"] - proj["seq"]))
        yield GaugeMetricFamily("rota_projection_lag_seconds", "Log time between the newest event and the "
                                "projection's", value=max(0, fig["log_time"] - proj["now"]) if proj["seq"] else 0)

    @staticmethod
    def _per_user(fig: dict, proj: dict) -> Iterator[Metric]:
        running = GaugeMetricFamily("rota_user_jobs_running", "Running jobs per user and account",
                                    labels=["user", "account"])
        held = GaugeMetricFamily("rota_user_gpus_allocated", "GPUs held by running jobs per user and account",
                                 labels=["user", "account"])
        for user, account, n, g in fig["running_by"]:
            running.add_metric([user, account], n)
            held.add_metric([user, account], g)
        yield running
        yield held
        used = CounterMetricFamily("rota_user_gpu_seconds", "GPU-seconds (GPU-hours x 3600) used by ended runs, per "
                                   "user and account", labels=["user", "account"])
        for user, account, seconds in proj["gpu_seconds"]:
            used.add_metric([user, account], seconds)
        yield used


def exposition(fig: dict, proj: dict, per_user: bool) -> bytes:
    """The scrape's text: ``fig`` the controller's figures, ``proj`` {seq, now, gpu_seconds: [(user, account,
    seconds)]}; ``per_user``: with the per-user series (not where jobs or usage are private)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(fig, proj, per_user))
    return generate_latest(registry)


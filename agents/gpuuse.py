"""How a node's jobs use their GPUs: sampled through NVML, idleness reported with the samples that show it.

Every ``every`` seconds each running job's GPUs are read (utilisation, memory in use). A job whose GPUs all
stayed at or under ``IDLE_UTIL`` percent for ``report_after`` seconds is reported idle (GpuIdle, with its
latest samples, from when the idleness began); once reported, the first busy sample reports it busy again
(GpuBusy). What happens to an idle job is the cluster's policy (rota.core.idle), not the agent's.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from rota.core import events as ev

IDLE_UTIL = 1           # percent: at or under it a GPU does no work
KEPT = 6                # samples kept a GPU (the evidence a report carries)


@dataclass
class Track:
    """One run's GPU use: since when it is idle (None: busy), its latest samples, whether reported idle."""

    restarts: int
    since: int | None = None
    samples: deque = field(default_factory=deque)
    reported: bool = False


class GpuUse:
    """Turns samples of the running jobs' GPUs into GpuIdle and GpuBusy reports."""

    def __init__(self, node: str, read: Callable[[int], tuple[int, int] | None], report_after: float) -> None:
        """``read``: a GPU index's (utilisation percent, memory MiB), None when NVML cannot say."""
        self.node, self.read, self.report_after = node, read, report_after
        self.tracks: dict[int, Track] = {}

    def sample(self, runs: dict[int, Any], now: int) -> list[ev.GpuIdle | ev.GpuBusy]:
        """Read each running job's GPUs (``runs``: job id -> its run, with the launch ``order``); the reports due."""
        out: list[ev.GpuIdle | ev.GpuBusy] = []
        for jid in [j for j in self.tracks if j not in runs]:
            del self.tracks[jid]
        for jid, run in runs.items():
            order = run.order
            if not order.gpus:
                continue
            track = self.tracks.get(jid)
            if track is None or track.restarts != order.restarts:
                track = self.tracks[jid] = Track(order.restarts, samples=deque(maxlen=KEPT * len(order.gpus)))
            readings = [(g, self.read(g)) for g in order.gpus]
            if any(r is None for _, r in readings):
                continue            # a GPU NVML cannot read: no verdict (health reports the GPU itself)
            idle = True
            for g, r in readings:
                assert r is not None
                track.samples.append(ev.GpuSample(t=now, gpu=g, util=r[0], mem=r[1]))
                idle = idle and r[0] <= IDLE_UTIL
            out.extend(self._verdict(jid, track, idle, now))
        return out

    def _verdict(self, jid: int, track: Track, idle: bool, now: int) -> list[ev.GpuIdle | ev.GpuBusy]:
        if not idle:
            track.since = None
            if track.reported:
                track.reported = False
                return [ev.GpuBusy(node=self.node, job_id=jid, restarts=track.restarts)]
            return []
        if track.since is None:
            track.since = now
        if not track.reported and now - track.since >= self.report_after:
            track.reported = True
            return [ev.GpuIdle(node=self.node, job_id=jid, restarts=track.restarts, since=track.since,
                               samples=tuple(s for s in track.samples if s.t >= track.since))]
        return []

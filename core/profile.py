"""Per-node availability over time, and the earliest-start searches backfill is built on (pure).

A :class:`Timeline` is a step function of a node's free CPUs, memory and GPUs from ``now`` on:
``times[i]`` starts segment ``i`` whose free amounts are ``fc[i]``, ``fm[i]``, ``fg[i]``; the
last segment lasts forever. Reservations subtract from it; ``version`` counts changes so cached
search results can be checked for staleness.

:class:`ShapeSearch` answers "where and when can the next job of this exact shape start?" for
many jobs of one shape in priority order. It keeps a heap of per-node earliest starts that are
recomputed lazily when a node's timeline changed. Two facts make it fast and exact:
capacity only ever shrinks during a cycle (so a cached earliest start is a lower bound), and a
later job of the same shape and duration can never start before an earlier one (so the last
placement is a lower bound for the next).
"""
from __future__ import annotations

from bisect import bisect_right
from heapq import heapify, heappop, heappush, heapreplace

INF = 1 << 62
UNLIMITED_DURATION = 1 << 60


class Timeline:
    __slots__ = ("name", "idx", "weight", "cap_c", "cap_m", "cap_g", "times", "fc", "fm", "fg",
                 "fgt", "version", "items", "owned", "log")

    def __init__(self, name: str, idx: int, weight: int, cap_c: int, cap_m: int, cap_g: int,
                 now: int, free_c: int, free_m: int, free_g: int,
                 free_by_type: dict[str, int] | None,
                 releases: list[tuple[int, int, int, int, dict[str, int] | None]]) -> None:
        self.name, self.idx, self.weight = name, idx, weight
        self.cap_c, self.cap_m, self.cap_g = cap_c, cap_m, cap_g
        self.version = 0
        self.items: list[tuple[int, int, int, str]] | None = None   # (start, end, job, kind)
        self.owned = True           # its free amounts are its own (a moved copy shares them until it changes)
        self.log: list[int] | None = None     # the cycle's record of the node (index) each booking changed
        times = [now]
        fc, fm, fg = [free_c], [free_m], [free_g]
        fgt = None if free_by_type is None else {t: [v] for t, v in free_by_type.items()}
        releases.sort(key=lambda r: r[0])
        for end, c, m, g, by_type in releases:
            if end <= now:
                end = now + 1   # still running past its limit: free "soon", never "now"
            if end != times[-1]:
                times.append(end)
                fc.append(fc[-1])
                fm.append(fm[-1])
                fg.append(fg[-1])
                if fgt is not None:
                    for arr in fgt.values():
                        arr.append(arr[-1])
            fc[-1] += c
            fm[-1] += m
            fg[-1] += g
            if fgt is not None and by_type:
                for t, v in by_type.items():
                    fgt[t][-1] += v
        self.times, self.fc, self.fm, self.fg, self.fgt = times, fc, fm, fg, fgt

    def moved_to(self, now: int) -> "Timeline | None":
        """A fresh copy of this (unreserved) timeline as it is built at ``now`` from the same releases: the
        same steps from ``now`` on, while ``now`` is before its first release; else None (build it again)."""
        if not self.movable(now):
            return None
        times = self.times
        tl = Timeline.__new__(Timeline)
        tl.name, tl.idx, tl.weight = self.name, self.idx, self.weight
        tl.cap_c, tl.cap_m, tl.cap_g = self.cap_c, self.cap_m, self.cap_g
        tl.version, tl.items, tl.owned, tl.log = 0, None, False, None
        tl.times = times.copy()
        tl.times[0] = now
        tl.fc, tl.fm, tl.fg, tl.fgt = self.fc, self.fm, self.fg, self.fgt
        return tl

    def movable(self, now: int) -> bool:
        """Whether this timeline, built earlier, has the same steps from ``now`` on: ``now`` is not before it was
        built and not past its first release."""
        times = self.times
        return times[0] <= now and (len(times) == 1 or now < times[1])

    def _own(self) -> None:
        """Copy the free amounts shared with the timeline this one was moved from, before changing them."""
        self.fc, self.fm, self.fg = self.fc.copy(), self.fm.copy(), self.fg.copy()
        if self.fgt is not None:
            self.fgt = {t: arr.copy() for t, arr in self.fgt.items()}
        self.owned = True

    def gpu_array(self, gpu_type: str | None) -> list[int]:
        if gpu_type is None or self.fgt is None:
            return self.fg
        return self.fgt[gpu_type]

    def earliest(self, c: int, m: int, g: int, garr: list[int], d: int, t0: int, tmax: int) -> int:
        """Earliest start >= t0 (and <= tmax) of a window of length d that fits; -1 if none."""
        times, fc, fm = self.times, self.fc, self.fm
        n = len(times)
        i = bisect_right(times, t0) - 1
        start = t0
        while True:
            if fc[i] >= c and fm[i] >= m and garr[i] >= g:
                i += 1
                if i >= n or times[i] - start >= d:
                    return start
            else:
                i += 1
                if i >= n:
                    return -1
                start = times[i]
                if start > tmax:
                    return -1

    def fits_at(self, c: int, m: int, g: int, garr: list[int], d: int, t: int) -> bool:
        """Whether the window [t, t+d) fits."""
        times, fc, fm = self.times, self.fc, self.fm
        n = len(times)
        i = bisect_right(times, t) - 1
        end = t + d
        while True:
            if fc[i] < c or fm[i] < m or garr[i] < g:
                return False
            i += 1
            if i >= n or times[i] >= end:
                return True

    def fits_until(self, c: int, m: int, g: int, garr: list[int], d: int, t: int) -> int:
        """For a window [t, t+d) that fits: the latest start t' >= t such that every window starting
        in [t, t'] fits too (the next segment too small for the request, less d; INF if none)."""
        times, fc, fm = self.times, self.fc, self.fm
        n = len(times)
        i = bisect_right(times, t)
        while i < n:
            if fc[i] < c or fm[i] < m or garr[i] < g:
                return times[i] - d
            i += 1
        return INF

    def free_at(self, t: int) -> tuple[int, int, int]:
        i = bisect_right(self.times, t) - 1
        return self.fc[i], self.fm[i], self.fg[i]

    def _split(self, t: int) -> int:
        """The index of a segment starting at ``t`` (made if none does); every change of the amounts starts here."""
        if not self.owned:
            self._own()
        times = self.times
        i = bisect_right(times, t)
        if times[i - 1] == t:
            return i - 1
        times.insert(i, t)
        self.fc.insert(i, self.fc[i - 1])
        self.fm.insert(i, self.fm[i - 1])
        self.fg.insert(i, self.fg[i - 1])
        if self.fgt is not None:
            for arr in self.fgt.values():
                arr.insert(i, arr[i - 1])
        return i

    def hold(self, start: int, end: int, job_id: int = 0) -> None:
        """Take everything left free over [start, end): the whole node is kept for a job, as Slurm's backfill
        keeps the nodes of a job it plans (``rota_reserve=nodes``)."""
        i = self._split(start)
        j = self._split(end) if end < INF else len(self.times)
        arrays = [self.fc, self.fm, self.fg, *(self.fgt.values() if self.fgt is not None else ())]
        for arr in arrays:
            for k in range(i, j):
                arr[k] = min(arr[k], 0)
        self.version += 1
        if self.log is not None:
            self.log.append(self.idx)
        if self.items is not None:
            self.items.append((start, end, job_id, "resv"))

    def reserve(self, start: int, end: int, c: int, m: int, g: int, gpu_type: str | None,
                job_id: int = 0, kind: str = "resv") -> None:
        """Take c CPUs, m MiB, g GPUs over [start, end)."""
        i = self._split(start)
        j = self._split(end) if end < INF else len(self.times)
        fc, fm, fg = self.fc, self.fm, self.fg
        for k in range(i, j):
            fc[k] -= c
            fm[k] -= m
            fg[k] -= g
        if self.fgt is not None and g:
            arr = self.fgt.get(gpu_type) if gpu_type else None
            if arr is None:   # untyped request on a mixed node: charge the type with most free
                arr = max(self.fgt.values(), key=lambda a: a[i])
            for k in range(i, j):
                arr[k] -= g
        self.version += 1
        if self.log is not None:
            self.log.append(self.idx)
        if self.items is not None:
            self.items.append((start, end, job_id, kind))


class ShapeSearch:
    """Earliest-start search for jobs of one shape (per-node request, node count, duration)."""

    __slots__ = ("tls", "c", "m", "g", "gtype", "whole_c", "whole_m", "whole_g", "d", "k",
                 "tmax", "heap", "lower", "exhausted", "fixed", "live", "log", "seen", "pos_of", "mine", "stale_at")

    def __init__(self, timelines: list[Timeline], c: int, m: int, g: int, gtype: str | None,
                 whole_c: bool, whole_m: bool, whole_g: bool, d: int, k: int, lower: int,
                 tmax: int, seed: list[tuple] | None = None, log: list[int] | None = None) -> None:
        self.c, self.m, self.g, self.gtype = c, m, g, gtype
        self.whole_c, self.whole_m, self.whole_g = whole_c, whole_m, whole_g
        # what it takes on any node, unless it takes a whole node's CPUs, memory or GPUs
        self.fixed = None if whole_c or whole_m or whole_g else (c, m, g)
        self.d, self.k, self.tmax, self.lower = d, k, tmax, lower
        self.exhausted = False
        self.tls = timelines
        # the bookings of the cycle (``log``) read so far, and by their entry's start the nodes booked since this
        # search last evaluated them: such an entry keeps the fit it had, so at an equal start it may rank below
        # a worse node
        self.log, self.seen = log, len(log) if log is not None else 0
        self.pos_of: dict[int, int] | None = None      # node index -> position in ``tls``
        self.mine: frozenset[int] = frozenset()
        self.stale_at: dict[int, set[int]] = {}
        # each node's entry in the heap (None: none); an entry replaced while under others is left there, skipped
        self.live: list[tuple | None] = [None] * len(timelines)
        if seed is not None:
            # lower bounds shared by every duration of this request; made exact when they surface
            self.heap = list(seed)
            for e in seed:
                self.live[e[5]] = e
            return
        heap = []
        live, fixed = self.live, self.fixed
        for pos, tl in enumerate(timelines):
            c_, m_, g_ = fixed or self._req(tl)
            if c_ > tl.cap_c or m_ > tl.cap_m or g_ > tl.cap_g:
                continue
            t = tl.earliest(c_, m_, g_, tl.gpu_array(gtype), d, lower, tmax)
            if t >= 0:
                e = self._entry(tl, pos, t, c_, g_)
                heap.append(e)
                live[pos] = e
        heapify(heap)
        self.heap = heap

    def seed(self) -> list[tuple]:
        """A heap of per-node lower bounds valid for any duration, marked stale.

        Their best-fit fields are below any real value, so at equal times they surface (and
        are evaluated) before an evaluated entry is taken: best fit stays exact among them.
        """
        return sorted((e[0], -1, -1, -1, e[4], e[5], -1) for e in self.heap)

    def _req(self, tl: Timeline) -> tuple[int, int, int]:
        if self.fixed is not None:
            return self.fixed
        return (tl.cap_c if self.whole_c else self.c, tl.cap_m if self.whole_m else self.m,
                tl.cap_g if self.whole_g else self.g)

    def request_on(self, tl: Timeline) -> tuple[int, int, int]:
        """The CPUs, MiB and GPUs this shape takes on node ``tl``."""
        return self._req(tl)

    def _entry(self, tl: Timeline, pos: int, t: int, c: int, g: int) -> tuple:
        """A heap entry: ``(start, node weight, GPUs left, CPUs left, node index, position in the
        timelines, timeline version)``, so the heap orders by earliest start, then lighter node
        weight, then best fit (least left over). A seed's entries have version -1 (a lower bound to
        make exact). A plain tuple: this is the search's hottest allocation."""
        i = bisect_right(tl.times, t) - 1
        return (t, tl.weight, tl.fg[i] - g, tl.fc[i] - c, tl.idx, pos, tl.version)

    def _peek_fresh(self) -> tuple | None:
        """Make the heap's top entry exact for the current timelines; return it (or None)."""
        heap, lower, tls, fixed, live = self.heap, self.lower, self.tls, self.fixed, self.live
        while heap:
            top = heap[0]
            pos = top[5]
            if live[pos] is not top:
                heappop(heap)
                continue
            tl = tls[pos]
            if top[6] == tl.version and top[0] >= lower:
                return top
            c, m, g = fixed if fixed is not None else self._req(tl)
            t = tl.earliest(c, m, g, tl.gpu_array(self.gtype), self.d, max(top[0], lower), self.tmax)
            if t >= 0:
                e = self._entry(tl, pos, t, c, g)
                heapreplace(heap, e)
                live[pos] = e
            else:
                heappop(heap)
                live[pos] = None
            if self.stale_at:
                stale = self.stale_at.get(top[0])
                if stale is not None:
                    stale.discard(pos)
        return None

    def _read_log(self) -> None:
        """Note the nodes of this search booked since it last looked."""
        log = self.log
        if log is None or self.seen == len(log) or self.k > 1:     # many nodes' choice looks at every tie
            return
        pos_of = self.pos_of
        if pos_of is None:
            pos_of = self.pos_of = {tl.idx: pos for pos, tl in enumerate(self.tls)}
            self.mine = frozenset(pos_of)
        booked = self.mine.intersection(log[self.seen:])     # in C: many bookings are on nodes of other shapes
        self.seen = len(log)
        live, stale_at = self.live, self.stale_at
        for idx in booked:
            e = live[pos_of[idx]]
            if e is not None:
                t, pos = e[0], e[5]
                stale = stale_at.get(t)
                if stale is None:
                    stale_at[t] = {pos}
                else:
                    stale.add(pos)

    def _ties(self, t: int, taken: int) -> list[tuple]:
        """For a one-node shape whose first entry at ``t`` is node ``taken``: the other nodes booked since they were
        evaluated whose entry starts at ``t``, made exact (an entry left under others is replaced), with those
        that still start there (best fit among equal starts depends on no earlier search)."""
        out: list[tuple] = []
        stale = self.stale_at.pop(t, None)
        if not stale:
            return out
        tls, gtype, d, tmax, live, heap = self.tls, self.gtype, self.d, self.tmax, self.live, self.heap
        for pos in stale:
            if pos == taken:
                continue
            tl = tls[pos]
            c, m, g = self._req(tl)
            t2 = tl.earliest(c, m, g, tl.gpu_array(gtype), d, t, tmax)
            if t2 < 0:
                live[pos] = None
                continue
            e = live[pos] = self._entry(tl, pos, t2, c, g)
            heappush(heap, e)
            if t2 == t:
                out.append(e)
        return out

    def find(self) -> tuple[int, list[Timeline]] | None:
        """The earliest start and the best nodes for the next job of this shape, or None.

        Leaves the search as it was (apart from refreshed cache entries).
        """
        if self.exhausted:
            return None
        k, d, gtype, tls, tmax = self.k, self.d, self.gtype, self.tls, self.tmax
        self._read_log()
        popped: list[tuple] = []
        retry: list[tuple] = []     # nodes that stopped fitting, with their next possible start
        # nodes that fit at the candidate start, each with the latest start its window still fits
        # from (so a later candidate rechecks a node only once that bound is passed)
        keep: list[tuple[tuple, int]] = []
        soonest = INF               # the smallest of those bounds
        result = None
        while True:
            top = self._peek_fresh()
            if retry and (top is None or retry[0] < top):
                entry = heappop(retry)
            elif top is not None:
                entry = heappop(self.heap)
                popped.append(entry)
            else:
                break
            t = entry[0]
            if t > tmax:
                break
            if t > soonest:
                keep, soonest = self._recheck(keep, t, retry)
            tl = tls[entry[5]]
            c, m, g = self._req(tl)
            until = tl.fits_until(c, m, g, tl.gpu_array(gtype), d, t)
            keep.append((entry, until))
            if until < soonest:
                soonest = until
            if len(keep) >= k:
                result = (t, self._one(t, keep) if k == 1 else self._best(self._all_at(t, keep, popped, retry), t))
                break
        for e in popped:
            heappush(self.heap, e)
        if result is None:
            self.exhausted = True
        return result

    def _one(self, t: int, keep: list[tuple[tuple, int]]) -> list[Timeline]:
        """The node for a one-node shape: the first entry at ``t``, unless a node booked since it was evaluated
        fits better there."""
        best = keep[0][0]
        for e in self._ties(t, best[5]):
            if e < best:
                best = e
        return [self.tls[best[5]]]

    def _all_at(self, t: int, keep: list[tuple[tuple, int]], popped: list[tuple],
                retry: list[tuple]) -> list[tuple[tuple, int]]:
        """``keep`` with every other node whose entry starts at ``t`` and fits there: the best of all the nodes
        that fit at ``t`` are taken, whichever surfaced first."""
        tls, gtype, d = self.tls, self.gtype, self.d
        while True:
            top = self._peek_fresh()
            if retry and retry[0][0] == t and (top is None or retry[0] < top):
                entry = heappop(retry)
            elif top is not None and top[0] == t:
                entry = heappop(self.heap)
                popped.append(entry)
            else:
                return keep
            tl = tls[entry[5]]
            c, m, g = self._req(tl)
            if tl.fits_at(c, m, g, tl.gpu_array(gtype), d, t):
                keep.append((entry, t))

    def _recheck(self, keep: list[tuple[tuple, int]], t: int, retry: list[tuple]) -> tuple[list[tuple[tuple, int]], int]:
        """The candidate start moved past a kept node's bound: check those nodes again at ``t`` (one that no
        longer fits goes to ``retry`` at its next possible start); the nodes kept and their smallest bound."""
        tls, gtype, d, tmax = self.tls, self.gtype, self.d, self.tmax
        still = []
        soonest = INF
        for e, until in keep:
            if t > until:
                tl = tls[e[5]]
                c, m, g = self._req(tl)
                garr = tl.gpu_array(gtype)
                t2 = tl.earliest(c, m, g, garr, d, t, tmax)
                if t2 > t:
                    heappush(retry, self._entry(tl, e[5], t2, c, g))
                    continue
                if t2 < 0:
                    continue
                until = tl.fits_until(c, m, g, garr, d, t)
            still.append((e, until))
            if until < soonest:
                soonest = until
        return still, soonest

    def _best(self, keep: list[tuple[tuple, int]], t: int) -> list[Timeline]:
        """The ``k`` best of the nodes that fit at ``t``, by the search's order."""
        ranked = []
        for e, _until in keep:
            tl = self.tls[e[5]]
            c, _m, g = self._req(tl)
            ranked.append(self._entry(tl, e[5], t, c, g))
        ranked.sort()
        return [self.tls[e[5]] for e in ranked[:self.k]]

    def placed(self, t: int) -> None:
        """Record that a job of this shape was placed at ``t`` (a lower bound for the next)."""
        if t > self.lower:
            self.lower = t

"""Timelines and the earliest-start search against brute force."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rota.core.profile import ShapeSearch, Timeline

CAP = (8, 100, 4)
NOW = 1000


def brute_fits(intervals, t, d, c, m, g):
    points = {t} | {s for s, e, *_ in intervals if t < s < t + d}
    for p in points:
        uc = sum(x[2] for x in intervals if x[0] <= p < x[1])
        um = sum(x[3] for x in intervals if x[0] <= p < x[1])
        ug = sum(x[4] for x in intervals if x[0] <= p < x[1])
        if uc + c > CAP[0] or um + m > CAP[1] or ug + g > CAP[2]:
            return False
    return True


def brute_earliest(nodes, k, d, c, m, g, tmax):
    times = sorted({NOW} | {e for iv in nodes for (_s, e, *_x) in iv if e > NOW})
    for t in times:
        if t > tmax:
            return None
        if sum(brute_fits(iv, t, d, c, m, g) for iv in nodes) >= k:
            return t
    return None


interval = st.tuples(st.integers(NOW, NOW + 600), st.integers(1, 200),
                     st.integers(0, 8), st.integers(0, 100), st.integers(0, 4))


@st.composite
def node_intervals(draw):
    """Non-over-committed usage intervals on one node."""
    out = []
    for s, length, c, m, g in draw(st.lists(interval, min_size=2, max_size=12)):
        iv = (s, s + length, c, m, g)
        if brute_fits(out, s, length, c, m, g):
            out.append(iv)
    return out


def timeline(i, intervals):
    tl = Timeline(f"n{i}", i, 1, *CAP, NOW, *CAP, None, [])
    for s, e, c, m, g in intervals:
        tl.reserve(s, e, c, m, g, None)
    return tl


@settings(max_examples=400, deadline=None)
@given(st.lists(node_intervals(), min_size=2, max_size=6), st.integers(1, 4), st.integers(1, 400),
       st.integers(0, 8), st.integers(0, 100), st.integers(0, 4), st.sampled_from([NOW, NOW + 300, 10**9]),
       st.integers(1, 4))
def test_search_finds_the_earliest_common_start_job_after_job(nodes, k, d, c, m, g, tmax, repeats):
    nodes = [list(iv) for iv in nodes]
    tls = [timeline(i, iv) for i, iv in enumerate(nodes)]
    search = ShapeSearch(tls, c, m, g, None, False, False, False, d, k, NOW, tmax)
    for _ in range(repeats):
        expected = brute_earliest(nodes, k, d, c, m, g, tmax)
        found = search.find()
        assert (found[0] if found else None) == expected
        if found is None:
            break
        t, chosen = found
        assert len({tl.idx for tl in chosen}) == k
        for tl in chosen:
            assert brute_fits(nodes[tl.idx], t, d, c, m, g)
            tl.reserve(t, t + d, c, m, g, None)
            nodes[tl.idx].append((t, t + d, c, m, g))
        search.placed(t)


def test_reserve_splits_segments_and_counts_versions():
    tl = timeline(0, [])
    tl.reserve(NOW + 10, NOW + 20, 2, 10, 1, None)
    assert tl.times == [NOW, NOW + 10, NOW + 20]
    assert tl.fc == [8, 6, 8] and tl.fg == [4, 3, 4] and tl.version == 1
    assert tl.earliest(8, 0, 0, tl.fg, 15, NOW, 10**9) == NOW + 20
    assert tl.earliest(8, 0, 0, tl.fg, 10, NOW, 10**9) == NOW
    assert not tl.fits_at(8, 0, 0, tl.fg, 11, NOW)


releases_st = st.lists(st.tuples(st.integers(NOW - 50, NOW + 400), st.integers(0, 4), st.integers(0, 50),
                                 st.integers(0, 2), st.none()), max_size=8)


@settings(max_examples=200, deadline=None)
@given(releases=releases_st, data=st.data())
def test_a_timeline_moved_to_a_later_now_is_the_one_built_then(releases, data):
    """A timeline kept from an earlier moment and moved to ``now`` is the one built at ``now`` from the same
    releases, while no release falls between; after one does, it must be built again."""
    ends = [max(end - NOW + shift, 0) for end, *_ in releases for shift in (-1, 0, 1)]
    later = data.draw(st.one_of(st.integers(0, 500), *([st.sampled_from(ends)] if ends else [])))
    def built(now):
        return Timeline("n", 0, 1, *CAP, now, 2, 20, 1, None, list(releases))

    kept = built(NOW)
    now = NOW + later
    moved = kept.moved_to(now)
    fresh = built(now)
    if moved is None:
        assert any(NOW < max(end, NOW + 1) <= now for end, *_ in releases)
        return
    assert (moved.times, moved.fc, moved.fm, moved.fg) == (fresh.times, fresh.fc, fresh.fm, fresh.fg)
    before = (list(kept.times), list(kept.fc))
    moved.reserve(now, now + 10, 1, 1, 0, None)
    assert (kept.times, kept.fc) == before          # the kept one is untouched by the copy's reservations
    assert kept.moved_to(NOW - 1) is None           # never moved back in time

"""Slurm syntaxes: time limits, hostlists, arrays, dependencies."""
import pytest

from rota.core.arrays import ArraySpecError, format_indices, parse_array
from rota.core.deps import DependencySpecError, parse_dependency
from rota.core.hostlist import HostlistError, compress, expand
from rota.core.timefmt import TimeSpecError, format_duration, format_squeue_time, parse_time_limit

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


@pytest.mark.parametrize("text,seconds", [
    ("5", 300), ("0:30", 60), ("1:00:00", 3600), ("2-00:00:00", 172800), ("1-2", 93600),
    ("1-2:30", 95400), ("UNLIMITED", 0), ("infinite", 0), ("-1", 0), ("0", 0), ("10:05", 660),
])
def test_time_limits(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "", "1-2:3:4:5", "-5x", "1.5"])
def test_bad_time_limits(text):
    with pytest.raises(TimeSpecError):
        parse_time_limit(text)


def test_duration_formats():
    assert format_duration(3725) == "01:02:05" and format_duration(90061) == "1-01:01:01"
    assert format_squeue_time(40) == "0:40" and format_squeue_time(3725) == "1:02:05"
    assert format_squeue_time(86400) == "1-00:00:00"


def test_hostlists():
    assert expand("gpu[01-03,07]") == ["gpu01", "gpu02", "gpu03", "gpu07"]
    assert expand("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand("a,b c[9-10]") == ["a", "b", "c9", "c10"]
    assert compress(["gpu01", "gpu02", "gpu03", "gpu07", "login"]) == "gpu[01-03,07],login"
    assert compress(expand("node[001-100]")) == "node[001-100]"
    for bad in ("gpu[01-", "gpu[3-1]", "gpu[a-b]", "gpu01]"):
        with pytest.raises(HostlistError):
            expand(bad)


def test_arrays():
    assert parse_array("0-15:4").indices == (0, 4, 8, 12)
    assert parse_array("1,3,5-7%2").indices == (1, 3, 5, 6, 7) and parse_array("1,3%2").throttle == 2
    assert format_indices([0, 1, 2, 3, 7], 2) == "0-3,7%2"
    for bad in ("0-20000", "5-1", "x", "1:0", "1-10%0", "1-10%"):
        with pytest.raises(ArraySpecError):
            parse_array(bad)


def test_dependencies():
    d = parse_dependency("afterok:1:2,afterany:3")
    assert not d.any_of and [(t.kind, t.job_id) for t in d.terms] == [("afterok", 1), ("afterok", 2), ("afterany", 3)]
    assert parse_dependency("afterok:1?afternotok:2").any_of
    assert parse_dependency("singleton").terms[0].kind == "singleton"
    assert parse_dependency("after:5+10").terms[0].delay == 600
    for bad in ("afterok:1,afterany:2?after:3", "before:1", "afterok:", "afterok:x"):
        with pytest.raises(DependencySpecError):
            parse_dependency(bad)

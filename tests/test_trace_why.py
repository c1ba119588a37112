"""`why` at trace scale: every job of a real workload that waited gets a timeline consistent with the log."""
import gzip
from dataclasses import asdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from rota.core import events as ev
from rota.core.sim import Simulator
from rota.core.timetravel import why, why_all
from rota.core.traces import read_swf, swf_cluster

from test_reason_history import OPS, history

KTH = Path(__file__).parent / "fixtures" / "traces" / "KTH-SP2-1996-2.1-cln.swf.gz"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_why_for_all_jobs_in_one_walk_is_why_for_each(ops):
    h = history(ops)
    every = why_all(h.log)
    assert set(every) == {e.event.job_id for e in h.log if isinstance(e.event, ev.JobSubmitted)}
    for jid, rep in every.items():
        assert asdict(rep) == asdict(why(h.log, jid)), jid


def test_every_waiting_job_of_a_real_trace_gets_a_timeline_consistent_with_the_log():
    with gzip.open(KTH, "rt") as fh:
        trace = read_swf(fh, source=KTH.name)
    assert len(trace.jobs) == 2000
    log = Simulator(swf_cluster(trace.max_procs), "easy", record_log=True).run(trace.jobs).log
    started: dict[int, int] = {}
    ended: dict[int, int] = {}
    for env in log:
        if isinstance(env.event, ev.JobsStarted):
            for s in env.event.starts:
                started[s.job_id] = env.event.now
        elif isinstance(env.event, ev.JobExited):
            ended[env.event.job_id] = env.ts
    reports = why_all(log)
    waited = [rep for rep in reports.values() if rep.start_time is not None and rep.start_time > rep.submit_time]
    assert len(waited) > 500, len(waited)
    for rep in waited:
        ivs = rep.intervals
        assert ivs, rep.job_id                                        # never "no evaluation to show"
        assert ivs[0].start == rep.submit_time and ivs[-1].end == rep.start_time == started[rep.job_id]
        assert all(a.end == b.start for a, b in zip(ivs, ivs[1:]))    # no gaps
        for iv in ivs:
            assert iv.reason in ("Resources", "Priority")
            assert iv.expected_start is None or iv.expected_start > iv.start
            for b in iv.blockers:                                      # running then, by the log
                assert started[b] <= iv.start < ended[b], (rep.job_id, b)
            assert set(iv.decisive) <= set(iv.blockers) | set(iv.ahead)
            for b in iv.decisive:
                if b in iv.blockers:                                   # its limit is the expected start
                    assert iv.expected_start is not None and iv.expected_start >= ended[b]

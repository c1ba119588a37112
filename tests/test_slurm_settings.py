"""The settings that give Slurm's behaviour where rota's differs by design.

Slurm's cadence (``SchedulerParameters=rota_cadence=slurm``): backfill only every ``bf_interval``, the main
scheduler's strict-priority pass at the changes between; the log still verifies and liveness allows for it.
Whole-node reservations (``rota_reserve=nodes``): a planned job's nodes are kept whole, as Slurm's backfill keeps
them; by default only what it needs is kept and later jobs may use the rest."""
from rota.core import events as ev
from rota.core.liveness import late_starts
from rota.core.policies import cycle_policy, next_backfill
from rota.core.sim import Simulator, TraceJob
from rota.core.slurmconf import make_cluster, parse_config
from rota.core.timetravel import verify


def cluster(cadence: str) -> ev.ClusterConfig:
    cfg = make_cluster(nodes=1, gpus=8)
    return cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"cadence": cadence,
                                                                                "bf_interval": 10})})


def run(cadence: str) -> tuple[dict[str, int], list[ev.Envelope]]:
    """One node held until 95 by `running`; `wide` (all its GPUs) waits; `small` fits only by backfill."""
    spec = dict(time_limit=600, partitions=("short",))
    jobs = [TraceJob(0, ev.JobSpec(user="ann", name="running", gpus_per_node=8, **spec), 95, 1),
            TraceJob(3, ev.JobSpec(user="bob", name="wide", gpus_per_node=8, **spec), 50, 2),
            TraceJob(4, ev.JobSpec(user="dan", name="small", gpus_per_node=0, cpus_per_task=1, time_limit=60,
                                   partitions=("short",)), 20, 3)]
    result = Simulator(cluster(cadence)).run(jobs)
    names = {o.job_id: j.spec.name for o, j in zip(sorted(result.outcomes.values(), key=lambda o: o.trace_id), jobs)}
    return {names[o.job_id]: o.start for o in result.outcomes.values()}, result.log


def test_backfill_waits_for_the_next_backfill_moment_under_slurms_cadence():
    rota_starts, _ = run("rota")
    slurm_starts, log = run("slurm")
    assert rota_starts["small"] == 4              # backfilled at once, at the change
    assert slurm_starts["small"] == 10            # the main pass at 4 stops at `wide`; backfill at 10 starts it
    assert slurm_starts["wide"] == rota_starts["wide"] == 95      # an end between backfill moments: the main pass
    policies = [e.event.policy for e in log if isinstance(e.event, ev.JobsStarted)]
    assert "fifo" in policies and "conservative" in policies
    assert all(d is None for _seq, d in verify(log))            # each recorded cycle re-derives under its policy
    assert late_starts(log, latency=5) == []                    # waiting for the backfill moment is not late


def test_the_cadence_and_the_interval_come_from_scheduler_parameters():
    text = ("SchedulerParameters=bf_interval=7,rota_cadence=slurm\nNodeName=n1 CPUs=4 RealMemory=1000\n"
            "PartitionName=p Nodes=n1 Default=YES\n")
    sched = parse_config(text, "slurm.conf").scheduler
    assert (sched.cadence, sched.bf_interval) == ("slurm", 7)
    assert cycle_policy(sched, backfill=False) == "fifo" and cycle_policy(sched, backfill=True) == "conservative"
    assert next_backfill(sched, origin=0, now=15) == 21
    assert cycle_policy(parse_config(text.replace("slurm\n", "rota\n", 1), "f").scheduler, False) == "conservative"


def test_a_planned_jobs_node_is_kept_whole_only_under_rota_reserve_nodes():
    from harness import Harness

    def backfill_beside_a_gpu_job(reserve: str) -> str:
        cfg = make_cluster(nodes=1, gpus=8)
        h = Harness(cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"reserve": reserve})}))
        h.submit(name="running", gpus_per_node=4, cpus_per_task=1, time_limit=600, user="ann")
        h.cycle()
        h.submit(name="gpus", gpus_per_node=8, cpus_per_task=1, time_limit=600, user="bob")     # planned at 600
        cpu = h.submit(name="cpu", gpus_per_node=0, cpus_per_task=8, time_limit=3600, user="dan")
        h.cycle()
        return h.state.jobs[cpu].state

    # the CPU job would run past the GPU job's planned start, on CPUs the GPU job does not need
    assert backfill_beside_a_gpu_job("resources") == "RUNNING"
    assert backfill_beside_a_gpu_job("nodes") == "PENDING"
    text = "NodeName=n1 CPUs=4 RealMemory=1000\nPartitionName=p Nodes=n1 Default=YES\n"
    assert parse_config(text, "f").scheduler.reserve == "resources"
    assert parse_config("SchedulerParameters=rota_reserve=nodes\n" + text, "f").scheduler.reserve == "nodes"


def test_under_whole_node_reservations_a_planned_job_gets_the_first_nodes_as_slurm_plans_it():
    from harness import Harness
    from rota.core.schedule import schedule

    def plan(reserve: str) -> tuple[tuple[str, ...], bool]:
        cfg = make_cluster(nodes=4, gpus=0)
        h = Harness(cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"reserve": reserve})}))
        h.submit(user="ann", nodes=2, nodes_given=True, exclusive=True, time_limit=60)     # gpu01-02 until 60
        h.cycle()
        big = h.submit(user="bob", nodes=3, nodes_given=True, exclusive=True, time_limit=60)
        small = h.submit(user="cat", nodes=1, nodes_given=True, exclusive=True, time_limit=60)
        h.advance(2)
        d = schedule(h.state, h.now)
        return d.reservations[big].nodes, any(s.job_id == small for s in d.starts)

    # Slurm plans the 3-node job on gpu01-03 (the first of those free at its start), leaving gpu04 to backfill;
    # rota's own search takes the best of all the nodes free at its start too (by weight, fit, then order), never
    # those a search happened to see first
    assert plan("nodes") == (("gpu01", "gpu02", "gpu03"), True)
    assert plan("resources") == (("gpu01", "gpu02", "gpu03"), True)

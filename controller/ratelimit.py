"""Each user's submissions through a token bucket (Slurm's ``SlurmctldParameters=rl_enable,...``): jobs, not
requests, so a bulk request counts each of its jobs. The buckets are this controller's, on its clock: not in
the log (a standby starts with full ones)."""
from __future__ import annotations

from rota.core import commands
from rota.core import events as ev
from rota.core.auth import Caller

MAX_USERS = 65536         # buckets kept before they are all forgotten (full again)


class SubmitRate:
    def __init__(self) -> None:
        self.buckets: dict[int, list[float]] = {}   # uid -> [tokens, when counted]

    def take(self, rl: ev.RateLimit, caller: Caller, jobs: int, now: float) -> None:
        """Take ``jobs`` from the caller's bucket; Rejected, saying what the bucket allows, when it holds fewer.
        Operators and administrators are not limited."""
        if not rl.enabled or caller.operator:
            return
        tokens, then = self.buckets.get(caller.uid) or [float(rl.bucket_size), now]
        tokens = min(float(rl.bucket_size), tokens + (now - then) * rl.refill_rate / rl.refill_period)
        if jobs > tokens:
            self.buckets[caller.uid] = [tokens, now]
            raise commands.Rejected(
                f"submit rate limit: uid {caller.uid} may submit {rl.bucket_size} jobs at once and {rl.refill_rate} "
                f"more every {rl.refill_period} s (SlurmctldParameters=rl_bucket_size,rl_refill_rate,rl_refill_period); "
                f"{int(tokens)} now", "Slurm temporarily unable to accept job, sleeping and retrying", code="busy")
        if len(self.buckets) >= MAX_USERS:
            self.buckets.clear()
        self.buckets[caller.uid] = [tokens - jobs, now]

"""The cluster configuration a daemon runs with: a slurm.conf file (and the gres.conf beside it), or this
machine described as a one-node cluster."""
from __future__ import annotations

import os
from pathlib import Path

from rota.core import events as ev
from rota.core.slurmconf import auto_config, parse_config
from rota.wire.paths import read_slurm_conf, read_text


def machine_config(fake_gpus: str | None) -> ev.ClusterConfig:
    """A one-node cluster describing this machine (CPUs, memory; GPUs from --fake-gpus TYPE:N)."""
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        mem_kib = 4 * 1024 * 1024
    gpus: list[tuple[str, int]] = []
    if fake_gpus:
        gtype, _, count = fake_gpus.rpartition(":")
        if not count.isdecimal():
            raise ValueError(f"--fake-gpus {fake_gpus!r}: use TYPE:N, for example a100:4")
        gpus.append((gtype or "gpu", int(count)))
    from rota.agents.agent import hostname

    return auto_config(hostname(), os.cpu_count() or 1, max(1, mem_kib // 1024), gpus)


def load_config(path: str | None, fake_gpus: str | None) -> ev.ClusterConfig:
    """The cluster configuration ``rota up`` applies; its nodes take work once their agent registers."""
    if path is None:
        cfg = machine_config(fake_gpus)
    else:
        text, origin = read_slurm_conf(path)
        gres = Path(path).with_name("gres.conf")
        cfg = parse_config(text, path, read_text(str(gres)) if gres.exists() else None, str(gres), origin=origin)
    return cfg.model_copy(update={"agents": True})

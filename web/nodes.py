"""The nodes page: each node a card of GPU slots, who holds each one, the slots a job holds without using
them (reported idle by its agent), and drained or down nodes with their reasons."""
from __future__ import annotations

from html import escape

from .history import unusable
from .layout import page, when

SCRIPT = "setTimeout(()=>location.reload(),10000);"
LEGEND = ('<p class=legend><span class=free>free</span><span class=held>held</span><span class=unused>held, '
          'idle (no use reported)</span><span class=shared>shared (shards)</span><span class=drained>drained / down'
          '</span><span class=hidden>held by another user</span></p>')


def _slot(g: dict, node_down: bool, idle: dict[int, dict]) -> str:
    jid = g["job_id"]
    label = escape(g["type"] or "gpu")
    if jid > 0:
        idle_job = idle.get(jid)
        kind = "unused" if idle_job else "held"
        title = f"GPU {g['index']}: job {jid} ({g['user']})" + (
            f", idle for {idle_job['idle_for'] // 60} min" if idle_job else "")
        text = f'<a href="/job/{jid}">{jid}</a><br>{escape(g["user"])}'
    elif jid == -1:
        kind, title, text = "shared", f"GPU {g['index']}: shared by shard jobs", "shared"
    elif jid == -2:
        kind, title, text = "hidden", f"GPU {g['index']}: held", "held"
    else:
        kind = "drained" if node_down else "free"
        title, text = f"GPU {g['index']}: {kind}", kind
    return (f'<div class="slot {kind}" data-gpu="{g["index"]}" data-job="{max(jid, 0)}" title="{escape(title)}">'
            f'{label}<br>{text}</div>')


def nodes_page(nodes: list[dict], idle_jobs: list[dict], user: str) -> str:
    idle = {j["job_id"]: j for j in idle_jobs}
    cards = []
    for n in nodes:
        down = unusable(n["state"])
        slots = "".join(_slot(g, down, idle) for g in n["gpus"]) or '<span class=muted>no GPUs</span>'
        reason = (f'<div class=reason>{escape(n["reason"])} <span class=muted>({escape(n["reason_by"] or "")}, '
                  f'{when(n["reason_time"])})</span></div>') if n.get("reason") else ""
        cards.append(f'<div class=node data-node="{escape(n["name"])}" data-state="{escape(n["state"])}">'
                     f'<h3>{escape(n["name"])} <small class=muted>{escape(n["state"].lower())}</small></h3>{reason}'
                     f'<div class=slots>{slots}</div><div class=muted>CPUs {n["alloc_cpus"]}/{n["cpus"]} · '
                     f'memory {n["alloc_mem"] // 1024}/{n["memory"] // 1024} GiB</div></div>')
    used = sum(1 for n in nodes for g in n["gpus"] if g["job_id"])
    total = sum(len(n["gpus"]) for n in nodes)
    body = f'<h1>Nodes <small class=muted>{used} of {total} GPUs held</small></h1>{LEGEND}<div class=grid>{"".join(cards)}</div>'
    return page("Nodes", body, user, "/nodes", "nodes")

"""The cluster over time: GPUs allocated, idle and drained, and the queue's length by reason, drawn from the
projection; a slider shows the queue as it stood at any past moment."""
from __future__ import annotations

from html import escape
from typing import Mapping, Sequence

from .history import Series
from .layout import colour, page, when

W, H, PAD = 960, 180, 30

SCRIPT = """
const s=document.getElementById('moment'),out=document.getElementById('at'),lab=document.getElementById('when');
async function show(){const r=await fetch('/cluster/at?t='+s.value);out.innerHTML=await r.text();
lab.textContent=new Date(s.value*1000).toISOString().slice(0,19);}
s.addEventListener('input',()=>{clearTimeout(s.t);s.t=setTimeout(show,150);});show();
"""


def _line(times: Sequence[int], values: Sequence[int], top: int, name: str, fill: str) -> str:
    t0, t1 = times[0], times[-1]
    span = max(1, t1 - t0)
    top = max(1, top)
    xs = [PAD + (W - 2 * PAD) * (t - t0) / span for t in times]
    ys = [H - PAD - (H - 2 * PAD) * v / top for v in values]
    # steps: a level holds until the next moment, where it changes
    pts = " ".join(f"{xs[i]:.1f},{ys[i - 1] if i else ys[0]:.1f} {xs[i]:.1f},{ys[i]:.1f}" for i in range(len(xs)))
    return f'<polyline class=series data-name="{escape(name)}" points="{pts}" fill="none" stroke="{fill}" stroke-width="2"/>'


GPU_COLOURS = {"allocated": "#3d9a5b", "idle": "#7aa6e8", "drained": "#e07a5f"}


def _chart(times: Sequence[int], lines: Mapping[str, Sequence[int]], chart_id: str) -> str:
    top = max((max(v) for v in lines.values() if v), default=1) or 1
    drawn = "".join(_line(times, v, top, name, GPU_COLOURS.get(name) or colour(name)) for name, v in lines.items())
    labels = (f'<text x="{PAD}" y="{H - 8}" font-size="11">{when(times[0])}</text>'
              f'<text x="{W - PAD}" y="{H - 8}" font-size="11" text-anchor="end">{when(times[-1])}</text>'
              f'<text x="4" y="{PAD - 8}" font-size="11">{top}</text>')
    legend = "".join(f'<span style="border-bottom:3px solid {GPU_COLOURS.get(n) or colour(n)}">{escape(n)}: '
                     f'{v[-1] if v else 0}</span>' for n, v in lines.items())
    return f'<p class=legend>{legend}</p><svg id={chart_id} width="{W}" height="{H}">{drawn}{labels}</svg>'


def cluster_page(s: Series, user: str) -> str:
    gpus = _chart(s.times, {"allocated": s.allocated, "idle": s.idle, "drained": s.drained}, "gpus")
    queue = _chart(s.times, s.queue or {"pending": [0] * len(s.times)}, "queue")
    body = (f'<h1>Cluster over time <small class=muted>{s.total} GPUs</small></h1><h2>GPUs</h2>{gpus}'
            f'<h2>Pending jobs by reason</h2>{queue}<h2>The queue at <span id=when></span></h2>'
            f'<input id=moment type=range min="{s.times[0]}" max="{s.times[-1]}" value="{s.times[-1]}" step=1 '
            f'style="width:{W}px"><div id=at></div>')
    return page("Cluster", body, user, "/cluster", "cluster")


def queue_at_html(rows: list[dict], t: int) -> str:
    """The jobs waiting or running at ``t`` (the slider's table)."""
    cells = "".join(f'<tr data-job="{r["job_id"]}"><td><a href="/job/{r["job_id"]}">{r["job_id"]}</a></td>'
                    f'<td>{escape(r["user"] or "")}</td><td>{escape(r["name"] or "")}</td><td>{r["state"]}</td>'
                    f'<td>{escape(r["reason"] or "")}</td><td>{escape(r["nodes"] or "") if r["state"] == "RUNNING" else ""}'
                    f'</td></tr>' for r in rows)
    pending = sum(1 for r in rows if r["state"] == "PENDING")
    return (f'<p data-t="{t}">{pending} pending, {len(rows) - pending} running at {when(t)}</p>'
            f'<table id=queue-at><thead><tr><th>JOBID</th><th>USER</th><th>NAME</th><th>STATE</th><th>REASON</th>'
            f'<th>NODES</th></tr></thead><tbody>{cells}</tbody></table>')

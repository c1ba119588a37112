"""The queue page: squeue's columns, filters by user, partition, state and reason, Slurm's order, and a row
list the page fetches again every few seconds."""
from __future__ import annotations

from html import escape
from typing import Iterable

from rota.controller.squeue_view import job_id_text, order
from rota.core.states import STATE_CODES
from rota.core.timefmt import format_limit, format_squeue_time
from rota.core.hostlist import compress

from .layout import page

FILTERS = ("user", "partition", "state", "reason")
HEAD = ("JOBID", "PARTITION", "NAME", "USER", "ACCOUNT", "ST", "TIME", "TIME_LIMIT", "NODES", "PRIORITY",
        "NODELIST(REASON)")
REFRESH_MS = 3000
SCRIPT = """
const tb=document.getElementById('rows');let tag=tb.dataset.tag;
async function refresh(){try{const r=await fetch('/queue/rows'+location.search,{headers:{'If-None-Match':tag}});
if(r.status===200){tb.innerHTML=await r.text();tag=r.headers.get('ETag');
document.getElementById('count').textContent=r.headers.get('X-Rota-Count');}}catch(e){}}
setInterval(refresh,%d);
document.querySelectorAll('form.filters select').forEach(s=>s.addEventListener('change',()=>s.form.submit()));
""" % REFRESH_MS


def select(rows: list[dict], filters: dict[str, str]) -> list[dict]:
    """The rows the filters keep (each a comma-separated list; empty: all), in Slurm's order."""
    wanted = {k: {v.strip() for v in filters.get(k, "").split(",") if v.strip()} for k in FILTERS}
    states = {s.upper() for s in wanted["state"]}

    def keep(r: dict) -> bool:
        return ((not wanted["user"] or r["user"] in wanted["user"])
                and (not wanted["partition"] or r["partition"] in wanted["partition"])
                and (not states or r["state"] in states or STATE_CODES.get(r["state"]) in states)
                and (not wanted["reason"] or r["reason"] in wanted["reason"]))
    return sorted((r for r in rows if keep(r)), key=order)


def _where(r: dict) -> str:
    if r["state"] == "PENDING":
        return f"({escape(r['reason'])})"
    return escape(compress(r["nodes"]))


def row_html(rows: Iterable[dict], now: int) -> str:
    """The table's rows (the part the page fetches again)."""
    out = []
    for r in rows:
        used = max(0, now - r["start_time"]) if r["state"] == "RUNNING" and r["start_time"] else 0
        jid = r["job_id"]
        out.append(
            f'<tr data-job="{jid}" data-state="{r["state"]}" data-reason="{escape(r["reason"])}">'
            f'<td><a href="/job/{jid}">{escape(job_id_text(r))}</a></td><td>{escape(r["partition"] or "")}</td>'
            f'<td>{escape(r["name"] or "")}</td><td>{escape(r["user"])}</td><td>{escape(r["account"] or "")}</td>'
            f'<td>{STATE_CODES.get(r["state"], r["state"])}</td><td class=num>{format_squeue_time(used)}</td>'
            f'<td class=num>{format_limit(r["time_limit"])}</td><td class=num>{r["num_nodes"]}</td>'
            f'<td class=num>{r["priority"]}</td><td>{_where(r)}</td></tr>')
    return "".join(out)


def queue_page(rows: list[dict], all_rows: list[dict], filters: dict[str, str], now: int, user: str,
               tag: str) -> str:
    """The whole page: the filters (with the values the queue holds to choose from) and the rows."""
    choices = {"user": sorted({r["user"] for r in all_rows}), "partition": sorted({r["partition"] or "" for r in all_rows}),
               "state": ["PENDING", "RUNNING"], "reason": sorted({r["reason"] for r in all_rows if r["state"] == "PENDING"})}
    fields = []
    for name in FILTERS:
        opts = "".join(f'<option value="{escape(v)}"{" selected" if v == filters.get(name) else ""}>{escape(v)}</option>'
                       for v in choices[name])
        fields.append(f'<label>{name} <select name={name}><option value="">all</option>'
                      f'{opts}</select></label>')
    body = (f'<h1>Queue <small class=muted><span id=count>{len(rows)}</span> jobs</small></h1>'
            f'<form class=filters method=get>{"".join(fields)}<noscript><button>filter</button></noscript></form>'
            f'<table id=queue><thead><tr>{"".join(f"<th>{h}</th>" for h in HEAD)}</tr></thead>'
            f'<tbody id=rows data-tag="{tag}">{row_html(rows, now)}</tbody></table>')
    return page("Queue", body, user, "/", "queue")

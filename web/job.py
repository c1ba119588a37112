"""A job's page: its wait drawn as a strip over time (each reason's interval, the expected start as it moved,
jobs backfilled past it, preemptions), the log events behind it, its accounting record and its steps."""
from __future__ import annotations

from html import escape
from typing import Any

from rota.core.timefmt import format_duration, format_limit

from .layout import colour, page, when

W, LEFT = 960, 10           # the strip's width and margin, pixels


def _scale(t0: int, t1: int):
    span = max(1, t1 - t0)
    return lambda t: LEFT + (W - 2 * LEFT) * (min(max(t, t0), t1) - t0) / span


def span_of(why: dict, record: dict | None) -> tuple[int, int]:
    """The strip's first and last moments: the submit, and the end (or the last moment the log tells)."""
    t0 = why.get("submit_time") or (record or {}).get("submit") or 0
    ends = [iv["end"] for iv in why.get("intervals", ())]
    end = (record or {}).get("end_time") or 0
    start = why.get("start_time") or 0
    t1 = max([t0 + 1, end, start, *ends, *(t for e in why.get("estimates", ()) for t in (e[0], e[1] or 0))])
    return t0, t1


def strip(why: dict, record: dict | None, now: int) -> str:
    """The SVG strip: a bar per interval (data-reason/start/end carry the figures), the run, and marks."""
    t0, t1 = span_of(why, record)
    run_end = (record or {}).get("end_time") or max(now, t1)
    t1 = max(t1, run_end if why.get("start_time") or not (record or {}).get("end_time") else t1)
    x = _scale(t0, t1)
    bars = []
    for iv in why.get("intervals", ()):
        x0, x1 = x(iv["start"]), x(iv["end"])
        tip = f'{iv["reason"]}: {when(iv["start"])} to {when(iv["end"])} (sequences {iv["first_seq"]}-{iv["last_seq"]})'
        bars.append(f'<rect class=iv data-reason="{escape(iv["reason"])}" data-start="{iv["start"]}" '
                    f'data-end="{iv["end"]}" x="{x0:.1f}" y="20" width="{max(1.0, x1 - x0):.1f}" height="28" '
                    f'fill="{colour(iv["reason"])}"><title>{escape(tip)}</title></rect>')
    ivs = why.get("intervals") or []
    if ivs and not why.get("start_time") and not (record or {}).get("end_time") and ivs[-1]["end"] < now:
        last = ivs[-1]      # still waiting: the last reason holds until something changes
        bars.append(f'<rect class=waiting x="{x(last["end"]):.1f}" y="20" width="{x(now) - x(last["end"]):.1f}" '
                    f'height="28" fill="{colour(last["reason"])}" opacity="0.45"><title>still {escape(last["reason"])} '
                    f'(no event since {when(last["end"])})</title></rect>')
    if why.get("start_time"):
        s = why["start_time"]
        bars.append(f'<rect class=run data-start="{s}" data-end="{run_end}" x="{x(s):.1f}" y="20" '
                    f'width="{max(1.0, x(run_end) - x(s)):.1f}" height="28" fill="{colour("RUNNING")}">'
                    f'<title>running from {when(s)}</title></rect>')
    marks = []
    for at, expected, estimated in why.get("estimates", ()):
        if expected:
            marks.append(f'<circle class=estimate cx="{x(expected):.1f}" cy="62" r="4" fill="#1d2330">'
                         f'<title>at {when(at)} it {"was estimated" if estimated else "expected"} to start at '
                         f'{when(expected)}</title></circle>')
    for b in why.get("backfilled_past", ()):
        marks.append(f'<path class=backfill d="M{x(b["time"]):.1f} 14 l-5 -8 h10 z" fill="#e07a5f"><title>job '
                     f'{b["job_id"]} ({escape(b.get("user", ""))}) backfilled at {when(b["time"])}, ending by '
                     f'{when(b["ends_by"])} (sequence {b["seq"]})</title></path>')
    for p in why.get("preempted", ()):
        marks.append(f'<rect class=preempted x="{x(p["time"]) - 1:.1f}" y="10" width="3" height="48" fill="#a23b2a">'
                     f'<title>preempted by job {p["by"].get("job_id")} at {when(p["time"])}</title></rect>')
    ahead = [e[1] for e in why.get("estimates", ()) if e[1]]
    if ahead and not why.get("start_time") and ahead[-1] > now:      # where it is expected to start, from now
        marks.append(f'<rect class=expected x="{x(now):.1f}" y="22" width="{x(ahead[-1]) - x(now):.1f}" height="24" '
                     f'fill="none" stroke="#6b7385" stroke-dasharray="4 3"><title>expected to start at '
                     f'{when(ahead[-1])}</title></rect>')
    if t0 < now < t1:
        marks.append(f'<line class=now x1="{x(now):.1f}" x2="{x(now):.1f}" y1="14" y2="70" stroke="#1d2330" '
                     f'stroke-dasharray="3 3"><title>now, {when(now)}</title></line>')
    axis = (f'<text x="{LEFT}" y="84" font-size="11">{when(t0)}</text>'
            f'<text x="{W - LEFT}" y="84" font-size="11" text-anchor="end">{when(t1)}</text>')
    return (f'<svg class=strip id=timeline width="{W}" height="90" data-t0="{t0}" data-t1="{t1}">'
            f'{"".join(bars)}{"".join(marks)}{axis}</svg>')


def events(why: dict) -> list[tuple[int, int, str]]:
    """The log events behind the story: (sequence, time, what), in log order."""
    out = [(why.get("submit_seq") or 0, why.get("submit_time") or 0, "submitted")]
    for iv in why.get("intervals", ()):
        out.append((iv["first_seq"], iv["start"], f'{iv["reason"]}: {iv["text"]} {iv["detail"]}'.strip()))
    for a in why.get("actions", ()):
        out.append((a["seq"], a["time"], f'{a["action"]} by {a.get("actor", "")}'))
    for b in why.get("backfilled_past", ()):
        out.append((b["seq"], b["time"], f'job {b["job_id"]} backfilled past it, ending by {when(b["ends_by"])}'))
    for p in why.get("preempted", ()):
        out.append((p["seq"], p["time"], f'preempted by job {p["by"].get("job_id")} ({p["mode"]})'))
    if why.get("start_seq"):
        nodes = ",".join(why.get("nodes", ()))
        out.append((why["start_seq"], why.get("start_time") or 0,
                    f'started on {nodes}' + (" (backfilled)" if why.get("backfilled") else "")))
    return sorted(out)


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]], table_id: str) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id={table_id}><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead><tbody>{cells}</tbody></table>'


def _record(record: dict | None) -> str:
    if not record:
        return '<p class=muted>The accounting record is not in the projection yet.</p>'
    keys = ("job_id", "name", "user", "account", "partition", "qos", "state", "exit_code", "signal", "submit",
            "start", "end_time", "elapsed", "time_limit", "nodes", "alloc_cpus", "alloc_mem", "alloc_gpus",
            "req_mem", "max_rss", "restarts")
    shown = {k: (when(record[k]) if k in ("submit", "start", "end_time") else record[k]) for k in keys if k in record}
    shown["elapsed"] = format_duration(int(record.get("elapsed") or 0))
    shown["time_limit"] = format_limit(record.get("time_limit"))
    return _table(("field", "value"), list(shown.items()), "record")


def job_page(why: dict, record: dict | None, steps: list[dict], now: int, user: str) -> str:
    jid = why["job_id"]
    waited = ((why.get("start_time") or now) - (why.get("submit_time") or now))
    summary = (f'<p>{escape(why.get("name", ""))} · {escape(why.get("user", ""))} · partition '
               f'{escape(why.get("partition", ""))} · submitted {when(why.get("submit_time"))} · '
               + (f'started {when(why["start_time"])} after {format_duration(waited)}' if why.get("start_time")
                  else f'waiting for {format_duration(max(0, waited))}') + "</p>")
    legend = "".join(f'<span style="background:{colour(iv)}">{escape(iv)}</span>'
                     for iv in dict.fromkeys(i["reason"] for i in why.get("intervals", ())))
    intervals = [(iv["reason"], when(iv["start"]), when(iv["end"]), format_duration(iv["end"] - iv["start"]),
                  f'{iv["first_seq"]}-{iv["last_seq"]}', ",".join(map(str, iv["blockers"])) or "",
                  iv["expected_start"] and when(iv["expected_start"]) or "") for iv in why.get("intervals", ())]
    body = (f'<h1>Job {jid}</h1>{summary}<p class=legend>{legend}<span style="background:{colour("RUNNING")}">running'
            f'</span></p>{strip(why, record, now)}<h2>Why it waited</h2>'
            + _table(("reason", "from", "to", "for", "log sequences", "held by", "expected start"), intervals, "intervals")
            + "".join(f"<p class=muted>{escape(d)}</p>" for d in why.get("slurm_differences", ()))
            + "<h2>Events in the log</h2>" + _table(("sequence", "time", "what"),
                                                   [(s, when(t), w) for s, t, w in events(why)], "events")
            + "<h2>Accounting</h2>" + _record(record) + "<h2>Steps</h2>"
            + _table(("step", "name", "state", "exit", "elapsed", "MaxRSS", "nodes"),
                     [(s["step"], s["name"], s["state"], f'{s["exit_code"]}:{s["signal"]}', format_duration(s["elapsed"] or 0),
                       s["max_rss"], s["nodes"]) for s in steps], "steps"))
    return page(f"Job {jid}", body, user)

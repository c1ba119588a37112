"""The page around every view: navigation, who is signed in, the style sheet and the small scripts (no build
step: plain HTML, CSS and JavaScript written here)."""
from __future__ import annotations

from html import escape

from rota.core.timefmt import format_utc

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header a.here{color:#fff;font-weight:600}
header .who{margin-left:auto;color:#cfd8ea}main{padding:12px 16px}
table{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
th,td{padding:3px 8px;border-bottom:1px solid #e3e6ec;text-align:left;white-space:nowrap}
th{background:#eef1f6;position:sticky;top:0}td.num{text-align:right}
form.filters{display:flex;gap:8px;margin-bottom:10px;flex-wrap:wrap}
.grid{display:flex;flex-wrap:wrap;gap:10px}.node{background:#fff;border:1px solid #d6dbe4;padding:8px;width:250px}
.node h3{margin:0 0 4px;font-size:14px}.slots{display:flex;flex-wrap:wrap;gap:4px;margin:6px 0}
.slot{width:56px;height:48px;border-radius:3px;font-size:11px;padding:2px;box-sizing:border-box;overflow:hidden}
.free{background:#dff3e4}.held{background:#7aa6e8;color:#fff}.unused{background:#f2b84b}
.drained{background:#c9ccd3}.shared{background:#a98be0;color:#fff}.hidden{background:#9aa3b2;color:#fff}
.reason{color:#a23b2a;font-size:12px}.muted{color:#6b7385}
.strip rect{stroke:#fff;stroke-width:1}.legend span{display:inline-block;padding:1px 6px;margin-right:6px}
.err{background:#fde8e4;border:1px solid #e7a99d;padding:8px}
"""
# reason code -> colour on the timeline strip and the charts (others get the last)
COLOURS = {"Priority": "#7aa6e8", "Resources": "#f2b84b", "Dependency": "#a98be0", "JobHeldUser": "#9aa3b2",
           "JobHeldAdmin": "#6b7385", "ReqNodeNotAvail": "#e07a5f", "BeginTime": "#81b29a",
           "QOSMaxJobsPerUserLimit": "#d4a5a5", "AssocGrpCPUMinutesLimit": "#c98bb9", "PartitionTimeLimit": "#b5838d",
           "RUNNING": "#3d9a5b", "": "#b8bfcc"}
NAV = (("/", "Queue"), ("/nodes", "Nodes"), ("/cluster", "Cluster"))


def colour(code: str) -> str:
    return COLOURS.get(code, COLOURS[""])


def when(t: int | None) -> str:
    return format_utc(t) if t else ""


def page(title: str, body: str, user: str | None = None, here: str = "", script: str = "") -> str:
    """A whole page (``script``: the name of its script under /static, rota.web.app.SCRIPTS)."""
    nav = "".join(f'<a href="{href}"{" class=here" if href == here else ""}>{name}</a>' for href, name in NAV)
    who = (f'<span class="who">{escape(user)} · <form method="post" action="/logout" style="display:inline">'
           f'<button>sign out</button></form></span>') if user else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)} · rota</title>"
            f"<meta name=viewport content='width=device-width'><style>{CSS}</style></head><body>"
            f"<header><strong>rota</strong>{nav}{who}</header><main>{body}</main>"
            + (f'<script src="/static/{script}.js"></script>' if script else "") + "</body></html>")


def error(message: str) -> str:
    return f'<p class="err">{escape(message)}</p>'


def login_page(message: str = "") -> str:
    body = (f"<h1>Sign in</h1>{error(message) if message else ''}"
            "<p>Run <code>rota web login</code> on a host of this cluster: it prints a link that signs you in as the "
            "user who ran it (the cluster learns who you are from the kernel, as for every command). Or paste "
            "its token here:</p><form method=post action=/login><input name=token size=60 autocomplete=off> "
            "<button>Sign in</button></form>")
    return page("Sign in", body)

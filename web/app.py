"""``rota web``'s server (aiohttp): the pages, their scripts, sign-in and ``/metrics``.

It asks the controller as root and shows each signed-in user what the command line would show them: under
``PrivateData=jobs`` a user sees only their own jobs (operators see all), and another user's job page is
"Invalid job id specified", as in ``scontrol``.
"""
from __future__ import annotations

import hashlib
import time
from ipaddress import ip_address
from typing import Any, Awaitable, Callable

from aiohttp import web

from rota.controller.metrics_view import hide_others
from rota.projections import queries
from rota.wire.webtoken import TokenError, WebUser

from . import cluster, history, job, layout, nodes, queue
from .auth import COOKIE, SESSION_TTL, Sessions
from .metrics import CONTENT_TYPE, exposition
from .source import Source, SourceError

SCRIPTS = {"queue": queue.SCRIPT, "nodes": nodes.SCRIPT, "cluster": cluster.SCRIPT}
HEADERS = {"Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
           "frame-ancestors 'none'; form-action 'self'", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
           "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")
USER = web.AppKey("user", WebUser)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebApp:
    def __init__(self, source: Source, sessions: Sessions, *, loopback: bool = True, secure: bool = False,
                 metrics_token: str | None = None) -> None:
        self.source, self.sessions = source, sessions
        self.loopback, self.secure, self.metrics_token = loopback, secure, metrics_token

    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=64 << 10)
        r = app.router
        r.add_get("/login", self.login)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/static/{name}.js", self.script)
        r.add_get("/metrics", self.metrics)
        r.add_get("/", self.queue)
        r.add_get("/queue/rows", self.queue_rows)
        r.add_get("/nodes", self.nodes)
        r.add_get(r"/job/{job_id:\d{1,10}}", self.job)
        r.add_get("/cluster", self.cluster)
        r.add_get("/cluster/at", self.cluster_at)
        return app

    # ------------------------------------------------------------ who asks

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Security headers on every answer; a loopback server answers only to loopback host names (no DNS
        rebinding); the controller or projection being away is a page saying so, never a traceback."""
        host = request.host.rsplit(":", 1)[0] if not request.host.startswith("[") else request.host.split("]")[0] + "]"
        if self.loopback and host not in LOCAL_NAMES:
            return web.Response(status=421, text="this rota web answers only to 127.0.0.1 or localhost\n")
        try:
            response = await handler(request)
        except SourceError as exc:
            response = _html(layout.page("Unavailable", layout.error(str(exc))), status=503)
        for k, v in HEADERS.items():
            response.headers.setdefault(k, v)
        return response

    def _user(self, request: web.Request) -> WebUser | None:
        return self.sessions.user(request.cookies.get(COOKIE))

    async def _private(self, who: WebUser) -> bool:
        """Whether ``who`` may see only their own jobs (PrivateData=jobs, not an operator)."""
        if who.operator:
            return False
        cfg = await self.source.config()
        return "jobs" in (cfg.get("auth") or {}).get("private_data", ()) and not who.operator

    async def login(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        if request.method == "POST":
            token = str((await request.post()).get("token", "")).strip()
        if not token:
            return _html(layout.login_page(), status=401)
        try:
            sid, _who = self.sessions.login(token)
        except TokenError as exc:
            return _html(layout.login_page(str(exc)), status=401)
        response = web.HTTPSeeOther("/")
        response.set_cookie(COOKIE, sid, max_age=SESSION_TTL, httponly=True, samesite="Strict", secure=self.secure,
                            path="/")
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.logout(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/login")
        response.del_cookie(COOKIE, path="/")
        return response

    async def script(self, request: web.Request) -> web.StreamResponse:
        text = SCRIPTS.get(request.match_info["name"])
        if text is None:
            raise web.HTTPNotFound()
        return web.Response(text=text, content_type="application/javascript", headers={"Cache-Control": "max-age=60"})

    # ------------------------------------------------------------ pages

    async def _queue_rows(self, who: WebUser) -> tuple[list[dict], int]:
        reply = await self.source.ask("queue")
        rows = reply["jobs"]
        if await self._private(who):
            rows = [r for r in rows if r["uid"] == who.uid]
        return rows, int(reply["now"])

    async def queue(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            return _html(layout.login_page(), status=401)
        rows, now = await self._queue_rows(who)
        chosen = queue.select(rows, dict(request.query))
        text = queue.row_html(chosen, now)
        return _html(queue.queue_page(chosen, rows, dict(request.query), now, who.user, _tag(text)))

    async def queue_rows(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            raise web.HTTPUnauthorized()
        rows, now = await self._queue_rows(who)
        chosen = queue.select(rows, dict(request.query))
        text = queue.row_html(chosen, now)
        tag = _tag(text)
        if request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers={"ETag": tag})
        return web.Response(text=text, content_type="text/html", headers={"ETag": tag, "X-Rota-Count": str(len(chosen))})

    async def nodes(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            return _html(layout.login_page(), status=401)
        grid = (await self.source.ask("gpu_grid"))["nodes"]
        idle = (await self.source.ask("idle"))["jobs"]
        if await self._private(who):
            owners = {g["job_id"]: g["uid"] for n in grid for g in n["gpus"] if g["job_id"] > 0}
            hide_others(grid, who.uid, owners)
            idle = [j for j in idle if owners.get(j["job_id"]) == who.uid]
        return _html(nodes.nodes_page(grid, idle, who.user))

    async def job(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            return _html(layout.login_page(), status=401)
        job_id = int(request.match_info["job_id"])
        record = await self.source.db(queries.job_record, job_id)
        record = dict(record) if record is not None else None
        owner = record["uid"] if record is not None else await self._live_owner(job_id)
        if owner is None or (owner != who.uid and await self._private(who)):
            return _html(layout.page("No such job", layout.error("Invalid job id specified"), who.user), status=404)
        why = await self.source.why(job_id)
        steps = [dict(s) for s in (await self.source.db(queries.steps, [job_id])).get(job_id, [])]
        return _html(job.job_page(why, record, steps, int(time.time()), who.user))

    async def _live_owner(self, job_id: int) -> int | None:
        """The uid of a job the projection has not reached yet, from the controller (None: no such job)."""
        try:
            return int((await self.source.ask("job", {"job_id": job_id}))["job"]["spec"]["uid"])
        except (SourceError, KeyError, TypeError):
            return None

    async def cluster(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            return _html(layout.login_page(), status=401)
        s = await self.source.db(_series)
        return _html(cluster.cluster_page(s, who.user))

    async def cluster_at(self, request: web.Request) -> web.StreamResponse:
        who = self._user(request)
        if who is None:
            raise web.HTTPUnauthorized()
        try:
            t = int(request.query.get("t", ""))
        except ValueError:
            raise web.HTTPBadRequest(text="t: a moment in epoch seconds\n") from None
        mine = who.uid if await self._private(who) else None
        rows = [dict(r) for r in await self.source.db(queries.queue_at, t, mine)]
        return web.Response(text=cluster.queue_at_html(rows, t), content_type="text/html")

    # ------------------------------------------------------------ metrics

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """Open on a loopback server (as an exporter is); elsewhere only with the metrics token. Per-user series
        are left out where jobs or usage are private, unless the scrape carries the token."""
        authorised = bool(self.metrics_token) and request.headers.get("Authorization") == f"Bearer {self.metrics_token}"
        if not self.loopback and not authorised:
            return web.Response(status=401, text="Authorization: Bearer <the metrics token> is required\n")
        cfg = await self.source.config()
        private = set((cfg.get("auth") or {}).get("private_data", ()))
        fig = await self.source.ask("metrics")
        proj = await self.source.db(queries.scrape_figures)
        body = exposition(fig, proj, authorised or not private & {"jobs", "usage", "users"})
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _series(conn: Any) -> history.Series:
    """The cluster over time, from the first submit to the projection's newest moment."""
    first = conn.execute("SELECT MIN(submit) FROM jobs WHERE submit > 0").fetchone()[0]
    now = max(queries.log_time(conn), int(time.time()))
    t0 = int(first or now)
    return history.series(queries.activity(conn), queries.reason_spans(conn), queries.node_history(conn), t0, max(now, t0))


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html")


def _tag(text: str) -> str:
    return '"' + hashlib.blake2b(text.encode(), digest_size=12).hexdigest() + '"'


def is_loopback(address: str) -> bool:
    try:
        return ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"

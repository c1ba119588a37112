"""The web view: sign-in tokens, the cluster's history, /metrics in Prometheus's format, and every page in a real
headless Chromium against a real `rota up` (as root, and as another user under PrivateData=jobs)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import run_as, wait_for
from rota.controller.natsserver import free_port
from rota.web.auth import Sessions
from rota.web.history import series
from rota.web.metrics import exposition
from rota.wire.webtoken import TokenError, check, issue

BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = b"k" * 32


def test_a_token_names_its_caller_until_it_expires_and_is_refused_when_altered():
    token = issue(KEY, "ann", 1001, False, now=1000)
    who = check(KEY, token, now=1500)
    assert (who.user, who.uid, who.operator) == ("ann", 1001, False)
    with pytest.raises(TokenError, match="expired"):
        check(KEY, token, now=1000 + 601)
    with pytest.raises(TokenError, match="not issued by this cluster"):
        check(b"x" * 32, token, now=1500)
    body, mac = token.split(".")
    forged = body.replace(body[5], "A" if body[5] != "A" else "B") + "." + mac     # another user, the same MAC
    with pytest.raises(TokenError):
        check(KEY, forged, now=1500)
    with pytest.raises(TokenError, match="not a rota web token"):
        check(KEY, "../../etc/passwd", now=1500)


def test_a_token_opens_one_session_only():
    now = [1000.0]
    sessions = Sessions(KEY, clock=lambda: now[0])
    token = issue(KEY, "ann", 1001, False, now=1000)
    sid, who = sessions.login(token)
    assert sessions.user(sid) == who and sessions.user("guess") is None
    with pytest.raises(TokenError, match="used already"):
        sessions.login(token)
    now[0] += 9 * 3600                                   # past the session's 8 hours
    assert sessions.user(sid) is None


def test_the_cluster_over_time_counts_gpus_and_the_queue_by_reason():
    runs = [(100, 200, 4), (150, 0, 2)]                          # the second still runs
    spans = [("Resources", 100, 150), ("Priority", 120, None)]
    nodes = [("n1", 0, "IDLE", "", 8), ("n2", 0, "IDLE", "", 4), ("n2", 170, "DRAIN", "fan", 4),
             ("n2", 260, "IDLE", "", 4)]
    s = series(runs, spans, nodes, 100, 300, points=5)          # moments 100, 150, 200, 250, 300
    assert s.times == [100, 150, 200, 250, 300] and s.total == 12
    assert s.allocated == [4, 6, 2, 2, 2]
    assert s.drained == [0, 0, 4, 4, 0]
    assert s.idle == [8, 6, 6, 6, 10]
    assert s.queue == {"Priority": [0, 1, 1, 1, 1], "Resources": [1, 0, 0, 0, 0]}


FIGURES = {"ok": True, "now": 2000, "seq": 420, "log_time": 1990, "leader": True, "pending": 3, "running": 2,
           "queue": [["gpu", "Priority", 1], ["gpu", "Resources", 2]],
           "gpus": {"allocated": 6, "idle": 1, "drained": 1, "down": 0}, "gpus_allocated_unused": 2,
           "running_by": [["ann", "phys", 1, 4], ["bob", "bio", 1, 2]],
           "cycle": {"buckets": [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
                     "counts": [3, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6], "sum": 0.05, "count": 6},
           "heartbeat_age": {"gpu01": 1.5}}


def test_metrics_parse_with_prometheus_parser_and_leave_users_out_when_private():
    proj = {"seq": 400, "now": 1980, "gpu_seconds": [("ann", "phys", 7200)]}
    families = {f.name: f for f in text_string_to_metric_families(exposition(FIGURES, proj, True).decode())}
    value = {(f.name, s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert value[("rota_queue_jobs", "rota_queue_jobs", (("partition", "gpu"), ("reason", "Resources")))] == 2
    assert value[("rota_gpus", "rota_gpus", (("state", "allocated"),))] == 6
    assert value[("rota_events_appended", "rota_events_appended_total", ())] == 420
    assert value[("rota_projection_lag_events", "rota_projection_lag_events", ())] == 20
    assert value[("rota_projection_lag_seconds", "rota_projection_lag_seconds", ())] == 10
    assert value[("rota_cycle_duration_seconds", "rota_cycle_duration_seconds_bucket", (("le", "0.01"),))] == 5
    assert value[("rota_cycle_duration_seconds", "rota_cycle_duration_seconds_count", ())] == 6
    assert value[("rota_user_gpu_seconds", "rota_user_gpu_seconds_total", (("account", "phys"), ("user", "ann")))] == 7200
    assert families["rota_cycle_duration_seconds"].type == "histogram"
    hidden = {f.name for f in text_string_to_metric_families(exposition(FIGURES, proj, False).decode())}
    assert "rota_user_jobs_running" not in hidden and "rota_gpus" in hidden


# ---------------------------------------------------------------- a real rota up, a real browser

CONF = """GresTypes=gpu
NodeName=gpu01 CPUs=8 RealMemory=16000 Gres=gpu:a100:4
PartitionName=gpu Nodes=gpu01 Default=YES MaxTime=1:00:00
PrivateData=jobs
"""


@pytest.fixture
def site():
    """`rota up` with its web view on a free port; yields (environment, base URL)."""
    base = Path(tempfile.mkdtemp(prefix="rota-web-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    port = free_port()
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), ROTA_WEB_PORT=str(port))
    with open(base / "up.log", "w") as fh:
        up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus", "a100:4"],
                              env=env, stdout=fh, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: (base / "state" / "cluster.json").exists(), what="rota up")
        wait_for(lambda: _status(url + "/login") == 401, what="rota web")
        assert json.loads((base / "state" / "cluster.json").read_text())["web"] == url
        yield env, url
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def _status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _run(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], env=env, capture_output=True, text=True, timeout=60)


def _token_as_nobody(env: dict) -> str:
    def ask(_argv):
        from rota.cli.client import request

        print(request("web_token", {})["token"])
        return 0
    code, out, err = run_as("nobody", ask, [], "/", env={"ROTA_STATE_DIR": env["ROTA_STATE_DIR"]})
    assert code == 0, err
    return out.strip()


def _submit_as_nobody(env: dict) -> int:
    from rota.cli.sbatch import main as sbatch

    code, out, err = run_as("nobody", sbatch, ["--parsable", "--hold", "-J", "theirs", "-o", "/dev/null", "--wrap", "true"],
                            "/tmp", env={"ROTA_STATE_DIR": env["ROTA_STATE_DIR"]})
    assert code == 0, err
    return int(out.strip())


def _shots() -> Path:
    """Where the pages' screenshots go: $ROTA_WEB_SHOTS (make web-shots: docs/web), else a temporary folder."""
    out = Path(os.environ.get("ROTA_WEB_SHOTS") or tempfile.mkdtemp(prefix="rota-shots-"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it with apt-get)")
def test_every_page_in_a_browser_and_the_timeline_says_what_why_says(site):
    from playwright.sync_api import sync_playwright

    env, url = site
    sub = lambda *a: int(_run(env, "sbatch", "--parsable", "-o", "/dev/null", *a).stdout.strip())  # noqa: E731
    big = sub("--gres=gpu:2", "-t", "30", "-J", "train", "--wrap", "sleep 600")
    wait_for(lambda: "R" in _run(env, "squeue", "-h", "-j", str(big), "-o", "%t").stdout, what="the first job")
    time.sleep(1.1)                          # the others a second later: the queue's past differs from its present
    waiting = sub("--gres=gpu:4", "-t", "30", "-J", "sweep", "--wrap", "sleep 60")
    small = sub("--gres=gpu:1", "-t", "5", "-J", "probe", "--wrap", "sleep 600")
    theirs = _submit_as_nobody(env)
    wait_for(lambda: "R" in _run(env, "squeue", "-h", "-j", str(small), "-o", "%t").stdout, what="the backfilled job")
    assert _status(url + "/", {"Host": "evil.example:80"}) == 421      # no DNS rebinding onto loopback
    shots = _shots()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(url + "/")
        assert "rota web login" in page.content()                        # no session: how to sign in
        token = _run(env, "rota", "web", "login").stdout.strip()
        assert token.startswith(url + "/login?token=")
        page.goto(token)
        rows = page.locator("#rows tr")
        ids = {int(r.get_attribute("data-job")) for r in rows.all()}
        assert {big, waiting, small, theirs} <= ids                      # root sees everyone's jobs
        assert page.locator(f'#rows tr[data-job="{waiting}"]').get_attribute("data-reason") == "Resources"
        page.screenshot(path=str(shots / "queue.png"), full_page=True)
        page.select_option("select[name=state]", "RUNNING")              # a filter: only running jobs stay
        page.wait_for_url("**state=RUNNING**")
        assert {r.get_attribute("data-state") for r in page.locator("#rows tr").all()} == {"RUNNING"}
        page.goto(url + "/")
        page.click(f'#rows tr[data-job="{waiting}"] a')
        page.wait_for_url(f"**/job/{waiting}")
        drawn = [(r.get_attribute("data-reason"), int(r.get_attribute("data-start")), int(r.get_attribute("data-end")))
                 for r in page.locator("#timeline rect.iv").all()]
        why = json.loads(_run(env, "rota", "why", str(waiting), "--json").stdout)
        told = [(iv["reason"], iv["start"], iv["end"]) for iv in why["intervals"]]
        assert drawn and [d[:2] for d in drawn] == [t[:2] for t in told] and drawn[:-1] == told[:-1]
        assert page.locator("#timeline path.backfill").count() >= 1       # the small job passed it
        assert str(why["submit_seq"]) in page.locator("#events").inner_text()
        page.screenshot(path=str(shots / "job.png"), full_page=True)
        page.goto(url + "/nodes")
        held = [s.get_attribute("data-job") for s in page.locator('.node[data-node="gpu01"] .slot').all()]
        assert sorted(held) == sorted([str(big), str(big), str(small), "0"])
        page.screenshot(path=str(shots / "nodes.png"), full_page=True)
        page.goto(url + "/cluster")
        page.wait_for_selector("#at table")
        assert page.locator("#gpus polyline").count() == 3
        first = int(page.get_attribute("#moment", "min"))
        page.eval_on_selector("#moment", f"(s) => {{ s.value = {first}; s.dispatchEvent(new Event('input')); }}")
        page.wait_for_selector(f'#at p[data-t="{first}"]')
        assert [int(r.get_attribute("data-job")) for r in page.locator("#at tbody tr").all()] == [big]   # then, only it
        page.screenshot(path=str(shots / "cluster.png"), full_page=True)
        browser.close()
    metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(metrics)}
    gpus = {s.labels["state"]: s.value for s in fams["rota_gpus"].samples}
    assert gpus["allocated"] == 3 and gpus["idle"] == 1
    assert "rota_user_jobs_running" not in fams                         # PrivateData=jobs: no per-user series


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it with apt-get)")
def test_another_user_sees_only_their_own_jobs_and_cannot_open_someone_elses(site):
    from playwright.sync_api import sync_playwright

    env, url = site
    mine = int(_run(env, "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 600").stdout)
    wait_for(lambda: "R" in _run(env, "squeue", "-h", "-j", str(mine), "-o", "%t").stdout, what="root's job")
    theirs = _submit_as_nobody(env)
    token = _token_as_nobody(env)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{url}/login?token={token}")
        assert [int(r.get_attribute("data-job")) for r in page.locator("#rows tr").all()] == [theirs]
        assert "nobody" in page.locator("header .who").inner_text()
        answer = page.goto(f"{url}/job/{mine}")
        assert answer.status == 404 and "Invalid job id specified" in page.content()
        assert page.goto(f"{url}/job/{theirs}").status == 200
        page.goto(url + "/nodes")
        assert page.locator(".slot.hidden").count() == 1 and page.locator(f'.slot[data-job="{mine}"]').count() == 0
        again = browser.new_page()
        again.goto(f"{url}/login?token={token}")                          # a token opens one session only
        assert "used already" in again.content()
        browser.close()


def test_the_grafana_dashboard_asks_only_for_series_rota_exports():
    import re

    dashboard = json.loads((Path(__file__).parent.parent / "ops" / "grafana" / "rota-dashboard.json").read_text())
    asked = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"rota_[a-z_]+", t["expr"])}
    proj = {"seq": 1, "now": 1, "gpu_seconds": [("ann", "phys", 1)]}
    exported = {s.name for f in text_string_to_metric_families(exposition(FIGURES, proj, True).decode()) for s in f.samples}
    assert asked and asked <= exported, asked - exported


def test_beyond_loopback_only_behind_tls_and_with_a_real_metrics_token(tmp_path):
    from rota.programs.web import WebSetupError, web_settings

    assert web_settings("127.0.0.1", None, None, None) == (None, None)
    with pytest.raises(WebSetupError, match="not loopback: give --tls-cert and --tls-key"):
        web_settings("0.0.0.0", None, None, None)
    short = tmp_path / "token"
    short.write_text("abc\n")
    with pytest.raises(WebSetupError, match="at least 16 characters"):
        web_settings("127.0.0.1", None, None, str(short))
    with pytest.raises(WebSetupError, match="cannot read --metrics-token-file"):
        web_settings("127.0.0.1", None, None, str(tmp_path / "missing"))


def test_a_port_another_user_holds_first_is_never_named_to_rota_web_login():
    import socket

    base = Path(tempfile.mkdtemp(prefix="rota-web-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()                               # someone else's server, there before rota's
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), ROTA_WEB_PORT=str(squatter.getsockname()[1]))
    with open(base / "up.log", "w") as fh:
        up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus", "a100:4"],
                              env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (base / "state" / "cluster.json").exists(), what="rota up")
        assert json.loads((base / "state" / "cluster.json").read_text())["web"] is None
        r = _run(env, "rota", "web", "login")
        assert r.returncode == 1 and "no web view runs" in r.stderr and "token=" not in r.stdout + r.stderr
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
        squatter.close()
        shutil.rmtree(base, ignore_errors=True)

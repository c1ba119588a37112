"""Notifications: --mail-type and --mail-user, each notice an effect of an event (or of the clock passing a share of a
time limit), sent at least once through the configured transports; a real local HTTP server stands for a webhook."""
import http.server
import socketserver
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from harness import Harness, make_cluster
from helpers import wait_for
from rota.core.notify import MailTypeError, expand, notices, time_notices

BIN = Path(sys.executable).parent


def test_mail_types_expand_as_slurm_names_them():
    assert expand("ALL") == ("BEGIN", "END", "FAIL", "REQUEUE", "INVALID_DEPEND", "STAGE_OUT")
    assert expand("end,fail,TIME_LIMIT_80") == ("END", "FAIL", "TIME_LIMIT_80") and expand("NONE") == ()
    with pytest.raises(MailTypeError):
        expand("END,LATER")


def test_each_notice_is_the_effect_of_an_event_and_keyed_once():
    h = Harness(make_cluster(nodes=1, gpus=4))
    ok = h.submit(user="ann", name="ok", time_limit=600, mail_type=("BEGIN", "END"), mail_user="ann@example.org")
    bad = h.submit(user="bob", name="bad", time_limit=600, mail_type=("END", "FAIL"))
    quiet = h.submit(user="cat", name="quiet", time_limit=600)
    h.cycle()
    h.advance(100)
    h.finish(ok)
    h.finish(bad, state="FAILED", exit_code=3)
    h.finish(quiet)
    seen = []
    from rota.core.state import State
    from rota.core.apply import apply
    st = State()
    for env in h.log:
        apply(st, env)
        seen.extend(notices(st, env))
    assert [(n.key, n.to) for n in seen] == [(f"{ok}.0.BEGIN", "ann@example.org"), (f"{ok}.0.END", "ann@example.org"),
                                             (f"{bad}.0.FAIL", "bob")]
    assert seen[1].subject == f"Slurm Job_id={ok} Name=ok Ended, Run time 00:01:40, COMPLETED, ExitCode 0"
    assert seen[2].subject == f"Slurm Job_id={bad} Name=bad Failed, Run time 00:01:40, FAILED, ExitCode 3"


def test_time_limit_notices_come_due_with_the_share_of_the_limit_used():
    h = Harness(make_cluster(nodes=1, gpus=4))
    job = h.submit(user="ann", name="long", time_limit=1000, mail_type=("TIME_LIMIT_50", "TIME_LIMIT_90"))
    h.cycle()
    start = h.state.jobs[job].start_time
    assert time_notices(h.state, start + 499) == []
    assert [n.kind for n in time_notices(h.state, start + 500)] == ["TIME_LIMIT_50"]
    assert [n.kind for n in time_notices(h.state, start + 950)] == ["TIME_LIMIT_50", "TIME_LIMIT_90"]
    assert time_notices(h.state, start + 950)[1].subject.endswith("Reached 90% of time limit, Run time 00:15:50")


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook that refuses its first call (to prove the retry) and keeps the rest."""

    received: list[dict] = []
    refused = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Hook.refused == 0:
            Hook.refused += 1
            self.send_response(503)
        else:
            Hook.received.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    Hook.received, Hook.refused = [], 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def test_a_webhook_receives_end_for_a_finished_job_even_after_refusing_once(webhook):
    base = Path(tempfile.mkdtemp(prefix="rota-notify-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text("NodeName=n1 CPUs=2 RealMemory=2000\nPartitionName=main Nodes=n1 Default=YES "
                                     f"MaxTime=1:00:00\nRotaNotifyWebhook={webhook}\n")
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    with open(base / "up.log", "w") as fh:
        up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf")], env=env, stdout=fh,
                              stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (base / "state" / "cluster.json").exists(), what="rota up")
        run = lambda *argv: subprocess.run([str(BIN / argv[0]), *argv[1:]], env=env, capture_output=True,  # noqa: E731
                                           text=True, cwd=base, timeout=30)
        ok = run("sbatch", "--parsable", "--mail-type=END", "--mail-user=ann@example.org", "-o", "/dev/null",
                 "--wrap", "true")
        assert ok.returncode == 0, ok.stderr
        jid = int(ok.stdout.strip())
        quiet = run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true")
        assert quiet.returncode == 0
        bad = run("sbatch", "--mail-type=LATER", "--wrap", "true")
        assert bad.returncode == 1 and "--mail-type=LATER invalid" in bad.stderr
        wait_for(lambda: Hook.received, timeout=30, what="the END notice")
        (notice,) = Hook.received
        assert (notice["key"], notice["kind"], notice["to"]) == (f"{jid}.0.END", "END", "ann@example.org")
        assert notice["subject"].startswith(f"Slurm Job_id={jid} Name=wrap Ended, Run time ")
        assert Hook.refused == 1                       # the first try failed: it was sent again
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)


class _Smtp(socketserver.StreamRequestHandler):
    """The least of an SMTP relay: it keeps each message it is given."""

    messages: list[str] = []

    def handle(self):
        self.wfile.write(b"220 test ESMTP\r\n")
        data: list[str] = []
        in_data = False
        for raw in self.rfile:
            line = raw.decode().rstrip("\r\n")
            if in_data:
                if line == ".":
                    in_data = False
                    _Smtp.messages.append("\n".join(data))
                    self.wfile.write(b"250 kept\r\n")
                else:
                    data.append(line)
                continue
            verb = line.split(" ", 1)[0].upper()
            if verb == "DATA":
                in_data = True
                self.wfile.write(b"354 go on\r\n")
            elif verb == "QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


def test_mail_goes_through_an_smtp_relay_and_a_command_gets_the_notice_on_its_input(tmp_path):
    from rota.projections.notifier import Command, Mail, transports

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Smtp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notice = {"key": "7.0.END", "job_id": 7, "kind": "END", "to": "ann", "fields": {"job_id": 7},
              "subject": "Slurm Job_id=7 Name=x Ended, Run time 00:00:01, COMPLETED, ExitCode 0"}
    try:
        _Smtp.messages = []
        Mail(f"127.0.0.1:{server.server_address[1]}", "rota@cluster").send(notice)
        (msg,) = _Smtp.messages
        assert "To: ann@localhost" in msg and "Subject: Slurm Job_id=7 Name=x Ended" in msg
    finally:
        server.shutdown()
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ncat > {tmp_path / 'got.json'}\n")
    hook.chmod(0o755)
    Command(str(hook)).send(notice)
    assert json.loads((tmp_path / "got.json").read_text())["key"] == "7.0.END"
    with pytest.raises(ValueError, match="http:// or https://"):
        transports({"notify_webhook": "file:///etc/passwd"})


def test_a_submit_past_sbatch_with_a_forged_address_or_notice_kind_is_refused():
    """Mail headers come from --mail-user: the controller refuses control characters in it whoever submits."""
    from rota.core import events as ev
    from rota.core.commands import Rejected

    h = Harness(make_cluster(nodes=1, gpus=4))
    with pytest.raises(Rejected, match="Invalid --mail-user value"):
        h.submit(user="ann", time_limit=60, mail_type=("END",), mail_user="ann\r\nBcc: all@example.org")
    with pytest.raises(Rejected, match="Invalid --mail-type value 'LATER'"):
        h.submit(user="ann", time_limit=60, mail_type=("LATER",))
    assert isinstance(h.state.jobs[h.submit(user="ann", time_limit=60, mail_type=("END",), mail_user="a@b")].spec,
                      ev.JobSpec)

"""Test helpers: signing a request as a node's signer would, and running a command as another user.

The second user is real to the kernel: a forked child of the test process drops to the user's uid
and gid and calls the command's ``main`` (the test's Python may live where that user cannot read,
so what the command imports later is imported here first).
"""
from __future__ import annotations

import os
import pwd
import sys
from typing import Any, Callable

# what the commands import on first use; a child that has become another user may not be able to read them
PRELOAD = ("inspect", "argparse", "locale", "gettext", "shutil", "textwrap", "traceback", "json", "sqlite3", "datetime",
           "rota.cli.client", "rota.cli.options", "rota.cli.exits", "rota.cli.timespec", "rota.cli.sacct",
           "rota.cli.sinfo", "rota.cli.sacctmgr", "rota.cli.scontrol", "rota.cli.scancel", "rota.cli.squeue", "rota.cli.sbatch",
           "rota.wire.localsock", "rota.wire.paths", "rota.core.timefmt", "rota.core.hostlist", "rota.core.arrays",
           "rota.core.states")


def wait_for(check: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """``check()``'s first true value, polled every 0.1 s; AssertionError naming ``what`` after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: Any, timeout: float = 30) -> None:
    """Stop a `rota up` (or agent) as Ctrl-C does; killed if it has not stopped within ``timeout`` s."""
    import signal
    import subprocess

    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def signed_headers(keyring: Any, host: str, subject: str, rid: str, payload: bytes, uid: int = 0,
                   gid: int = 0, now: float | None = None) -> dict[str, str]:
    """The headers a request carries when ``host``'s signer forwards it for ``uid``/``gid`` (at ``now``)."""
    import time

    from rota.agents.signer import CRED_HEADER, RID_HEADER, Signer

    signer = Signer("/nonexistent", host, keyring, None, clock=time.time if now is None else (lambda: now))
    return {CRED_HEADER: signer.sign(subject, rid, payload, uid, gid), RID_HEADER: rid}


def run_as(user: str, main: Callable[[list[str]], int], argv: list[str], cwd: str,
           env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``main(argv)`` as ``user`` in a forked child; returns (exit status, stdout, stderr)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    pw = pwd.getpwnam(user)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: become the user, run the command, report its status
        code = 1
        try:
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            os.setgroups([])
            os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
            os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
            os.chdir(cwd)
            sys.argv = [getattr(main, "__module__", "cmd"), *argv]
            sys.stdout = os.fdopen(1, "w", closefd=False)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            import inspect

            if "out" in inspect.signature(main).parameters:   # run(argv, out, err): its defaults are bound early
                code = main(argv, sys.stdout, sys.stderr)
            else:
                code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - the test wants to see it
            os.write(2, f"Traceback: {type(exc).__name__}: {exc}\n".encode())
            code = 99
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code or 0)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r) as fo, os.fdopen(err_r) as fe:
        out, err = fo.read(), fe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out, err


def tls_files(folder) -> tuple[str, str, str] | None:
    """A private CA and a server certificate for 127.0.0.1 and localhost, made with openssl in ``folder``:
    (CA, certificate, key) paths; None where openssl is missing."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("openssl") is None:
        return None
    ca_key, ca, key, csr, cert = (Path(folder) / n for n in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem"))
    ext = Path(folder) / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
                 "-subj", "/CN=rota test CA"],
                ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
                ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext]):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    return str(ca), str(cert), str(key)

"""``rota audit``: evidence an auditor can check without the cluster's secret. ``digest`` prints the log's signed
head (keep it outside the cluster), ``export`` writes the log and its snapshots as stored, and ``verify`` checks
them, live or exported, with the controllers' public keys alone: every record's place in the hash chain, every
signature, every snapshot, and the log against a digest kept earlier."""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import typer

app = typer.Typer(help="Check the log's history with public keys alone (digest, export, verify).",
                  no_args_is_help=True)


def _fail(message: str) -> None:
    typer.echo(f"rota audit: {message}", err=True)
    raise typer.Exit(2)


def _read_cluster(nats: Optional[str]) -> tuple[list, dict[str, bytes]]:
    from rota.controller.audit import stored_records, stored_snapshots
    from rota.controller.eventlog import JetStreamLog
    from rota.wire.cluster import NoCluster, NotAdmin, admin_connection

    try:
        urls, options = admin_connection(nats)
    except (NoCluster, NotAdmin) as exc:
        _fail(str(exc))
    options.pop("keyring", None)       # nothing here is checked with the cluster key

    async def read() -> tuple[list, dict[str, bytes]]:
        lg = await JetStreamLog.connect(urls, **options)
        try:
            return [r async for r in stored_records(lg)], await stored_snapshots(lg)
        finally:
            await lg.close()
    try:
        return asyncio.run(read())
    except OSError as exc:
        _fail(f"cannot read the cluster's log: {exc}")
    raise AssertionError("unreachable")


def _source(records: Optional[str], nats: Optional[str]) -> tuple[list, dict[str, bytes]]:
    if records is None:
        return _read_cluster(nats)
    from rota.controller.audit import read_export

    try:
        with open(records, "rb") as fh:
            return read_export(fh, records)
    except OSError as exc:
        _fail(f"cannot read {records}: {exc.strerror}")
    except ValueError as exc:
        _fail(str(exc))
    raise AssertionError("unreachable")


def _keys(keys: list[str]) -> list[str]:
    for k in keys:
        if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
            _fail(f"--key {k[:20]!r}: a public key is 64 hex digits (rota audit verify prints the ones it saw)")
    return keys


@app.command()
def digest(
    at: Optional[int] = typer.Option(None, "--at", min=1, help="the sequence to take it at (default: the last "
                                     "signed head of the log)"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
) -> None:
    """Print the log's signed head (at or before --at): one line to keep outside the cluster; `rota audit verify
    --digest` later proves the log up to it unchanged."""
    from rota.controller.audit import run

    records, _snapshots = _source(None, nats)
    if at is not None:
        records = [r for r in records if r[0] <= at]
    audit = run(records, {})
    if audit.problems:
        for p in audit.problems:
            typer.echo(f"rota audit: {p}", err=True)
        _fail("the log does not check: no digest taken")
    if audit.last_seal is None:
        _fail("no signed head at or before that sequence (the log's controller signs each group it appends)")
    assert audit.last_seal is not None
    typer.echo(audit.last_seal.text())


@app.command()
def export(
    out: str = typer.Argument(..., help="the file to write (JSON lines)"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
) -> None:
    """Write the log and its snapshots as stored, for an auditor to verify without the cluster."""
    import os

    from rota.controller.audit import export_lines

    records, snapshots = _read_cluster(nats)
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        _fail(f"cannot write {out}: {exc.strerror} (it must not exist yet)")
    with os.fdopen(fd, "w") as fh:
        for line in export_lines(records, snapshots):
            fh.write(line + "\n")
    typer.echo(f"rota audit: wrote {len(records)} records and {len(snapshots)} snapshots to {out} (it holds every "
               "job's script and environment: keep it as private as the log)")


@app.command()
def verify(
    digest_text: Optional[str] = typer.Option(None, "--digest", help="a digest rota audit digest printed earlier"),
    key: list[str] = typer.Option([], "--key", help="a controller's public key to trust (hex; repeat for each); "
                                  "default: any key the log names, with the digest binding the history"),
    records: Optional[str] = typer.Option(None, "--records", help="a file rota audit export wrote, instead of the "
                                          "cluster's log"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
) -> None:
    """Check every record's hash chain and signature and every snapshot's signature with public keys alone, and
    the log against a digest: the first changed record is named by its sequence."""
    from rota.controller.audit import run
    from rota.core.chain import Digest
    from rota.wire.audit import key_id

    given: Any = None
    if digest_text is not None:
        try:
            given = Digest.parse(digest_text)
        except ValueError as exc:
            _fail(str(exc))
    loaded, snapshots = _source(records, nats)
    audit = run(loaded, snapshots, _keys(key), given)
    for p in audit.problems:
        typer.echo(f"FAILED: {p}")
    if audit.problems:
        raise typer.Exit(1)
    signers = ", ".join(f"{key_id(k)} ({k})" for k in sorted(audit.signers)) or "none"
    typer.echo(f"OK: {audit.seq} records, chained from {audit.chained_from or '-'}, signed up to {audit.signed_at}; "
               f"{len(snapshots) - audit.unsigned_snapshots} snapshots"
               + (f" ({audit.unsigned_snapshots} more from before the log was signed, not checked)"
                  if audit.unsigned_snapshots else "")
               + (f"; the digest at {given.seq} matches" if given else "")
               + f"; signed by {signers}")

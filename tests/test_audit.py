"""Evidence an auditor checks without the cluster's secret: the log's hash chain, the controller's signatures of
its head and of each snapshot, and a digest kept outside the cluster. Each attack rewrites what is stored (one
record's body; the same with every later hash recomputed, as a holder of the cluster key could; the whole log
re-signed with a key of the forger's own; a snapshot) and the audit names where."""
import base64
import json
import subprocess
import sys
from pathlib import Path

from rota.controller import audit
from rota.controller.records import chain_link
from rota.controller.service import Controller
from rota.core import chain as ch
from rota.core import events as ev
from rota.core.slurmconf import parse_config
from rota.wire.audit import CHAIN_HEADER, SIG_HEADER, AuditKey

BIN = Path(sys.executable).parent
CFG = parse_config("NodeName=n1 CPUs=8 RealMemory=8000\nPartitionName=p Nodes=n1 Default=YES MaxTime=1:00:00\n",
                   "slurm.conf")


async def _cluster(jetstream, tmp_path) -> tuple[Controller, AuditKey]:
    lg = await jetstream()
    lg.audit = key = AuditKey.load_or_create(str(tmp_path / "audit.key"))
    c = Controller(lg, config=CFG)
    await c.start()
    for i in range(6):
        spec = ev.JobSpec(name=f"j{i}", time_limit=60, hold=True).model_dump(mode="json", exclude={"user", "uid", "gid"})
        r = await c.handle("submit", {"rid": f"r{i}", "spec": spec})
        assert r["ok"], r
    assert await c.maybe_snapshot(force=True)
    return c, key


def _reseal(records, start: int, key: AuditKey | None) -> list:
    """What a holder of the stored log does to hide a change: every hash from ``start`` on recomputed (and, with a
    key of its own, every seal re-signed)."""
    head = ch.GENESIS
    out = []
    for seq, headers, body in records:
        h = dict(headers)
        head = chain_link(head, seq, h, body)
        if seq >= start:
            h[CHAIN_HEADER] = head.hex()
            if key is not None and SIG_HEADER in h:
                h[SIG_HEADER] = key.seal_head(seq, head)
        out.append((seq, h, body))
    return out


async def test_every_rewrite_of_the_stored_log_is_found_and_named(jetstream, tmp_path):
    c, key = await _cluster(jetstream, tmp_path)
    records = [r async for r in audit.stored_records(c.log)]
    snapshots = await audit.stored_snapshots(c.log)
    clean = audit.run(records, snapshots)
    assert clean.problems == [] and clean.signers == {key.public} and clean.signed_at == records[-1][0]
    assert "latest" in snapshots and audit.snapshot_seq(snapshots["latest"]) == c.state.seq
    digest = clean.last_seal
    assert digest is not None and ch.Digest.parse(digest.text()) == digest

    # one record's body changed as stored (a job's name): named by its sequence
    k = next(seq for seq, _h, body in records if b'"j2"' in body)
    changed = [(s, h, body.replace(b'"j2"', b'"j9"') if s == k else body) for s, h, body in records]
    assert audit.run(changed, {}).problems == [f"record {k} was changed: what it holds is not what its chain hash covers"]

    # ... and every later hash recomputed to match: the controller's signature of the head no longer verifies
    forged = _reseal(changed, k, None)
    problems = audit.run(forged, {}).problems
    assert len(problems) == 1 and "the signature on record" in problems[0] and "were changed after they were signed" \
        in problems[0], problems

    # ... and re-signed with a key of the forger's own: only the digest kept outside (or a trusted key) tells
    theirs = AuditKey.load_or_create(str(tmp_path / "forger.key"))
    resigned = _reseal(changed, 1, theirs)
    assert audit.run(resigned, {}).problems == []
    assert audit.run(resigned, {}, digest=digest).problems == [
        f"the log up to sequence {digest.seq} is not the one the digest was taken of: a record at or before it was "
        "changed, added or removed"]
    assert "not one of the trusted keys" in audit.run(resigned, {}, keys=[key.public]).problems[0]

    # a record removed from the end: the digest says so
    assert "before the digest's sequence" in audit.run(records[:-1], {}, digest=digest).problems[0]

    # a snapshot rewritten in the store: one job's state changed inside it, its signed head kept
    from rota.controller.snapshots import open_store

    stored = snapshots["latest"]
    altered = stored.replace(b'"j3"', b'"j8"')
    assert altered != stored
    store = await open_store(c.log.js)
    await store.put("latest", altered)
    after = audit.run(records, await audit.stored_snapshots(c.log))
    assert after.problems == [f"snapshot latest (the state at sequence {c.state.seq}) was changed after it was signed"]
    await c.stop()


async def test_rota_audit_verify_names_the_changed_record_in_an_export(jetstream, tmp_path):
    c, key = await _cluster(jetstream, tmp_path)
    lines = list(audit.export_lines([r async for r in audit.stored_records(c.log)], await audit.stored_snapshots(c.log)))
    await c.stop()
    good = tmp_path / "log.jsonl"
    good.write_text("\n".join(lines) + "\n")
    r = subprocess.run([str(BIN / "rota"), "audit", "verify", "--records", str(good), "--key", key.public],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("OK: ") and key.public in r.stdout, r
    items = [json.loads(line) for line in lines]
    k = next(i for i, item in enumerate(items) if b'"j4"' in base64.b64decode(item.get("body", "")))
    items[k]["body"] = base64.b64encode(base64.b64decode(items[k]["body"]).replace(b'"j4"', b'"jX"')).decode()
    bad = tmp_path / "changed.jsonl"
    bad.write_text("\n".join(json.dumps(i) for i in items) + "\n")
    r = subprocess.run([str(BIN / "rota"), "audit", "verify", "--records", str(bad)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and f"FAILED: record {items[k]['seq']} was changed" in r.stdout, r
    r = subprocess.run([str(BIN / "rota"), "audit", "verify", "--records", str(bad), "--digest", "nonsense"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a digest rota audit digest wrote" in r.stderr and "Traceback" not in r.stderr, r


async def test_a_log_begun_by_an_older_rota_checks_from_its_first_chained_record(jetstream, tmp_path):
    from rota.controller.records import decode_messages
    from rota.core.apply import fold
    from rota.core.state import dump_snapshot

    c, key = await _cluster(jetstream, tmp_path)
    records = [r async for r in audit.stored_records(c.log)]
    await c.stop()
    old = [(s, {k: v for k, v in h.items() if k not in (CHAIN_HEADER, SIG_HEADER)} if s <= 3 else h, b)
           for s, h, b in records]
    early = dump_snapshot(fold(decode_messages(records[:2])))          # an older rota's snapshot, unsigned
    result = audit.run(old, {"at-000000000002": early})
    assert result.problems == [] and result.chained_from == 4 and result.unsigned_snapshots == 1
    late = dump_snapshot(fold(decode_messages(records)))                # unsigned, yet after signing began
    assert audit.run(old, {"latest": late}).problems == ["snapshot latest carries no signed head"]

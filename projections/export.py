"""Parquet exports for analysis: the events of the log and the accounting rows of the projection."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any


async def export_parquet(eventlog: Any, db_path: Path, out_dir: Path, batch: int = 50_000) -> dict[str, int]:
    """Write ``events.parquet`` (seq, ts, actor, idem, type, body JSON) and ``jobs.parquet``/``steps.parquet``/
    ``nodes.parquet`` from the projection; returns the row count of each file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rota.core import events as ev

    out_dir.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("seq", pa.int64()), ("ts", pa.int64()), ("actor", pa.string()), ("idem", pa.string()),
                        ("type", pa.string()), ("event", pa.string())])
    counts: dict[str, int] = {}
    writer = pq.ParquetWriter(out_dir / "events.parquet", schema)
    n = 0
    cols: dict[str, list] = {k: [] for k in schema.names}
    try:
        async for chunk in eventlog.read_batches(1):
            for env in chunk:
                cols["seq"].append(env.seq)
                cols["ts"].append(env.ts)
                cols["actor"].append(env.actor)
                cols["idem"].append(env.idem)
                cols["type"].append(env.event.type)
                cols["event"].append(ev.EVENT_ADAPTER.dump_json(env.event).decode())
            if len(cols["seq"]) >= batch:
                writer.write_table(pa.table(cols, schema=schema))
                n += len(cols["seq"])
                cols = {k: [] for k in schema.names}
        if cols["seq"]:
            writer.write_table(pa.table(cols, schema=schema))
            n += len(cols["seq"])
    finally:
        writer.close()
    counts["events.parquet"] = n
    if db_path.exists():
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        for table in ("jobs", "steps", "nodes", "usage"):
            cur = db.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
            data = {name: [r[i] for r in rows] for i, name in enumerate(names)}
            pq.write_table(pa.table(data) if rows else pa.table({name: pa.array([], pa.string()) for name in names}),
                           out_dir / f"{table}.parquet")
            counts[f"{table}.parquet"] = len(rows)
    (out_dir / "README.json").write_text(json.dumps({"files": counts}, indent=2))
    return counts

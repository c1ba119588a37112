"""sacct, sinfo, ``scontrol show node|partition`` and ``rota report usage`` run over a cluster's projection for a caller who
cannot read it: what ``rota up`` gives its controller to answer such callers."""
from __future__ import annotations

import io
from rota.controller.port import ReportRunner


def runner(db: str) -> ReportRunner:
    """A report runner over the projection ``db``: (command, argv, caller's uid, the only uid whose jobs
    the caller may see or None, the log sequence its answer must include) -> (exit status, stdout, stderr)."""
    def run(command: str, argv: list[str], uid: int, only_uid: int | None, seq: int) -> tuple[int, str, str]:
        from rota.projections.queries import reading_at

        from . import sacct, scontrol, sinfo, time_report, usage_report

        reading_at(seq)     # this thread's own context: the controller's state when the caller asked
        out, err = io.StringIO(), io.StringIO()
        if command == "sacct":
            code = sacct.run(argv, out, err, db=db, uid=uid, only_uid=only_uid)
        elif command == "sinfo":
            code = sinfo.run(argv, out, err, db=db, uid=uid)
        elif command == "scontrol":
            code = scontrol.run_show(argv, out, err, db=db, uid=uid)
        elif command == "report" and argv[:1] == ["time-accuracy"]:
            code = time_report.run(argv[1:], out, err, db=db, uid=uid, only_uid=only_uid)
        elif command == "report":
            code = usage_report.run(argv, out, err, db=db, uid=uid, only_uid=only_uid)
        else:
            err.write(f"{command}: not a report the controller runs\n")
            code = 1
        return code, out.getvalue(), err.getvalue()
    return run

"""Command lines read as Slurm reads them (getopt_long), sbatch's own errors, and --begin/-S times."""
import time

import pytest

from rota.cli import lightjson, sacct, sbatch
from rota.cli.options import NO, OPTIONAL, REQUIRED, Option, OptionError, parse
from rota.cli.timespec import MomentError, parse_moment

from golden import blocks

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

TABLE = [Option("t", "time", REQUIRED, "time"), Option(None, "time-min", REQUIRED, "time_min"),
         Option("H", "hold", NO, "hold"), Option("v", "verbose", NO, "verbose"),
         Option("j", "jobs", OPTIONAL, "jobs"), Option("u", "user uid", REQUIRED, "user", append=True)]


@pytest.mark.parametrize("argv,values,operands", [
    (["--time=5", "x"], {"time": "5"}, ["x"]),
    (["--time", "5"], {"time": "5"}, []),
    (["--ti=5"], None, None),                              # ambiguous: time, time-min
    (["--time-m", "7"], {"time_min": "7"}, []),            # a unique prefix
    (["-t5", "-Hv"], {"time": "5", "hold": True, "verbose": True}, []),
    (["-Ht", "5"], {"hold": True, "time": "5"}, []),
    (["--jobs"], {"jobs": True}, []),
    (["--jobs=3,4"], {"jobs": "3,4"}, []),
    (["--us", "a", "--uid", "b"], {"user": ["a", "b"]}, []),   # aliases of one option are not ambiguous
    (["a", "-H", "--", "-t"], {"hold": True}, ["a", "-t"]),
])
def test_getopt_long_semantics(argv, values, operands):
    if values is None:
        with pytest.raises(OptionError):
            parse("prog", argv, TABLE)
        return
    assert parse("prog", argv, TABLE) == (values, operands)


@pytest.mark.parametrize("text,words", [
    ("2-1", "Maximum node count 1 is less than minimum node count 2"),
    ("x", '"x" is not a valid node count'), ("2-", '"2-" is not a valid node count'), ("-1", '"-1" is not a valid node count'),
])
def test_node_counts_slurm_refuses_are_refused_in_its_words(text, words):
    from rota.cli.options import node_count

    with pytest.raises(OptionError) as caught:
        node_count("sbatch", text)
    assert str(caught.value) == f"sbatch: error: {words}\nsbatch: error: invalid node count `{text}'"
    assert node_count("srun", "2-4") == 2 and node_count("srun", "3") == 3


def test_stop_at_operand_leaves_the_scripts_arguments_alone():
    assert parse("sbatch", ["-H", "job.sh", "-t", "5"], TABLE, stop_at_operand=True) == ({"hold": True},
                                                                                         ["job.sh", "-t", "5"])


@pytest.mark.parametrize("argv,message", [
    (["--nosuchoption"], "prog: unrecognized option '--nosuchoption'"),
    (["--tim=00:05:00"], "prog: option '--tim=00:05:00' is ambiguous; possibilities: '--time' '--time-min'"),
    (["--time"], "prog: option '--time' requires an argument"),
    (["--hold=yes"], "prog: option '--hold' doesn't allow an argument"),
    (["-z"], "prog: invalid option -- 'z'"),
    (["-t"], "prog: option requires an argument -- 't'"),
])
def test_getopt_errors_are_worded_as_glibc_words_them(argv, message):
    with pytest.raises(OptionError) as exc:
        parse("prog", argv, TABLE)
    assert str(exc.value) == message


def _sbatch_blocks():
    """The sbatch_errors.txt cases that sbatch decides alone (no controller), with their scripts."""
    out = []
    for block in blocks("sbatch_errors.txt"):
        if block.exit in (255,) or "Batch script is empty" in "".join(block.output) or \
                "Unable to open" in "".join(block.output) or "does not look like" in "".join(block.output) or \
                "mutually exclusive" in "".join(block.output) or "Invalid generic resource" in "".join(block.output):
            out.append(block)
    return out


@pytest.mark.parametrize("block", _sbatch_blocks(), ids=lambda b: b.command)
def test_sbatch_rejects_bad_input_exactly_as_slurm(block, tmp_path, monkeypatch, capsys):
    import shlex

    monkeypatch.chdir(tmp_path)
    for name, text in block.scripts.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr("sys.stdin", open("/dev/null"))   # a bare `sbatch` reads no script
    argv = shlex.split(block.command)[1:]
    code = sbatch.main(argv)
    err = capsys.readouterr().err
    assert code == block.exit
    assert err.splitlines() == block.output


def test_sbatch_reads_directives_and_lets_the_command_line_win(tmp_path, monkeypatch):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=\"quoted name\" -t 5 # comment\n#SBATCH --gres=gpu:a100:2\n"
                      "# SBATCH --time=99:00:00\necho hi\n#SBATCH --time=98:00:00\n")
    spec, parsable = sbatch.build_spec(["--parsable", "-t", "10", str(script)])
    assert (spec["name"], spec["time_limit"], spec["gpu_type"], spec["gpus_per_node"]) == ("quoted name", 600, "a100", 2)
    assert parsable and spec["script"].startswith("#!/bin/bash")


def test_sbatch_begin_time_and_unsupported_options():
    now = time.mktime((2026, 12, 2, 12, 0, 0, 0, 0, -1))
    spec, _ = sbatch.build_spec(["--begin", "now+1hour", "--wrap", "true"], now=now)
    assert spec["begin"] == int(now) + 3600
    spec, _ = sbatch.build_spec(["--begin=10:00", "--comment=x", "--wrap", "true"], now=now)
    assert spec["begin"] == int(now) + 22 * 3600          # 10:00 has passed today: tomorrow
    assert spec["_warnings"] == ["sbatch: warning: --comment is ignored by rota"]
    with pytest.raises(sbatch.SbatchError, match="--time-min is not supported"):
        sbatch.build_spec(["--time-min=5", "--wrap", "true"])


@pytest.mark.parametrize("text,expected", [
    ("now", 0), ("now+30", 30), ("now+2minutes", 120), ("now-1days", -86400), ("now+1week", 604800),
])
def test_relative_moments(text, expected):
    assert parse_moment(text, 1_800_000_000) == 1_800_000_000 + expected


def test_absolute_moments():
    now = time.mktime((2026, 12, 2, 12, 0, 0, 0, 0, -1))
    at = time.localtime(parse_moment("2026-12-24T18:30", now))
    assert (at.tm_year, at.tm_mon, at.tm_mday, at.tm_hour, at.tm_min) == (2026, 12, 24, 18, 30)
    assert time.localtime(parse_moment("12/25", now))[:3] == (2026, 12, 25)
    assert time.localtime(parse_moment("122527", now))[:3] == (2027, 12, 25)
    assert time.localtime(parse_moment("teatime", now))[3] == 16
    assert parse_moment("midnight", now, future=True) == parse_moment("tomorrow", now)
    assert time.localtime(parse_moment("3:15pm", now))[3:5] == (15, 15)
    for bad in ("notatime", "25:00", "13/01", "now+5parsecs", "2026-13-01"):
        with pytest.raises(MomentError):
            parse_moment(bad, now)


def test_sacct_says_which_option_is_wrong(capsys):
    import io

    err = io.StringIO()
    assert sacct.run(["--bogus"], io.StringIO(), err) == 1
    assert err.getvalue() == "sacct: unrecognized option '--bogus'\nTry \"sacct --help\" for more information\n"
    err = io.StringIO()
    assert sacct.run(["-S", "yesterdayish"], io.StringIO(), err) == 1
    assert "Invalid time specification" in err.getvalue()


def test_light_json_round_trips_what_the_commands_send():
    value = {"spec": {"name": "x\u00e9\n\"q\"", "n": 3, "f": 2.5, "ok": True, "none": None, "l": [1, "a"]}}
    assert lightjson.loads(lightjson.dumps(value)) == value
    with pytest.raises(ValueError):
        lightjson.loads("{\"a\": 1} trailing")
    with pytest.raises(TypeError):
        lightjson.dumps({"bad": object()})

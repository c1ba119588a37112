"""Hostile input on every surface (API verbs, the agents' inbox, sbatch, configuration files): one
clear answer each, never a traceback. ``python -m rota.bench.fuzz_bench`` runs the same with 10,000
inputs per surface."""
import logging

import pytest

from rota.bench import fuzz_bench

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


@pytest.mark.parametrize("surface", sorted(fuzz_bench.SURFACES))
def test_fuzzed_inputs_never_end_in_a_traceback(surface, monkeypatch):
    monkeypatch.setenv("ROTA_SOCKET", "/nonexistent/rota.sock")
    logging.disable(logging.CRITICAL)
    try:
        tally = fuzz_bench.SURFACES[surface](250)
    finally:
        logging.disable(logging.NOTSET)
    assert tally.inputs >= 200
    assert (tally.tracebacks, tally.missing_replies) == (0, 0), tally.examples


def test_a_fuzzed_surface_leaves_the_environment_and_no_files_behind(monkeypatch, tmp_path):
    """`make bench` runs the benchmarks one after another in one process: the sbatch surface points the client
    at a socket nobody serves, and what runs next must submit to a real rota again."""
    import os
    import tempfile

    monkeypatch.setenv("ROTA_SOCKET", "/run/rota-of-the-caller.sock")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logging.disable(logging.CRITICAL)
    try:
        fuzz_bench.sbatch_surface(20)
        fuzz_bench.config_surface(20)
    finally:
        logging.disable(logging.NOTSET)
    assert os.environ["ROTA_SOCKET"] == "/run/rota-of-the-caller.sock"
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("ROTA_SOCKET")
    fuzz_bench.sbatch_surface(20)
    assert "ROTA_SOCKET" not in os.environ

"""The daemons' log lines say who and when, as slurmctld's do."""
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast


def test_a_daemons_log_line_carries_who_and_the_time_to_the_millisecond():
    code = ("import logging; from rota.wire.daemonlog import daemon_logging; daemon_logging('rota agent n1'); "
            "logging.getLogger('rota.x').warning('no longer leading: %s', 'stopping'); "
            "logging.getLogger('rota.x').info('not shown')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert re.fullmatch(r"rota agent n1: \[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\] no longer leading: stopping\n", out), out

import os

import pytest
from hypothesis import Phase, settings

from harness import Harness, make_cluster

# the many `rota up`s of the suite start no web view (tests/test_web.py asks for one on a free port)
os.environ.setdefault("ROTA_WEB_PORT", "0")


@pytest.fixture
def h() -> Harness:
    """Four nodes gpu01..gpu04, 64 CPUs, 257000 MiB, 8 A100 each; partition short (1 h)."""
    return Harness(make_cluster())

# `HYPOTHESIS_PROFILE=noshrink pytest ...` reports the first failing example without shrinking
# (useful when checking that a deliberately broken scheduler is caught quickly).
settings.register_profile("noshrink", phases=[Phase.explicit, Phase.reuse, Phase.generate])
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


@pytest.fixture
async def jetstream(tmp_path):
    """A real nats-server on a free loopback port with a temporary store: ``await connect(keyring=...)``
    gives a JetStreamLog on it (closed, and the server stopped, after the test)."""
    from rota.controller import natsserver
    from rota.controller.eventlog import JetStreamLog

    srv = natsserver.start(tmp_path / "nats")
    logs = []

    async def connect(keyring=None):
        lg = await JetStreamLog.connect(srv.url, keyring=keyring)
        logs.append(lg)
        return lg

    connect.url = srv.url
    yield connect
    for lg in logs:
        await lg.close()
    srv.stop()


from test_up import up  # noqa: E402,F401 - the fixture (a real `rota up`) for other modules' tests

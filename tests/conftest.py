import pytest

from rota.core.testing import Harness, make_cluster


@pytest.fixture
def h() -> Harness:
    """Four nodes gpu01..gpu04, 64 CPUs, 257000 MiB, 8 A100 each; partition short (1 h)."""
    return Harness(make_cluster())

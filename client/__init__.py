"""rota from Python: ``from rota.client import Client`` (see :mod:`rota.cli.api`)."""
from rota.cli.api import Client, JobError, NoCluster

__all__ = ["Client", "JobError", "NoCluster"]

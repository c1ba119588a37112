"""rota from Python: ``from rota.client import Client`` (see :mod:`rota.client.api`)."""
from .api import Client, JobError, NoCluster

__all__ = ["Client", "JobError", "NoCluster"]

"""``rota web``: the queue, the nodes, every job's wait and the cluster over time in a browser, and ``/metrics``."""

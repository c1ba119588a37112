"""rota.cli."""

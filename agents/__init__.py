"""rota.agents."""

"""rota.projections."""

"""rota benchmarks."""

"""rota.programs: the processes rota runs as, each put together here from the parts below."""

"""rota.controller: the shell around the core: the event log, the NATS server, the controller."""

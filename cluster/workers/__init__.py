"""What talks to Ray: the backend, the worker actors and their channel, the session, metrics, reaping, slots."""

"""Schedule tuning: search spaces, the tuner, and the tuning database that remembers winners."""

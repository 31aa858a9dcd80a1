"""The model suite and `minicomp bench`: standard models timed under every backend."""

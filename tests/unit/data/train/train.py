"""A training program for rendering tests: only its directory is read."""

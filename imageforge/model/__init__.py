"""imageforge's model modules (see docs/architecture.md)."""

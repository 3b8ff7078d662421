"""imageforge's planning modules (see docs/architecture.md)."""

"""imageforge's sources modules (see docs/architecture.md)."""

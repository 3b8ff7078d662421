"""imageforge's image modules (see docs/architecture.md)."""

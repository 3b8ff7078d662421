"""imageforge's cache modules (see docs/architecture.md)."""

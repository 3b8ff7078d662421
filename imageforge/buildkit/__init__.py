"""imageforge's buildkit modules (see docs/architecture.md)."""

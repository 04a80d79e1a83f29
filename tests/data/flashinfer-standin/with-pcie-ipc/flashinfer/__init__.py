"""Stand-in for FlashInfer in tests (see ../../README.md)."""

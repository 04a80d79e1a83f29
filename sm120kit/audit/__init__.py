"""Static SM120 audits: shared-memory audit, shape matrices, kernel probe, backend audit, resolve probe."""

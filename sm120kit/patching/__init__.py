"""The patch series and its engine: series model, hunks, plan, state record, apply/revert/status."""

"""Helpers for tests and microbenchmarks that need more than the trace contract: hand-made
traces lowered with the generator's ring lowering (:mod:`.handmade`)."""

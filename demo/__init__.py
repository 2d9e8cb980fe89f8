"""The restart demo, and the one-container worker that tests and benchmarks reuse."""

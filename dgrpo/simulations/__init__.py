"""Scenarios, metrics and plots. Simulations run the node's own round code over an in-memory transport."""

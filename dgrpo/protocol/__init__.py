"""The wire format: strict, frozen message models."""

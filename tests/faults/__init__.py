"""Fault campaigns against the primitives, checked against their recorded histories."""

"""Helpers the test suites share (not tests themselves)."""

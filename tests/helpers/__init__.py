"""Test helpers that are not tests themselves (a local Hub server, ...)."""

"""Fixtures shared by every test area; each area keeps its own in tests/<area>/conftest.py."""

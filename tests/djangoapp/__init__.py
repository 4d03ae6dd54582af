"""A small Django project for the Django integration tests (test client and real servers)."""

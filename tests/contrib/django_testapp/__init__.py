"""A Django app for tests/contrib: a real model (orders) and Django tasks that use it."""

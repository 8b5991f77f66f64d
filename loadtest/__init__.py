"""loadtest: a service-level load tester for LLM inference endpoints."""

from loadtest.compiled import guard

__version__ = "0.1.0"
guard()  # before any compiled module is imported

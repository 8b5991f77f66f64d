"""loadtest: a service-level load tester for LLM inference endpoints."""

__version__ = "0.1.0"

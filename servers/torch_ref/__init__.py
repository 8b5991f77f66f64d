"""A self-contained PyTorch continuous-batching server speaking loadtest's OpenAI API."""

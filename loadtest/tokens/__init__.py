"""Token counting: offline tokenizers, chat templates, and finding a served model's own tokenizer."""

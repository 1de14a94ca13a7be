"""gfxasm's ops inside other frameworks. Each module imports its framework only when used:
`gfxasm.integrations.transformers` (Hugging Face transformers 5.x; the `gfxasm[hf]` extra)."""

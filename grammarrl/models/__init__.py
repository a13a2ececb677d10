"""Models: loading (Hugging Face, the embedded SmolLM2 GGUF, the tiny test model), the converted-model cache, chat prompts, LoRA, the forward counter."""

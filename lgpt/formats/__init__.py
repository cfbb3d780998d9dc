"""Model formats, one file per family: GPT-2 (gpt2), Llama / Qwen2 (llama), Gemma 3 (gemma3) and GGUF files
(gguf_file). They map foreign weights to model.py's GPT and back; they never import the method."""

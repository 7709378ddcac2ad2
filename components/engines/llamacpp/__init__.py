"""llama.cpp (llama-server): its image facts, options, argv and env, capacity model and rules."""

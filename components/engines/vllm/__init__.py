"""vLLM: its image facts, options, argv and env, capacity model, qualification check and rules."""

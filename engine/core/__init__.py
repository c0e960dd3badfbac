"""What every other room stands on: ggml's types and C struct layouts, the context's pool, tensors
and their data, the graph, the op table, errors, and the notes steps carry. Import the modules
themselves (engine.core.tensor, ...); the facades engine/ggml*.py are the doors for programs."""

"""In-process engines: the embedded engine and vLLM's, each on a worker thread in the training process."""

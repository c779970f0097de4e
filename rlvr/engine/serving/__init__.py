"""The server side: `rlvr serve`'s routes (SGLang's and OpenAI's) in front of an engine."""

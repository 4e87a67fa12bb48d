"""Coverage-guided fuzzing of the decoders of untrusted uploads (see run.py)."""

"""Reading commits back: chunk locations -> verified bytes -> tensors (``tensors``) or files (``export``)."""

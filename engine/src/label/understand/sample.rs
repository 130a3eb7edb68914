//! Sampling the next token as upstream does: top-k, top-p, temperature or argmax.

//! The decoding loop: constrained logits, sampling, stopping.

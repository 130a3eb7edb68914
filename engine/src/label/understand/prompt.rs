//! The understand prompt, rendered with the LM folder's chat template, and its tokens.

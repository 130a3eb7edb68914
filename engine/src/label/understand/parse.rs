//! Reading the LM's text: the metadata fields in its think block and the lyrics after it.

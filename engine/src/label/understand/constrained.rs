//! The constrained decoding of the metadata block (upstream's MetadataConstrainedLogitsProcessor, understand phase).

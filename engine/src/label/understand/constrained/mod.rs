//! The constrained decoding of the metadata block: upstream's
//! MetadataConstrainedLogitsProcessor as understand mode runs it, its per-LM tables
//! (`tables`, with the value trees, the genres trie and the tokenizer's view of the
//! vocabulary) and its per-song state machine (`fsm`).

mod fsm;
mod genres;
mod pystr;
mod tables;
mod trees;
mod vocab;

pub use fsm::{MetadataConstraint, State};
pub use genres::read_genres_vocab;
pub use tables::{MetadataTables, TreeField};
pub use trees::PrefixTree;

#[cfg(test)]
mod tests;

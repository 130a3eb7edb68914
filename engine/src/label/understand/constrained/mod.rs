//! The constrained decoding of the metadata block: upstream's
//! MetadataConstrainedLogitsProcessor in the phases `phase` names (understand mode,
//! text2music's metadata and its audio codes), its per-LM tables
//! (`tables`, with the value trees, the genres trie and the tokenizer's view of the
//! vocabulary) and its per-song state machine (`fsm`).

mod fsm;
mod genres;
mod phase;
mod pystr;
mod tables;
mod trees;
mod vocab;

pub use fsm::{MetadataConstraint, State};
pub use genres::read_genres_vocab;
pub use phase::{GivenText, GivenValues, Phase};
pub use tables::{MetadataTables, TreeField};
pub use trees::PrefixTree;

#[cfg(test)]
mod tests;

//! ACE-Step's 5 Hz LM in its "understand" mode: a song's 5 Hz audio codes in, its
//! caption, genres, language, lyrics (and the LM's guesses at tempo, key and meter) out.
//! The song's codes (`codes`), the prompt (`prompt`), the constrained decoding of the metadata block
//! (`constrained`), sampling (`sample`), the decoding loop (`decode`) and the reading
//! of the LM's text (`parse`); `steps` is the LM as the loop sees it, `guided` its classifier-free
//! guidance; `labeller` puts them together for a batch of songs.

pub mod codes;
pub mod constrained;
pub mod decode;
pub mod guided;
pub mod labeller;
pub mod parse;
pub mod prompt;
pub mod sample;
pub mod steps;
pub mod tiny;

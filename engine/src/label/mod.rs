//! What a song is trained with, beyond its audio: tempo, key and meter read from the
//! signal (`analysis`).

pub mod analysis;

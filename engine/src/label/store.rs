//! The labels Ostinato keeps per song, keyed by the file's content (BLAKE3 of its
//! bytes): a moved or renamed song keeps its labels; an edited one keeps those saved
//! for its earlier version, flagged as such. One JSON file per content in the store's
//! folder (in the platform data folder, never the songs' folder), written atomically;
//! an index remembers each path's length, modification time and hash, so a folder is
//! hashed once, and which content a path's labels were saved for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::atomic::write_atomically;
use crate::data::cache::file_hash;
use crate::data::regular::read_regular;
use crate::data::Labels;
use crate::{Error, Result};

const FORMAT: &str = "ostinato-labels-v1";
const INDEX: &str = "index.json";

/// What the store keeps for one song.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Saved {
    /// Values the user gave: they win over the song's sidecars.
    pub edited: Labels,
    /// Readings of the audio the user accepted: used where the sidecars say nothing.
    pub accepted: Labels,
    /// What ACE-Step's 5 Hz LM wrote of the audio: its caption, lyrics, language and
    /// genre are used where the sidecars say nothing; its tempo, key and meter (which
    /// upstream warns it may invent) are kept to be shown and taken only when picked.
    pub understood: Labels,
}

impl Saved {
    pub fn is_empty(&self) -> bool {
        self.edited.is_empty() && self.accepted.is_empty() && self.understood.is_empty()
    }
}

/// A song as the store knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// BLAKE3 of the file's bytes now.
    pub hash: String,
    pub saved: Saved,
    /// The labels were saved for an earlier version of the file (it was edited since):
    /// they still apply until the user saves new ones.
    pub stale: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    format: String,
    /// Where the song was when its labels were last saved (for people reading the file).
    file: String,
    #[serde(flatten)]
    saved: Saved,
}

/// What the index knows of one path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Seen {
    len: u64,
    modified_ns: u64,
    hash: String,
    /// The content the path's labels were saved for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labelled: Option<String>,
}

#[derive(Debug)]
pub struct LabelStore {
    dir: PathBuf,
}

impl LabelStore {
    /// A store in `dir`, created when labels are first saved.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `<platform data folder>/labels`, e.g. ~/.local/share/ostinato/labels, beside the runs.
    pub fn open_default() -> Self {
        Self::new(crate::load::places::data_dir("labels"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether any labels were ever saved here (the folder is made by the first save).
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// Each song's hash and saved labels, in order; a file that cannot be read gets
    /// why. The index is read once and written once, in a store that exists (it only
    /// saves hashing again, so a failure to write it is no error).
    pub fn find_all(&self, paths: &[PathBuf]) -> Vec<std::result::Result<Found, String>> {
        let mut index = self.read_index();
        let before = index.clone();
        let found = paths.iter().map(|p| self.find_in(&mut index, p)).collect();
        if index != before && self.exists() {
            let _ = self.write_index(&index);
        }
        found
    }

    /// One song's hash and saved labels (see [`LabelStore::find_all`]).
    pub fn find(&self, path: &Path) -> std::result::Result<Found, String> {
        self.find_all(&[path.to_path_buf()]).remove(0)
    }

    fn find_in(&self, index: &mut BTreeMap<String, Seen>, path: &Path) -> std::result::Result<Found, String> {
        let (len, modified_ns) = stamp(path).map_err(|e| format!("cannot read: {e}"))?;
        let key = path.to_string_lossy().into_owned();
        let known = index.get(&key).filter(|s| s.len == len && s.modified_ns == modified_ns);
        let hash = match known {
            Some(seen) => seen.hash.clone(),
            None => file_hash(path).map_err(|e| format!("cannot read: {e}"))?,
        };
        let current = self.read_entry(&hash);
        // The content whose labels this path has: now its own, when it has some.
        let earlier = index.get(&key).and_then(|s| s.labelled.clone());
        let labelled = if current.is_some() { Some(hash.clone()) } else { earlier.clone() };
        index.insert(key, Seen { len, modified_ns, hash: hash.clone(), labelled });
        if let Some(saved) = current {
            return Ok(Found { hash, saved, stale: false });
        }
        let earlier = earlier.filter(|h| *h != hash).and_then(|h| self.read_entry(&h));
        Ok(match earlier {
            Some(saved) => Found { hash, saved, stale: true },
            None => Found { hash, saved: Saved::default(), stale: false },
        })
    }

    /// Keeps `saved` as the labels of the song at `path` whose content is `hash`
    /// (from [`LabelStore::find`]); an empty `saved` forgets them.
    pub fn save(&self, path: &Path, hash: &str, saved: &Saved) -> Result<()> {
        let entry = self.entry_path(hash)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        if saved.is_empty() {
            match std::fs::remove_file(&entry) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(&entry, e)),
                _ => {}
            }
        } else {
            let record = Entry { format: FORMAT.into(), file: path.to_string_lossy().into(), saved: saved.clone() };
            let json = serde_json::to_vec_pretty(&record).expect("labels serialise");
            write_atomically(&entry, &json)?;
        }
        let mut index = self.read_index();
        if let Ok((len, modified_ns)) = stamp(path) {
            let labelled = Some(hash.to_string());
            let key = path.to_string_lossy().into_owned();
            index.insert(key, Seen { len, modified_ns, hash: hash.to_string(), labelled });
        }
        self.write_index(&index)
    }

    fn entry_path(&self, hash: &str) -> Result<PathBuf> {
        match hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            true => Ok(self.dir.join(format!("{hash}.json"))),
            false => Err(Error::BadRequest(format!("`{hash}` is not a content hash"))),
        }
    }

    /// The saved labels for `hash`; a missing entry is none, and so is one that is
    /// unreadable or not ours (it is replaced when labels are next saved).
    fn read_entry(&self, hash: &str) -> Option<Saved> {
        let bytes = read_regular(&self.entry_path(hash).ok()?).ok()?;
        let entry: Entry = serde_json::from_slice(&bytes).ok()?;
        let valid =
            entry.format == FORMAT && entry.saved.edited.check().is_ok() && entry.saved.accepted.check().is_ok();
        valid.then_some(entry.saved)
    }

    fn read_index(&self) -> BTreeMap<String, Seen> {
        read_regular(&self.dir.join(INDEX)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn write_index(&self, index: &BTreeMap<String, Seen>) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let json = serde_json::to_vec(index).expect("index serialises");
        write_atomically(&self.dir.join(INDEX), &json)
    }
}

/// A file's length and modification time: what tells that it changed.
fn stamp(path: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(path)?;
    let modified = meta.modified()?.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    Ok((meta.len(), modified))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Field;

    fn edited(caption: &str) -> Saved {
        let mut saved = Saved::default();
        saved.edited.set(Field::Caption, caption).unwrap();
        saved
    }

    #[test]
    fn labels_follow_the_content_and_an_edited_file_is_flagged() {
        let songs = tempfile::tempdir().unwrap();
        let store = LabelStore::new(tempfile::tempdir().unwrap().path().join("labels"));
        let song = songs.path().join("a.wav");
        std::fs::write(&song, b"first version").unwrap();
        let found = store.find(&song).unwrap();
        assert_eq!((found.saved.clone(), found.stale), (Saved::default(), false));
        store.save(&song, &found.hash, &edited("warm tape hiss")).unwrap();

        // Renamed and moved: same content, same labels.
        let moved = songs.path().join("sub");
        std::fs::create_dir(&moved).unwrap();
        let renamed = moved.join("b.wav");
        std::fs::rename(&song, &renamed).unwrap();
        let found = store.find(&renamed).unwrap();
        assert_eq!((found.saved.edited.caption.as_deref(), found.stale), (Some("warm tape hiss"), false));

        // Edited in place: the earlier labels, flagged.
        std::fs::write(&renamed, b"second, longer version").unwrap();
        let edited_file = store.find(&renamed).unwrap();
        assert_ne!(edited_file.hash, found.hash);
        assert_eq!((edited_file.saved.edited.caption.as_deref(), edited_file.stale), (Some("warm tape hiss"), true));
        // Saved again for the new content: no longer flagged.
        store.save(&renamed, &edited_file.hash, &edited_file.saved).unwrap();
        assert!(!store.find(&renamed).unwrap().stale);
        // The songs' folder holds only the songs.
        let names: Vec<_> = std::fs::read_dir(&moved).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["b.wav"]);
    }

    #[test]
    fn a_broken_entry_or_index_is_no_labels_and_unreadable_songs_say_why() {
        let songs = tempfile::tempdir().unwrap();
        let store = LabelStore::new(tempfile::tempdir().unwrap().path().to_path_buf());
        let song = songs.path().join("a.wav");
        std::fs::write(&song, b"audio").unwrap();
        let hash = store.find(&song).unwrap().hash;
        store.save(&song, &hash, &edited("x")).unwrap();
        std::fs::write(store.dir().join(format!("{hash}.json")), b"{half").unwrap();
        std::fs::write(store.dir().join(INDEX), b"[1,").unwrap();
        assert_eq!(store.find(&song).unwrap().saved, Saved::default());
        let missing = store.find(&songs.path().join("gone.wav")).unwrap_err();
        assert!(missing.starts_with("cannot read"), "{missing}");
        assert!(store.save(&song, "../../etc", &edited("x")).is_err());
    }
}

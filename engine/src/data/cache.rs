//! The content-addressed latent cache: one safetensors file per (file bytes, encoder,
//! conditioner, settings, sidecar metadata). The key never involves the file's path,
//! so a moved or renamed song hits and an edited one misses. Entries hold
//! ACE-Step's preprocessed-sample keys plus the song's metadata.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::TrainingSample;
use crate::codec::SongMeta;
use crate::error::{Error, Result};

const KEYS: [&str; 5] =
    ["target_latents", "attention_mask", "encoder_hidden_states", "encoder_attention_mask", "context_latents"];
const META_KEY: &str = "ostinato.song_meta";
const FORMAT: &str = "ostinato-latent-cache-v1";

#[derive(Debug, Clone)]
pub struct LatentCache {
    dir: PathBuf,
}

/// BLAKE3 of a file's bytes, hex.
pub fn file_hash(path: &Path) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(super::regular::open_regular(path)?)?;
    Ok(h.finalize().to_hex().to_string())
}

/// A cache entry's name: a BLAKE3 hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryKey(blake3::Hash);

/// The entry key for the given parts (file hash, ids, settings), unambiguous
/// because each part is length-prefixed.
pub fn entry_key(parts: &[&str]) -> EntryKey {
    let mut h = blake3::Hasher::new();
    h.update(FORMAT.as_bytes());
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes()).update(p.as_bytes());
    }
    EntryKey(h.finalize())
}

impl LatentCache {
    /// A cache in `dir` (created when missing).
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(Self { dir })
    }

    /// `<platform cache dir>/latents`, e.g. ~/.cache/ostinato/latents on Linux.
    pub fn default_dir() -> Option<PathBuf> {
        directories::ProjectDirs::from("", "", "Ostinato").map(|d| d.cache_dir().join("latents"))
    }

    pub fn open_default() -> Result<Self> {
        let dir = Self::default_dir().ok_or_else(|| Error::Cache {
            path: PathBuf::new(),
            reason: "no platform cache folder (is $HOME set?)".into(),
        })?;
        Self::new(dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entries fan out over 256 subfolders by their first byte.
    fn path(&self, key: &EntryKey) -> PathBuf {
        let hex = key.0.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.safetensors"))
    }

    /// The entry for `key`, or None. A missing, partial or foreign file is a miss
    /// (the next store replaces it). `source` is set to the caller's path.
    pub fn load(&self, key: &EntryKey, source: &Path) -> Option<(TrainingSample, SongMeta)> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).ok()?;
        let meta = serde_json::from_str(header.metadata().as_ref()?.get(META_KEY)?).ok()?;
        let mut t = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).ok()?;
        let mut take = |k: &str| t.remove(k);
        let sample = TrainingSample {
            source: source.to_path_buf(),
            target_latents: take(KEYS[0])?,
            attention_mask: take(KEYS[1])?,
            encoder_hidden_states: take(KEYS[2])?,
            encoder_attention_mask: take(KEYS[3])?,
            context_latents: take(KEYS[4])?,
        };
        Some((sample, meta))
    }

    /// Stores an entry: written under a temporary name, then renamed, so a reader
    /// never sees half a file.
    pub fn store(&self, key: &EntryKey, sample: &TrainingSample, meta: &SongMeta) -> Result<()> {
        let path = self.path(key);
        let err = |reason: String| Error::Cache { path: path.clone(), reason };
        let tensors: Vec<(&str, &Tensor)> = KEYS
            .iter()
            .copied()
            .zip([
                &sample.target_latents,
                &sample.attention_mask,
                &sample.encoder_hidden_states,
                &sample.encoder_attention_mask,
                &sample.context_latents,
            ])
            .collect();
        let info =
            HashMap::from([(META_KEY.to_string(), serde_json::to_string(meta).map_err(|e| err(e.to_string()))?)]);
        let bytes = safetensors::serialize(tensors, Some(info)).map_err(|e| err(e.to_string()))?;

        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(&path, e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn sample() -> TrainingSample {
        let t = |shape: &[usize]| Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap();
        TrainingSample {
            source: "a.wav".into(),
            target_latents: t(&[7, 64]),
            attention_mask: Tensor::ones(7, DType::F32, &Device::Cpu).unwrap(),
            encoder_hidden_states: t(&[5, 16]),
            encoder_attention_mask: Tensor::ones(5, DType::F32, &Device::Cpu).unwrap(),
            context_latents: t(&[7, 128]),
        }
    }

    #[test]
    fn store_then_load_round_trips_with_ace_step_keys() {
        let dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(dir.path().join("c")).unwrap();
        let key = entry_key(&["hash", "enc", "cond"]);
        assert!(cache.load(&key, Path::new("x")).is_none());
        let s = sample();
        let meta = SongMeta { caption: "c".into(), duration_seconds: 3.5, ..SongMeta::default() };
        cache.store(&key, &s, &meta).unwrap();
        let (back, m) = cache.load(&key, Path::new("moved.wav")).unwrap();
        assert_eq!(m, meta);
        assert_eq!(back.source, PathBuf::from("moved.wav"));
        let same = |a: &Tensor, b: &Tensor| {
            a.dims() == b.dims()
                && (a - b).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() == 0.0
        };
        assert!(same(&back.target_latents, &s.target_latents));
        assert!(same(&back.encoder_hidden_states, &s.encoder_hidden_states));
        assert!(same(&back.context_latents, &s.context_latents));

        // The file holds exactly ACE-Step's keys.
        let bytes = std::fs::read(cache.path(&key)).unwrap();
        let mut names: Vec<String> =
            safetensors::SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(String::from).collect();
        names.sort();
        let mut want = KEYS.map(String::from).to_vec();
        want.sort();
        assert_eq!(names, want);
    }

    #[test]
    fn corrupt_entry_is_a_miss_and_gets_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(dir.path()).unwrap();
        let key = entry_key(&["k"]);
        std::fs::create_dir_all(cache.path(&key).parent().unwrap()).unwrap();
        std::fs::write(cache.path(&key), b"garbage").unwrap();
        assert!(cache.load(&key, Path::new("x")).is_none());
        cache.store(&key, &sample(), &SongMeta::default()).unwrap();
        assert!(cache.load(&key, Path::new("x")).is_some());
    }

    #[test]
    fn keys_depend_on_every_part() {
        assert_ne!(entry_key(&["ab", "c"]), entry_key(&["a", "bc"]));
        assert_eq!(entry_key(&["a", "b"]), entry_key(&["a", "b"]));
        assert!(LatentCache::default_dir().is_some_and(|d| d.ends_with("latents")));
    }
}

//! The latent cache's part of preparation: a song's key, a hit (no decoding at all), a
//! miss encoded and stored.

use std::path::Path;

use candle_core::Tensor;

use super::Preparer;
use crate::cancel::Cancel;
use crate::codec::{Conditioner, LatentEncoder, SongMeta};
use crate::data::cache::{entry_key, file_hash, EntryKey, LatentCache};
use crate::data::dataset::{encode_song, DatasetItem, Song};
use crate::data::inspect::SongFile;
use crate::data::{DataEvent, DataSpec, IssueKind, Stage, TrainingSample};
use crate::error::{Error, Result};

/// The latents `[T, C]` training uses for `song` under `spec`, when `cache` holds them
/// (None: not cached with these settings): what the model hears of the song.
pub fn cached_latents(
    spec: &DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    cache: &LatentCache,
    song: SongFile,
) -> Result<Option<Tensor>> {
    let (cancel, mut report) = (Cancel::never(), |_: DataEvent| {});
    let prep = Preparer::new(spec, encoder, conditioner, Some(cache), &cancel, &mut report);
    let meta = prep.training_meta(song.meta);
    let key =
        prep.cache_key(&song.path, &meta).map_err(|reason| Error::BadAudio { path: song.path.clone(), reason })?;
    Ok(key.and_then(|key| cache.load(&key, &song.path)).map(|(sample, _)| sample.target_latents))
}

impl Preparer<'_> {
    /// The song's cache key (None without a cache), or why its file cannot be read.
    pub(super) fn cache_key(&self, path: &Path, meta: &SongMeta) -> std::result::Result<Option<EntryKey>, String> {
        if self.cache.is_none() {
            return Ok(None);
        }
        let hash = file_hash(path).map_err(|e| format!("cannot read: {e}"))?;
        let meta_json = serde_json::to_string(meta).unwrap_or_default();
        Ok(Some(entry_key(&[&hash, &self.encoder.id(), &self.conditioner.id(), &self.settings, &meta_json])))
    }

    /// The song from the cache, when it is there: no decoding at all.
    pub(super) fn cache_hit(&mut self, path: &Path, key: Option<&EntryKey>) -> Option<DatasetItem> {
        let (sample, meta) = self.cache?.load(key?, path)?;
        self.data.cache_hits += 1;
        Some(DatasetItem {
            source: path.to_path_buf(),
            seconds_used: self.spec.cut(None).seconds_of(meta.duration_seconds),
            meta,
            cached: Some(sample),
        })
    }

    /// Encodes the song now and stores it; a bad file is a reason, a full disk only
    /// a warning (it costs speed, not the run).
    pub(super) fn encode_and_store(
        &mut self,
        cache: &LatentCache,
        key: &EntryKey,
        song: &Song,
    ) -> Result<std::result::Result<TrainingSample, String>> {
        let (done, total) = self.position;
        let report = &mut self.report;
        let mut tile = |encoded: f64, seconds: f64| {
            report(DataEvent::Progress {
                stage: Stage::Encoding,
                done,
                total,
                file: Some(song.source.to_path_buf()),
                seconds: Some((encoded, seconds)),
            })
        };
        let sample = match encode_song(song, self.encoder, self.conditioner, self.cancel, &mut tile) {
            Ok(s) => s,
            Err(Error::BadAudio { reason, .. }) => return Ok(Err(reason)),
            Err(e) => return Err(e),
        };
        self.data.cache_misses += 1;
        if let Err(e) = cache.store(key, &sample, song.meta) {
            let reason = format!("cache not written: {e}; training goes on without it");
            self.issue(cache.dir().to_path_buf(), reason, IssueKind::Warning);
        }
        Ok(Ok(sample))
    }
}

#[cfg(test)]
mod tests {
    use crate::codec::LatentEncoder;
    use crate::data::testutil::{good_wav, models, prepare, use_of, write_file};
    use crate::data::wav::{wav_bytes, SampleFormat};
    use crate::data::{DataSpec, LatentCache, PreparedDataset};
    use rand::SeedableRng;

    #[test]
    fn cache_hits_moved_and_renamed_files_and_misses_edited_ones() {
        let src = tempfile::tempdir().unwrap();
        let d = src.path();
        good_wav(d, "a.wav", 1.5, 440.0);
        good_wav(d, "b.wav", 1.5, 660.0);
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(cache_dir.path()).unwrap();
        let spec = DataSpec::new(d);
        let counts = |data: &PreparedDataset| (data.cache_hits, data.cache_misses);

        let first = prepare(&spec, Some(&cache)).0.unwrap();
        assert_eq!(counts(&first), (0, 2));
        let again = prepare(&spec, Some(&cache)).0.unwrap();
        assert_eq!(counts(&again), (2, 0));
        let latents = |data: &PreparedDataset, i: usize| {
            data.items[i].cached.as_ref().unwrap().target_latents.to_vec2::<f32>().unwrap()
        };
        assert_eq!(latents(&first, 0), latents(&again, 0));

        // Rename one, move the other into a subfolder.
        std::fs::rename(d.join("a.wav"), d.join("renamed.wav")).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::rename(d.join("b.wav"), d.join("sub/b.wav")).unwrap();
        let moved = prepare(&spec, Some(&cache)).0.unwrap();
        assert_eq!(counts(&moved), (2, 0));
        assert!(moved.items.iter().any(|i| i.source == d.join("sub/b.wav")));
        assert!(moved.items.iter().any(|i| i.source == d.join("renamed.wav")));

        // Edit one (same length, different sound): miss.
        good_wav(d, "renamed.wav", 1.5, 550.0);
        let edited = prepare(&spec, Some(&cache)).0.unwrap();
        assert_eq!(counts(&edited), (1, 1));

        // A new caption or other settings: miss too.
        std::fs::write(d.join("renamed.caption.txt"), "new caption").unwrap();
        assert_eq!(counts(&prepare(&spec, Some(&cache)).0.unwrap()), (1, 1));
        let shorter = DataSpec { max_duration_seconds: 1.0, ..spec.clone() };
        assert_eq!(counts(&prepare(&shorter, Some(&cache)).0.unwrap()), (0, 2));
        // A crop is a window of the whole song the cache keeps: a hit.
        let cropped = DataSpec { crop_seconds: Some(1.0), ..spec.clone() };
        assert_eq!(counts(&prepare(&cropped, Some(&cache)).0.unwrap()), (2, 0));

        // A label given in Ostinato: over the sidecar, in the prompt, and a miss.
        let mut labelled = spec.clone();
        let mut given = crate::data::Labels::default();
        given.set(crate::data::Field::Caption, "labelled in the window").unwrap();
        given.set(crate::data::Field::Bpm, "93").unwrap();
        labelled.labels.insert("renamed.wav".into(), given);
        let (data, events) = prepare(&labelled, Some(&cache));
        assert_eq!(counts(data.as_ref().unwrap()), (1, 1));
        let item = data.unwrap().items.into_iter().find(|i| i.source == d.join("renamed.wav")).unwrap();
        assert_eq!((item.meta.caption.as_str(), item.meta.bpm), ("labelled in the window", Some(93)));
        let prompt = &use_of(&events, "renamed.wav").unwrap().prompt;
        assert!(prompt.contains("# Caption\nlabelled in the window\n") && prompt.contains("- bpm: 93\n"), "{prompt}");
        assert_eq!(counts(&prepare(&labelled, Some(&cache)).0.unwrap()), (2, 0));
    }

    #[test]
    fn crops_are_random_windows_drawn_from_the_seed_with_and_without_the_cache() {
        let src = tempfile::tempdir().unwrap();
        // A rising tone, so every crop position sounds different.
        let n = 44_100 * 3;
        let chirp: Vec<f32> = (0..n)
            .map(|i| {
                let t = i as f64 / 44_100.0;
                (0.5 * (2.0 * std::f64::consts::PI * (200.0 * t + 300.0 * t * t)).sin()) as f32
            })
            .collect();
        write_file(src.path(), "a.wav", &wav_bytes(44_100, SampleFormat::Int(16), &[chirp.clone(), chirp]));
        let spec = DataSpec { crop_seconds: Some(1.0), ..DataSpec::new(src.path()) };
        let (enc, cond) = models();
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(cache_dir.path()).unwrap();
        for cache in [None, Some(&cache)] {
            let data = prepare(&spec, cache).0.unwrap();
            let draw = |seed| {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                data.sample(0, &enc, &cond, &mut rng).unwrap().target_latents.to_vec2::<f32>().unwrap()
            };
            assert_eq!(draw(1).len(), 25);
            assert_eq!(draw(1), draw(1));
            assert_ne!(draw(1), draw(2), "cache {:?}", cache.is_some());
        }

        // The cache keeps the whole song (the entry a run without crops uses too); a
        // window is that song's latents from the offset on.
        let cached = prepare(&spec, Some(&cache)).0.unwrap();
        assert_eq!(cached.cache_hits, 1);
        let whole = cached.items[0].cached.as_ref().unwrap();
        assert_eq!(whole.target_latents.dim(0).unwrap(), 75);
        let uncropped = prepare(&DataSpec::new(src.path()), Some(&cache)).0.unwrap();
        assert_eq!((uncropped.cache_hits, uncropped.cache_misses), (1, 0));
        let frames = whole.target_latents.to_vec2::<f32>().unwrap();
        let last = cached.window(whole, enc.frames_per_second(), Some(1.0)).unwrap();
        assert_eq!(last.target_latents.to_vec2::<f32>().unwrap(), frames[50..]);
        assert_eq!(last.context_latents.dim(0).unwrap(), 25);
        let centre = cached.window(whole, enc.frames_per_second(), None).unwrap();
        assert_eq!(centre.target_latents.to_vec2::<f32>().unwrap(), frames[25..50]);
    }
}

//! Dataset assembly: inspect the folder (scan, sidecars), decode and check every song
//! as `inspect` does, and encode it (or find it in the cache). Bad files are reported and skipped; no
//! usable file at all is an error before training starts. Every used song is
//! reported with the seconds training sees of it, and every oddity that does not
//! keep it out (an ignored sidecar value, a file shorter than its header says) as a
//! warning.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::{Rng, RngCore};

use super::audio::{self, Cut};
use super::cache::{entry_key, file_hash, EntryKey, LatentCache};
use super::inspect::{decode_checked, inspect_folder, SongFile};
use super::scan::AUDIO_EXTENSIONS;
use super::sidecar::apply_trigger;
use super::{DataEvent, DataSpec, FileUse, Issue, IssueKind, Stage, TrainingSample};
use crate::cancel::Cancel;
use crate::codec::condition::text_prompt;
use crate::codec::{Conditioner, LatentEncoder, SongMeta, StereoAudio};
use crate::error::{Error, Result};

/// One usable song.
#[derive(Debug, Clone)]
pub struct DatasetItem {
    pub source: PathBuf,
    pub meta: SongMeta,
    /// Seconds of it training sees each epoch (after the cut or crop).
    pub seconds_used: f64,
    /// Present when the cache is on: the sample every epoch reuses.
    pub cached: Option<TrainingSample>,
}

#[derive(Debug)]
pub struct PreparedDataset {
    pub spec: DataSpec,
    pub items: Vec<DatasetItem>,
    /// Every skipped file and every warning; also sent as `DataEvent::Issue`.
    pub issues: Vec<Issue>,
    pub cache_hits: usize,
    pub cache_misses: usize,
}

impl PreparedDataset {
    /// No songs yet.
    pub fn empty(spec: &DataSpec) -> Self {
        Self { spec: spec.clone(), items: Vec::new(), issues: Vec::new(), cache_hits: 0, cache_misses: 0 }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// A dataset of samples preprocessed earlier (ours or ACE-Step's), used as they are.
    pub fn preprocessed(spec: &DataSpec, samples: Vec<TrainingSample>, frames_per_second: f64) -> Result<Self> {
        let items = samples
            .into_iter()
            .map(|s| {
                let seconds = s.target_latents.dim(0)? as f64 / frames_per_second;
                Ok(DatasetItem {
                    source: s.source.clone(),
                    meta: SongMeta { duration_seconds: seconds, ..SongMeta::default() },
                    seconds_used: seconds,
                    cached: Some(s),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { cache_hits: items.len(), items, ..Self::empty(spec) })
    }

    /// Files left out (the other issues are warnings about used songs).
    pub fn skipped(&self) -> usize {
        self.issues.iter().filter(|i| i.kind == IssueKind::Skipped).count()
    }

    /// Seconds of audio training sees each epoch (after cuts and crops).
    pub fn seconds_used(&self) -> f64 {
        self.items.iter().map(|i| i.seconds_used).sum()
    }

    /// Seconds of audio the used files hold (whole files, before cuts).
    pub fn seconds_in_files(&self) -> f64 {
        self.items.iter().map(|i| i.meta.duration_seconds).sum()
    }

    /// The training sample for item `index`, with a crop's offset drawn from `rng`: a
    /// window of the cached song, or (cache off) a fresh encoding of the crop.
    pub fn sample(
        &self,
        index: usize,
        encoder: &dyn LatentEncoder,
        conditioner: &dyn Conditioner,
        rng: &mut dyn RngCore,
    ) -> Result<TrainingSample> {
        let item = &self.items[index];
        match &item.cached {
            Some(s) => self.window(s, encoder.frames_per_second(), Some(rng.random::<f64>())),
            None => encode_item(item, &self.spec, encoder, conditioner, rng),
        }
    }

    /// The crop of a cached sample at `offset` (a fraction of the free room; None: the
    /// centre), as `Cut::Crop` places it in the audio; the whole sample without crops.
    pub fn window(
        &self,
        sample: &TrainingSample,
        frames_per_second: f64,
        offset: Option<f64>,
    ) -> Result<TrainingSample> {
        let frames = sample.target_latents.dim(0)?;
        let Some(seconds) = self.spec.crop_seconds else {
            return Ok(sample.clone());
        };
        let len = ((seconds * frames_per_second).round() as usize).clamp(1, frames);
        let room = frames - len;
        let start = (room as f64 * offset.unwrap_or(0.5).clamp(0.0, 1.0)).round() as usize;
        Ok(sample.window(start, len)?)
    }
}

/// Decodes and encodes one song from its file, drawing the crop offset (if any) from
/// `rng`: the run loop calls this every epoch when the cache is off.
pub fn encode_item(
    item: &DatasetItem,
    spec: &DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    rng: &mut dyn RngCore,
) -> Result<TrainingSample> {
    let bad = |reason| Error::BadAudio { path: item.source.clone(), reason };
    let decoded = audio::decode_file(&item.source, spec.cut(Some(rng.random::<f64>()))).map_err(bad)?;
    let song = Song { source: &item.source, audio: &decoded.audio, meta: &item.meta };
    encode_song(&song, encoder, conditioner, &Cancel::never(), &mut |_, _| {})
}

/// How `cut` shortens a song of `seconds`, in words; None when it keeps it whole.
pub fn cut_note(cut: Cut, seconds: f64) -> Option<String> {
    match cut {
        Cut::Head { max_seconds } if seconds > max_seconds => {
            Some(format!("cut to {max_seconds} s (the longest a song is trained on)"))
        }
        Cut::Crop { seconds: crop, .. } if seconds > crop => Some(format!("a random {crop} s crop each epoch")),
        _ => None,
    }
}

/// The part of a song training uses, decoded, and what its sidecars say.
struct Song<'a> {
    source: &'a Path,
    audio: &'a StereoAudio,
    meta: &'a SongMeta,
}

/// Resample (the cut was decoded at the source rate: less to resample), encode, condition.
fn encode_song(
    song: &Song,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    cancel: &Cancel,
    progress: &mut dyn FnMut(f64, f64),
) -> Result<TrainingSample> {
    let piece = audio::resample(song.audio, encoder.sample_rate())
        .map_err(|reason| Error::BadAudio { path: song.source.to_path_buf(), reason })?;
    let target_latents = encoder.encode_cancellable(&piece, cancel, progress)?;
    let frames = target_latents.dim(0)?;
    let c = conditioner.condition(song.meta, frames)?;
    Ok(TrainingSample {
        source: song.source.to_path_buf(),
        target_latents,
        attention_mask: Tensor::ones(frames, DType::F32, &Device::Cpu)?,
        encoder_hidden_states: c.encoder_hidden_states,
        encoder_attention_mask: c.encoder_attention_mask,
        context_latents: c.context_latents,
    })
}

/// Prepares the dataset in `spec.folder`. With a cache, every song is encoded once
/// (or loaded) now; without, songs are only decoded and checked now and encoded per
/// epoch through `PreparedDataset::sample`. Encoder and conditioner failures are
/// errors; a bad file is an issue. Once `cancel` is set it returns
/// `Error::Cancelled` before the next file, or the encoder's next chunk.
pub fn prepare_dataset(
    spec: &DataSpec,
    encoder: &dyn LatentEncoder,
    conditioner: &dyn Conditioner,
    cache: Option<&LatentCache>,
    cancel: &Cancel,
    report: &mut dyn FnMut(DataEvent),
) -> Result<PreparedDataset> {
    spec.validate()?;
    let folder = inspect_folder(&spec.folder, &spec.labels)?;
    let total = folder.songs.len();
    let mut prep = Preparer::new(spec, encoder, conditioner, cache, cancel, report);
    for (file, reason) in folder.skipped {
        prep.issue(file, reason, IssueKind::Skipped);
    }
    prep.progress(Stage::Scanning, total, total, None);
    for (done, song) in folder.songs.into_iter().enumerate() {
        cancel.check()?;
        prep.progress(Stage::Encoding, done, total, Some(song.path.clone()));
        prep.position = (done, total);
        prep.add(song)?;
    }
    prep.progress(Stage::Encoding, total, total, None);
    prep.finish(total)
}

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

/// The error for a folder where no file could be used, with the first reason.
fn nothing_usable(data: &PreparedDataset, total: usize) -> Error {
    let first = data.issues.iter().find(|i| i.kind == IssueKind::Skipped);
    let detail = match first {
        _ if total == 0 => format!("no audio files found (supported: {})", AUDIO_EXTENSIONS.join(", ")),
        Some(i) => format!("none of {total} audio file(s) could be used (e.g. {}: {})", i.file.display(), i.reason),
        None => format!("none of {total} audio file(s) could be used"),
    };
    Error::NoUsableAudio { folder: data.spec.folder.clone(), detail }
}

/// A song to use, or why the file is skipped; `Err` of the outer `Result` ends
/// preparation (an encoder failure, a cancel).
type Verdict = Result<std::result::Result<DatasetItem, String>>;

/// What `prepare_dataset` keeps while it goes through the files.
struct Preparer<'a> {
    spec: &'a DataSpec,
    encoder: &'a dyn LatentEncoder,
    conditioner: &'a dyn Conditioner,
    cache: Option<&'a LatentCache>,
    cancel: &'a Cancel,
    /// The spec's part of every cache key.
    settings: String,
    data: PreparedDataset,
    /// (files prepared before this one, files): where the per-tile progress sits.
    position: (usize, usize),
    report: &'a mut dyn FnMut(DataEvent),
}

impl<'a> Preparer<'a> {
    fn new(
        spec: &'a DataSpec,
        encoder: &'a dyn LatentEncoder,
        conditioner: &'a dyn Conditioner,
        cache: Option<&'a LatentCache>,
        cancel: &'a Cancel,
        report: &'a mut dyn FnMut(DataEvent),
    ) -> Self {
        Preparer {
            spec,
            encoder,
            conditioner,
            cache,
            cancel,
            // The cache keeps the song's head whatever the crop (crops are windows of it).
            settings: format!("max{}:cropNone:cut-centre", spec.max_duration_seconds),
            data: PreparedDataset::empty(spec),
            position: (0, 0),
            report,
        }
    }

    fn progress(&mut self, stage: Stage, done: usize, total: usize, file: Option<PathBuf>) {
        (self.report)(DataEvent::Progress { stage, done, total, file, seconds: None });
    }

    /// The dataset, or the error of a folder without a usable song among its `total`.
    fn finish(self, total: usize) -> Result<PreparedDataset> {
        match self.data.items.is_empty() {
            true => Err(nothing_usable(&self.data, total)),
            false => Ok(self.data),
        }
    }

    fn issue(&mut self, file: PathBuf, reason: String, kind: IssueKind) {
        let issue = Issue { file, reason, kind };
        (self.report)(DataEvent::Issue(issue.clone()));
        self.data.issues.push(issue);
    }

    /// Prepares one audio file and reports what became of it: its warnings (sidecar
    /// values ignored, a short decode), then either how much of it is used or why
    /// it is skipped.
    fn add(&mut self, song: SongFile) -> Result<()> {
        let SongFile { path, meta, mut warnings, .. } = song;
        let meta = self.training_meta(meta);
        match self.song(&path, meta, &mut warnings)? {
            Ok(item) => {
                for (file, reason) in warnings {
                    self.issue(file, format!("{reason}; the song is used"), IssueKind::Warning);
                }
                self.used(item);
            }
            Err(reason) => {
                for (file, reason) in warnings {
                    self.issue(file, reason, IssueKind::Warning);
                }
                self.issue(path, reason, IssueKind::Skipped);
            }
        }
        Ok(())
    }

    fn used(&mut self, item: DatasetItem) {
        let seconds = item.meta.duration_seconds;
        let cut = self.spec.cut(None);
        (self.report)(DataEvent::Used(FileUse {
            file: item.source.clone(),
            seconds_used: item.seconds_used,
            seconds_in_file: seconds,
            note: cut_note(cut, seconds),
            prompt: text_prompt(&item.meta),
        }));
        self.data.items.push(item);
    }

    /// The song from the cache, or decoded (and, with a cache, encoded and stored).
    fn song(&mut self, path: &Path, mut meta: SongMeta, warnings: &mut Vec<(PathBuf, String)>) -> Verdict {
        let key = match self.cache_key(path, &meta) {
            Ok(key) => key,
            Err(reason) => return Ok(Err(reason)),
        };
        if let Some(item) = self.cache_hit(path, key.as_ref()) {
            return Ok(Ok(item));
        }
        // With the cache the song's head is encoded (crops are windows of it); without,
        // the crop is decoded only to check the file (each epoch encodes its own).
        let cut = if self.cache.is_some() { self.spec.cached_cut() } else { self.spec.cut(None) };
        let decoded = match decode_checked(path, cut) {
            Ok(d) => d,
            Err(reason) => return Ok(Err(reason)),
        };
        warnings.extend(decoded.shortfall().map(|w| (path.to_path_buf(), w)));
        meta.duration_seconds = decoded.seconds_in_file();
        let song = Song { source: path, audio: &decoded.audio, meta: &meta };
        let cached = match (self.cache, key) {
            (Some(cache), Some(key)) => match self.encode_and_store(cache, &key, &song)? {
                Ok(sample) => Some(sample),
                Err(reason) => return Ok(Err(reason)),
            },
            _ => None,
        };
        let seconds_used = self.spec.cut(None).seconds_of(meta.duration_seconds);
        Ok(Ok(DatasetItem { source: path.to_path_buf(), meta, seconds_used, cached }))
    }

    /// A song's metadata as training uses it: the trigger tag added to its caption.
    fn training_meta(&self, mut meta: SongMeta) -> SongMeta {
        meta.caption = apply_trigger(&meta.caption, self.spec.trigger.as_ref());
        meta
    }

    /// The song's cache key (None without a cache), or why its file cannot be read.
    fn cache_key(&self, path: &Path, meta: &SongMeta) -> std::result::Result<Option<EntryKey>, String> {
        if self.cache.is_none() {
            return Ok(None);
        }
        let hash = file_hash(path).map_err(|e| format!("cannot read: {e}"))?;
        let meta_json = serde_json::to_string(meta).unwrap_or_default();
        Ok(Some(entry_key(&[&hash, &self.encoder.id(), &self.conditioner.id(), &self.settings, &meta_json])))
    }

    /// The song from the cache, when it is there: no decoding at all.
    fn cache_hit(&mut self, path: &Path, key: Option<&EntryKey>) -> Option<DatasetItem> {
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
    fn encode_and_store(
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
    use super::*;
    use crate::codec::condition::HashConditioner;
    use crate::codec::encode::MelEncoder;
    use crate::codec::StereoAudio;
    use crate::data::testutil::{aiff_bytes, flac_bytes, mkfifo, noise_bytes, sine, write_file};
    use crate::data::wav::{wav_bytes, SampleFormat};
    use crate::data::{TagMode, TriggerTag};
    use rand::SeedableRng;
    use std::collections::BTreeMap;
    use std::ffi::OsStr;
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::SystemTime;

    fn models() -> (MelEncoder, HashConditioner) {
        let enc = MelEncoder::new();
        let cond = HashConditioner::for_encoder(16, &enc).unwrap();
        (enc, cond.with_max_tokens(32, 16))
    }

    fn stereo_sine(rate: u32, seconds: f64, freq: f64) -> Vec<Vec<f32>> {
        let n = (rate as f64 * seconds) as usize;
        vec![sine(freq, 0.5, rate, n), sine(freq * 1.5, 0.3, rate, n)]
    }

    fn good_wav(dir: &Path, name: impl AsRef<OsStr>, seconds: f64, freq: f64) -> PathBuf {
        write_file(dir, name, &wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, seconds, freq)))
    }

    /// Every file under `dir` with its size and mtime.
    fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime, u32)> {
        let mut out = BTreeMap::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.is_dir() {
                    stack.push(p.clone());
                }
                out.insert(p, (m.len(), m.modified().unwrap(), m.permissions().mode()));
            }
        }
        out
    }

    fn prepare(spec: &DataSpec, cache: Option<&LatentCache>) -> (Result<PreparedDataset>, Vec<DataEvent>) {
        let (enc, cond) = models();
        let mut events = Vec::new();
        let r = prepare_dataset(spec, &enc, &cond, cache, &Cancel::never(), &mut |e| events.push(e));
        (r, events)
    }

    /// The reason of the first issue of `kind` about the file called `name`.
    fn find_issue<'a>(events: &'a [DataEvent], kind: IssueKind, name: &[u8]) -> Option<&'a str> {
        events.iter().find_map(|e| match e {
            DataEvent::Issue(i) if i.kind == kind && i.file.file_name()?.as_bytes() == name => Some(i.reason.as_str()),
            _ => None,
        })
    }

    /// Why the file called `name` was skipped.
    fn issue_for<'a>(events: &'a [DataEvent], name: &[u8]) -> Option<&'a str> {
        find_issue(events, IssueKind::Skipped, name)
    }

    fn warning_for<'a>(events: &'a [DataEvent], name: &[u8]) -> Option<&'a str> {
        find_issue(events, IssueKind::Warning, name)
    }

    /// What the per-file event says of the file called `name`.
    fn use_of<'a>(events: &'a [DataEvent], name: &str) -> Option<&'a FileUse> {
        events.iter().find_map(|e| match e {
            DataEvent::Used(u) if u.file.file_name()? == name => Some(u),
            _ => None,
        })
    }

    /// Root reads files whatever their permission bits say: find out honestly.
    fn permissions_bind(path: &Path) -> bool {
        std::fs::File::open(path).is_err()
    }

    #[test]
    fn bad_files_are_reported_and_good_ones_used() {
        let src = tempfile::tempdir().unwrap();
        let d = src.path();
        // Usable, in every shape the issue lists.
        good_wav(d, "good.wav", 2.0, 440.0);
        write_file(d, "mono_8k.wav", &wav_bytes(8000, SampleFormat::Int(16), &[sine(300.0, 0.5, 8000, 12_000)]));
        let six: Vec<Vec<f32>> = (0..6).map(|c| sine(200.0 + 100.0 * c as f64, 0.4, 192_000, 230_400)).collect();
        write_file(d, "six_192k.wav", &wav_bytes(192_000, SampleFormat::Int(16), &six));
        write_file(d, "int24.wav", &wav_bytes(48_000, SampleFormat::Int(24), &stereo_sine(48_000, 1.5, 500.0)));
        write_file(d, "float64.wav", &wav_bytes(32_000, SampleFormat::Float(64), &stereo_sine(32_000, 1.5, 500.0)));
        write_file(d, "lossless.flac", &flac_bytes(44_100, &stereo_sine(44_100, 1.5, 600.0)));
        write_file(d, "apple.aiff", &aiff_bytes(22_050, &stereo_sine(22_050, 1.5, 700.0)));
        good_wav(d, OsStr::from_bytes(b"caf\xe9 latin1.wav"), 1.5, 800.0);
        // Bad.
        let mut corrupt = wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 1.5, 440.0));
        corrupt[20..36].copy_from_slice(&noise_bytes(16, 7)); // the fmt chunk
        write_file(d, "corrupt.wav", &corrupt);
        let mut corrupt_flac = flac_bytes(44_100, &stereo_sine(44_100, 3.0, 440.0));
        let n = corrupt_flac.len();
        corrupt_flac[n / 4..n * 3 / 4].copy_from_slice(&noise_bytes(n * 3 / 4 - n / 4, 9));
        write_file(d, "corrupt.flac", &corrupt_flac);
        let full = wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 3.0, 440.0));
        write_file(d, "truncated.wav", &full[..full.len() * 2 / 5]);
        write_file(d, "empty.wav", b"");
        write_file(d, "text.wav", b"these are my lyrics, not audio\n");
        write_file(d, "random.mp3", &noise_bytes(64 << 10, 3));
        write_file(
            d,
            "silence.wav",
            &wav_bytes(44_100, SampleFormat::Int(16), &[vec![0.0; 88_200], vec![0.0; 88_200]]),
        );
        write_file(d, "short.wav", &wav_bytes(44_100, SampleFormat::Int(16), &stereo_sine(44_100, 0.3, 440.0)));
        write_file(d, "notes.pdf", b"%PDF-1.4");
        let locked = good_wav(d, "locked.wav", 1.5, 440.0);
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let locked_binds = permissions_bind(&locked);
        if !locked_binds {
            eprintln!("note: running as root, so a mode-000 file is still readable; its assertion is skipped");
        }

        let before = snapshot(d);
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(cache_dir.path()).unwrap();
        let spec = DataSpec::new(d);
        for cache in [None, Some(&cache)] {
            let (data, events) = prepare(&spec, cache);
            let data = data.unwrap();
            let used: Vec<Vec<u8>> =
                data.items.iter().map(|i| i.source.file_name().unwrap().as_bytes().to_vec()).collect();
            let mut want: Vec<&[u8]> = vec![
                b"apple.aiff",
                b"caf\xe9 latin1.wav",
                b"float64.wav",
                b"good.wav",
                b"int24.wav",
                b"lossless.flac",
                b"mono_8k.wav",
                b"six_192k.wav",
                b"truncated.wav",
            ];
            if !locked_binds {
                want.insert(5, b"locked.wav");
            }
            assert_eq!(used, want, "cache {}", cache.is_some());

            for (name, why) in [
                (&b"corrupt.wav"[..], "not a readable audio file"),
                (b"corrupt.flac", "corrupt"),
                (b"empty.wav", "empty file"),
                (b"text.wav", "not a readable audio file"),
                (b"random.mp3", "not a readable audio file"),
                (b"silence.wav", "silent"),
                (b"short.wav", "too short"),
                (b"notes.pdf", "unsupported file type .pdf"),
            ] {
                let reason = issue_for(&events, name)
                    .unwrap_or_else(|| panic!("no issue for {}", String::from_utf8_lossy(name)));
                assert!(reason.contains(why), "{}: {reason}", String::from_utf8_lossy(name));
            }
            if locked_binds {
                assert!(issue_for(&events, b"locked.wav").is_some_and(|r| r.contains("ermission")));
            }
            // Cut short (the header states 3 s): used with what decodes, and said so.
            let warning = warning_for(&events, b"truncated.wav").expect("a warning for truncated.wav");
            assert!(
                warning.contains("truncated") && warning.contains("3.0 s") && warning.contains("the song is used"),
                "{warning}"
            );
            let truncated = use_of(&events, "truncated.wav").unwrap();
            assert!((truncated.seconds_in_file - 1.2).abs() < 0.01, "{truncated:?}");
            assert_eq!(data.issues.len(), events.iter().filter(|e| matches!(e, DataEvent::Issue(_))).count());
            assert!(events.contains(&DataEvent::Progress {
                stage: Stage::Encoding,
                done: 17,
                total: 17,
                file: None,
                seconds: None,
            }));

            let (enc, cond) = models();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            for i in 0..data.len() {
                let s = data.sample(i, &enc, &cond, &mut rng).unwrap();
                let t = s.target_latents.dim(0).unwrap();
                let seconds = data.items[i].meta.duration_seconds;
                assert_eq!(t, (seconds * 25.0).floor() as usize, "{}", s.source.display());
                assert_eq!(s.target_latents.dims(), [t, 64]);
                assert_eq!(s.attention_mask.dims(), [t]);
                assert_eq!(s.context_latents.dims(), [t, 128]);
                assert_eq!(s.encoder_hidden_states.dims(), [16 + 1 + 32, 16]);
                assert_eq!(s.encoder_attention_mask.dims(), [49]);
            }
        }
        assert_eq!(snapshot(d), before, "the source folder changed");
    }

    /// Every file's verdict from `inspect_folder` (the app's scan): None when training
    /// can use it, else why not.
    fn inspected(folder: &Path) -> BTreeMap<PathBuf, Option<String>> {
        let inspection = inspect_folder(folder, &Default::default()).unwrap();
        let spec = DataSpec::new(folder);
        let songs = inspection.songs.iter().map(|s| (s.path.clone(), s.check(&spec).err()));
        songs.chain(inspection.skipped.into_iter().map(|(file, reason)| (file, Some(reason)))).collect()
    }

    /// Every file's verdict from training's preparation (no cache: every song decoded).
    fn prepared(folder: &Path) -> BTreeMap<PathBuf, Option<String>> {
        let (_, events) = prepare(&DataSpec::new(folder), None);
        let verdict = |e: DataEvent| match e {
            DataEvent::Used(u) => Some((u.file, None)),
            DataEvent::Issue(i) if i.kind == IssueKind::Skipped => Some((i.file, Some(i.reason))),
            _ => None,
        };
        events.into_iter().filter_map(verdict).collect()
    }

    #[test]
    fn inspect_folder_gives_the_verdicts_training_reaches() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/demo");
        let verdicts = inspected(&demo);
        assert_eq!(verdicts.len(), 6, "{verdicts:?}");
        assert!(verdicts.values().all(Option::is_none), "{verdicts:?}");
        assert_eq!(verdicts, prepared(&demo));
        assert!(inspect_folder(&demo, &Default::default()).unwrap().songs.iter().all(|s| s.meta.has_caption()));

        let src = tempfile::tempdir().unwrap();
        let good = good_wav(src.path(), "good.wav", 1.5, 440.0);
        let notes = write_file(src.path(), "notes.wav", b"not audio");
        let short = good_wav(src.path(), "short.wav", 0.2, 440.0);
        let readme = write_file(src.path(), "readme.md", b"songs");
        let verdicts = inspected(src.path());
        assert_eq!(verdicts[&good], None);
        assert!(verdicts[&notes].is_some());
        assert!(verdicts[&short].as_deref().is_some_and(|r| r.starts_with("too short")), "{verdicts:?}");
        assert!(verdicts[&readme].is_some());
        assert_eq!(verdicts, prepared(src.path()));
    }

    #[test]
    fn empty_folder_is_a_clear_error() {
        let src = tempfile::tempdir().unwrap();
        let (r, _) = prepare(&DataSpec::new(src.path()), None);
        let e = r.unwrap_err();
        assert!(matches!(e, Error::NoUsableAudio { .. }));
        let msg = e.to_string();
        assert!(msg.contains(&src.path().display().to_string()) && msg.contains("no audio files"), "{msg}");
    }

    #[test]
    fn folder_of_only_bad_files_is_a_clear_error() {
        let src = tempfile::tempdir().unwrap();
        write_file(src.path(), "a.wav", b"not audio");
        write_file(src.path(), "b.mp3", &noise_bytes(4096, 1));
        write_file(src.path(), "cover.png", b"png");
        let (r, events) = prepare(&DataSpec::new(src.path()), None);
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains(&src.path().display().to_string()) && msg.contains("none of 2 audio file(s)"), "{msg}");
        assert_eq!(events.iter().filter(|e| matches!(e, DataEvent::Issue(_))).count(), 3);
    }

    #[test]
    fn nonsense_settings_are_an_error() {
        let src = tempfile::tempdir().unwrap();
        good_wav(src.path(), "a.wav", 2.0, 440.0);
        for spec in [
            DataSpec { max_duration_seconds: 0.0, ..DataSpec::new(src.path()) },
            DataSpec { crop_seconds: Some(0.2), ..DataSpec::new(src.path()) },
            DataSpec { crop_seconds: Some(f64::NAN), ..DataSpec::new(src.path()) },
        ] {
            assert!(matches!(prepare(&spec, None).0, Err(Error::BadDataSpec(_))), "{spec:?}");
        }
    }

    #[test]
    fn missing_folder_is_an_error_naming_it() {
        let (r, _) = prepare(&DataSpec::new("/no/such/songs"), None);
        assert!(r.unwrap_err().to_string().contains("/no/such/songs"));
    }

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

    #[test]
    fn max_duration_and_trigger_tag() {
        let src = tempfile::tempdir().unwrap();
        good_wav(src.path(), "a.wav", 3.0, 440.0);
        std::fs::write(src.path().join("a.caption.txt"), "soft piano").unwrap();
        let spec = DataSpec {
            max_duration_seconds: 1.5,
            trigger: Some(TriggerTag { tag: "mystyle".into(), mode: TagMode::Prepend }),
            ..DataSpec::new(src.path())
        };
        let (data, events) = prepare(&spec, None);
        let data = data.unwrap();
        let item = &data.items[0];
        assert_eq!(item.meta.caption, "mystyle, soft piano");
        assert_eq!(item.seconds_used, 1.5);
        let note = use_of(&events, "a.wav").and_then(|u| u.note.as_deref());
        assert!(note.is_some_and(|n| n.starts_with("cut to 1.5 s")), "{note:?}");
        assert!((item.meta.duration_seconds - 3.0).abs() < 1e-9, "metas keep the file's duration");
        let (enc, cond) = models();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        assert_eq!(data.sample(0, &enc, &cond, &mut rng).unwrap().target_latents.dim(0).unwrap(), 37);
    }

    #[test]
    fn long_songs_are_reported_cut_and_the_summary_counts_seconds_used() {
        let src = tempfile::tempdir().unwrap();
        // 250 s at 8 kHz mono: cheap to write and to decode.
        let long = sine(220.0, 0.5, 8000, 250 * 8000);
        write_file(src.path(), "long.wav", &wav_bytes(8000, SampleFormat::Int(16), &[long]));
        good_wav(src.path(), "short.wav", 2.0, 440.0);

        let (data, events) = prepare(&DataSpec::new(src.path()), None);
        let data = data.unwrap();
        let long = use_of(&events, "long.wav").unwrap();
        assert_eq!((long.seconds_used, long.seconds_in_file), (240.0, 250.0));
        assert!(long.note.as_deref().is_some_and(|n| n.contains("cut to 240 s")), "{long:?}");
        assert_eq!(use_of(&events, "short.wav").unwrap().note, None);
        assert_eq!(data.seconds_used(), 242.0);
        assert_eq!(data.seconds_in_files(), 252.0);

        // With crops, the crop is what is used.
        let cropped = DataSpec { crop_seconds: Some(30.0), ..DataSpec::new(src.path()) };
        let (data, events) = prepare(&cropped, None);
        let long = use_of(&events, "long.wav").unwrap();
        assert_eq!(long.seconds_used, 30.0);
        assert!(long.note.as_deref().is_some_and(|n| n.contains("random 30 s crop")), "{long:?}");
        assert_eq!(data.unwrap().seconds_used(), 32.0);
    }

    #[test]
    fn a_bad_sidecar_value_is_a_warning_and_the_song_is_used() {
        let src = tempfile::tempdir().unwrap();
        good_wav(src.path(), "introzik.wav", 2.0, 440.0);
        std::fs::write(src.path().join("introzik.json"), r#"{"bpm": "fast", "caption": "slow intro"}"#).unwrap();
        let (data, events) = prepare(&DataSpec::new(src.path()), None);
        let data = data.unwrap();
        assert_eq!(
            warning_for(&events, b"introzik.json"),
            Some(r#"field "bpm" = "fast" is not a number: ignored; the song is used"#)
        );
        assert_eq!(issue_for(&events, b"introzik.json"), None);
        assert_eq!((data.len(), data.skipped()), (1, 0));
        let meta = &data.items[0].meta;
        assert_eq!((meta.caption.as_str(), meta.bpm), ("slow intro", None));
    }

    /// A folder holding a named pipe called like a song, and one called like another
    /// song's caption: preparation neither waits on them nor reads them.
    #[test]
    fn named_pipes_are_reported_not_waited_on() {
        let src = tempfile::tempdir().unwrap();
        let d = src.path();
        mkfifo(&d.join("y.wav"));
        good_wav(d, "s.wav", 1.5, 440.0);
        mkfifo(&d.join("s.caption.txt"));
        let (data, events) = prepare(&DataSpec::new(d), None);
        assert_eq!(data.unwrap().len(), 1);
        let skipped = issue_for(&events, b"y.wav").expect("y.wav skipped");
        assert!(skipped.contains("named pipe (FIFO), not a regular file"), "{skipped}");
        let warning = warning_for(&events, b"s.caption.txt").expect("a warning for the caption pipe");
        assert!(warning.contains("named pipe") && warning.contains("the song is used"), "{warning}");
    }

    /// A header stating 0 Hz (symphonia panics on it), 1 Hz, or 1 MHz: that file is
    /// skipped with a reason; the run goes on with the rest.
    #[test]
    fn an_impossible_sample_rate_skips_the_file_not_the_run() {
        let src = tempfile::tempdir().unwrap();
        let d = src.path();
        good_wav(d, "good.wav", 1.5, 440.0);
        let tone = [sine(440.0, 0.5, 8000, 8000)];
        for (name, rate) in [("zero.wav", 0), ("one.wav", 1), ("mega.wav", 1_000_000)] {
            let mut bytes = wav_bytes(8000, SampleFormat::Int(16), &tone);
            bytes[24..28].copy_from_slice(&u32::to_le_bytes(rate));
            write_file(d, name, &bytes);
        }
        let (data, events) = prepare(&DataSpec::new(d), None);
        assert_eq!(data.unwrap().len(), 1);
        // symphonia's WAV reader panics on 0 Hz before any rate is seen: its message.
        let zero = issue_for(&events, b"zero.wav").expect("zero.wav skipped");
        assert_eq!(zero, "the decoder failed on this file (TimeBase cannot have 0 numerator or denominator)");
        for (name, rate) in [(&b"one.wav"[..], "1 Hz"), (b"mega.wav", "1000000 Hz")] {
            let why = issue_for(&events, name).unwrap_or_else(|| panic!("{} used", String::from_utf8_lossy(name)));
            assert!(why.starts_with(&format!("sample rate {rate} is not one audio uses")), "{why}");
        }
    }

    /// Where `a_long_file_fits_in_memory_meant_for_the_cut` puts its folder for the child.
    const LONG_FOLDER: &str = "OSTINATO_TEST_LONG_FOLDER";
    /// Memory the child may allocate beyond what it holds when it starts: far more
    /// than 240 s at 8 kHz (15 MB decoded), far less than an hour (230 MB).
    const CHILD_BUDGET: u64 = 96 << 20;

    /// An hour of audio (8 kHz 8-bit mono: 29 MB on disk, 230 MB decoded) prepared
    /// by a child process whose data memory is capped at `CHILD_BUDGET`: decoding
    /// stops at the 240 s cut, and the song is still named with its hour.
    #[test]
    fn a_long_file_fits_in_memory_meant_for_the_cut() {
        let src = tempfile::tempdir().unwrap();
        let mut file = std::io::BufWriter::new(std::fs::File::create(src.path().join("hour.wav")).unwrap());
        let second = wav_bytes(8000, SampleFormat::Int(8), &[sine(220.0, 0.5, 8000, 8000)]);
        let data_at = second.windows(4).position(|w| w == b"data").unwrap() + 8;
        let data_len = (second.len() - data_at) as u32 * 3600;
        let mut header = second[..data_at].to_vec();
        header[4..8].copy_from_slice(&(data_at as u32 - 8 + data_len).to_le_bytes());
        header[data_at - 4..].copy_from_slice(&data_len.to_le_bytes());
        file.write_all(&header).unwrap();
        for _ in 0..3600 {
            file.write_all(&second[data_at..]).unwrap();
        }
        file.into_inner().unwrap().sync_all().unwrap();

        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "data::dataset::tests::long_file_child", "--ignored", "--nocapture"])
            .env(LONG_FOLDER, src.path())
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.contains("1 passed"), "{:?}\n{said}", out.status);
    }

    /// The child of `a_long_file_fits_in_memory_meant_for_the_cut`.
    #[test]
    #[ignore = "run by a_long_file_fits_in_memory_meant_for_the_cut, under a memory limit"]
    fn long_file_child() {
        let folder = std::env::var_os(LONG_FOLDER).expect("the folder of the parent test");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmData:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        let limit = kib * 1024 + CHILD_BUDGET;
        let rlimit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_DATA, &rlimit) }, 0);
        let (data, events) = prepare(&DataSpec::new(folder), None);
        assert_eq!(data.unwrap().seconds_used(), 240.0);
        let hour = use_of(&events, "hour.wav").unwrap();
        assert_eq!((hour.seconds_used, hour.seconds_in_file), (240.0, 3600.0));
        assert!(hour.note.as_deref().is_some_and(|n| n.contains("cut to 240 s")), "{hour:?}");
    }

    /// The demo encoder, counting its calls.
    struct Counting {
        inner: MelEncoder,
        calls: AtomicUsize,
    }

    impl LatentEncoder for Counting {
        fn id(&self) -> String {
            self.inner.id()
        }
        fn sample_rate(&self) -> u32 {
            self.inner.sample_rate()
        }
        fn frames_per_second(&self) -> f64 {
            self.inner.frames_per_second()
        }
        fn latent_channels(&self) -> usize {
            self.inner.latent_channels()
        }
        fn encode_cancellable(
            &self,
            audio: &StereoAudio,
            cancel: &Cancel,
            progress: &mut dyn FnMut(f64, f64),
        ) -> Result<Tensor> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.encode_cancellable(audio, cancel, progress)
        }
    }

    #[test]
    fn a_cancel_stops_preparation_before_the_next_file_or_chunk() {
        let src = tempfile::tempdir().unwrap();
        for i in 0..5 {
            good_wav(src.path(), format!("{i}.wav"), 2.0, 400.0 + 50.0 * i as f64);
        }
        let enc = Counting { inner: MelEncoder::new(), calls: AtomicUsize::new(0) };
        let cond = HashConditioner::for_encoder(16, &enc.inner).unwrap().with_max_tokens(32, 16);
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(cache_dir.path()).unwrap();
        let cancel = Cancel::default();
        let mut used = 0;
        let r = prepare_dataset(&DataSpec::new(src.path()), &enc, &cond, Some(&cache), &cancel, &mut |e| {
            match e {
                // The stop arrives while the second song is being prepared.
                DataEvent::Progress { done: 1, file: Some(_), .. } => cancel.cancel(),
                DataEvent::Used(_) => used += 1,
                _ => {}
            }
        });
        assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
        assert_eq!(used, 1, "only the first song is prepared");
        // The second song's encoding gave up at its first chunk; no third began.
        assert_eq!(enc.calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn encoding_reports_seconds_of_the_current_file() {
        let src = tempfile::tempdir().unwrap();
        good_wav(src.path(), "a.wav", 1.0, 300.0);
        good_wav(src.path(), "b.wav", 3.0, 500.0);
        let (enc, cond) = models();
        let cache_dir = tempfile::tempdir().unwrap();
        let cache = LatentCache::new(cache_dir.path()).unwrap();
        let mut tiles = Vec::new();
        prepare_dataset(&DataSpec::new(src.path()), &enc, &cond, Some(&cache), &Cancel::never(), &mut |e| {
            if let DataEvent::Progress { done, file: Some(f), seconds: Some(s), .. } = e {
                tiles.push((done, f.file_name().unwrap().to_string_lossy().into_owned(), s));
            }
        })
        .unwrap();
        // Each file's tiles count up to its own length, with the files done before it.
        let of = |name: &str| tiles.iter().filter(|t| t.1 == name).map(|t| (t.0, t.2)).collect::<Vec<_>>();
        let (a, b) = (of("a.wav"), of("b.wav"));
        assert!(a.len() >= 2 && b.len() >= 2, "{tiles:?}");
        assert!(a.iter().all(|&(done, _)| done == 0) && b.iter().all(|&(done, _)| done == 1));
        for file in [&a, &b] {
            assert!(file.windows(2).all(|w| w[0].1 .0 <= w[1].1 .0), "seconds never go back: {file:?}");
            let (last_done, last_total) = file.last().unwrap().1;
            assert_eq!(last_done, last_total);
        }
        assert!((b.last().unwrap().1 .1 - 3.0).abs() < 0.05, "{b:?}");
    }

    #[test]
    fn demo_folder_prepares_quickly() {
        let (enc, cond) = models();
        let spec = DataSpec::new(crate::data::synth::demo_dir());
        let t = std::time::Instant::now();
        let data = prepare_dataset(&spec, &enc, &cond, None, &Cancel::never(), &mut |_| {}).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        for i in 0..data.len() {
            data.sample(i, &enc, &cond, &mut rng).unwrap();
        }
        assert_eq!(data.len(), 6);
        assert!(data.issues.is_empty(), "{:?}", data.issues);
        assert!(data.items.iter().all(|i| i.meta.bpm.is_some() && !i.meta.caption.is_empty()));
        // Generous for a test build on a loaded 2-core machine; release is far faster.
        assert!(t.elapsed().as_secs_f64() < 10.0, "{:?}", t.elapsed());
    }
}

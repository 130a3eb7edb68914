//! Songs on request from a run's model (the app's Generate). A live run's loop serves a
//! request at its next step boundary, with the DiT and adapter it trains (no second
//! copy of the model) and the request's own seed (nothing drawn from the run's random
//! streams), so its results are the same with or without it; a run that is not live
//! gets a `Generator` loaded for its model and its newest adapter. Each song's request
//! is kept beside its WAV, so a run's songs can be listed again in a later session.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;

use candle_core::{Device, Tensor};

use super::config::RunConfig;
use super::state;
use crate::atomic::write_atomically;
use crate::cancel::Cancel;
use crate::codec::audio_hints::AudioDetokenizer;
use crate::codec::{Conditioner, LatentDecoder, StereoAudio};
use crate::data::{cached_latents, inspect_folder};
use crate::generate::plan::Planner;
use crate::generate::planned::{load_planner, plan_song};
use crate::generate::wav::write_wav;
use crate::generate::{GenerateEvent, GenerateSpec, Generator, SongModel};
use crate::load::source::ModelSource;
use crate::lora::LoraAdapter;
use crate::model::DitModel;
use crate::{Error, Result};

/// What a requester hears of its song: each step of the work, ending with
/// `GenerateEvent::Written`, or why it failed. A channel that closes before either
/// means the run ended before it could serve the request.
pub type SongUpdate = std::result::Result<GenerateEvent, String>;

/// A song asked of a live run.
pub(super) struct SongRequest {
    pub spec: GenerateSpec,
    pub out: PathBuf,
    pub updates: Sender<SongUpdate>,
}

/// The folder of a run's requested songs.
pub const SONGS_DIR: &str = "songs";

/// A new file for a song of `run_dir`: `songs/song-<unix ms>-seed<seed>.wav`, so that
/// songs sort by when they were asked for and never replace each other.
pub fn new_song_path(run_dir: &Path, seed: u64) -> PathBuf {
    run_dir.join(SONGS_DIR).join(format!("{}.wav", stamped("song", seed)))
}

/// `<kind>-<unix ms>-seed<seed>`: names that sort by when they were asked for.
pub(super) fn stamped(kind: &str, seed: u64) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{kind}-{ms}-seed{seed}")
}

/// A song of a run: its WAV and the request it was made from, kept beside it as
/// `<song>.json` (an error naming that file when it is missing or unreadable).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSong {
    pub path: PathBuf,
    pub spec: std::result::Result<GenerateSpec, String>,
}

/// Every song made from the run in `run_dir`, oldest first (their names sort by when
/// they were asked for); none before the first.
pub fn run_songs(run_dir: &Path) -> Result<Vec<RunSong>> {
    let dir = run_dir.join(SONGS_DIR);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut wavs = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(&dir, e))?.path();
        // Written songs only: not the hidden temporary file of one being written.
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if !hidden && path.extension().is_some_and(|e| e == "wav") {
            wavs.push(path);
        }
    }
    wavs.sort();
    Ok(wavs.into_iter().map(|path| RunSong { spec: song_request(&path), path }).collect())
}

/// The request kept beside the song at `wav`.
pub(super) fn song_request(wav: &Path) -> std::result::Result<GenerateSpec, String> {
    let file = wav.with_extension("json");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))
}

/// The borrowed training parts a song samples with.
pub(super) struct Trained<'a> {
    pub model: &'a DitModel,
    pub adapter: &'a LoraAdapter,
    pub conditioner: &'a dyn Conditioner,
}

/// What a run keeps to make songs beside its DiT: the decoder (loaded on first use),
/// whether the model is turbo, and its unconditional embedding.
pub(super) struct Voice {
    model: ModelSource,
    device: Device,
    decoder: Option<Box<dyn LatentDecoder>>,
    turbo: bool,
    /// `[1, 1, E]`: the model's `null_condition_emb` (guidance on base/SFT models).
    null_condition: std::result::Result<Tensor, String>,
    /// The model's detokenizer (songs over a plan's audio codes), loaded with the decoder.
    detokenizer: Option<std::result::Result<AudioDetokenizer, String>>,
}

impl Voice {
    pub fn new(
        model: ModelSource,
        device: Device,
        turbo: bool,
        null_condition: std::result::Result<Tensor, String>,
    ) -> Self {
        Self { model, device, decoder: None, turbo, null_condition, detokenizer: None }
    }

    /// Loads the decoder and detokenizer now (a run with previews fails at setup, not
    /// at its first preview).
    pub fn load_decoder(&mut self) -> Result<()> {
        if self.decoder.is_none() {
            self.decoder = Some(self.model.latent_decoder(&self.device)?);
        }
        if self.detokenizer.is_none() {
            self.detokenizer = Some(self.model.detokenizer(&self.device)?);
        }
        Ok(())
    }

    /// The song model of `parts` with this voice's decoder.
    pub fn song<'a>(&'a mut self, parts: &Trained<'a>) -> Result<SongModel<'a>> {
        self.load_decoder()?;
        Ok(SongModel {
            dit: parts.model,
            conditioner: parts.conditioner,
            decoder: self.decoder.as_deref().expect("loaded above"),
            turbo: self.turbo,
            null_condition: &self.null_condition,
            detokenizer: self.detokenizer.as_ref().expect("loaded above"),
        })
    }
}

/// Makes `spec` with `adapter` at its strength, planned by `planner` where it asks for
/// a plan, reporting each step to `on_event`.
pub(super) fn make_song(
    song: &SongModel,
    adapter: &LoraAdapter,
    spec: &GenerateSpec,
    planner: Option<&Planner>,
    cancel: &Cancel,
    on_event: &mut dyn FnMut(GenerateEvent),
) -> Result<StereoAudio> {
    let spec = plan_song(spec, planner, cancel, on_event)?;
    let latents = song.latents(&spec, Some(adapter), cancel, on_event)?;
    song.decode(&latents, on_event)
}

/// `audio` as a WAV at `out` (atomically, creating its folder).
pub(super) fn write_song(out: &Path, audio: &StereoAudio) -> Result<()> {
    create_folder_of(out)?;
    write_wav(out, audio)
}

/// A song asked for: its WAV at `out` and, first, beside it the request it was made
/// from ([`run_songs`] lists them; A/B pairs keep theirs so too).
pub(super) fn save_song(out: &Path, audio: &StereoAudio, spec: &GenerateSpec) -> Result<()> {
    create_folder_of(out)?;
    let request = serde_json::to_vec_pretty(spec).expect("a request serialises");
    write_atomically(&out.with_extension("json"), &request)?;
    write_wav(out, audio)
}

fn create_folder_of(file: &Path) -> Result<()> {
    match file.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e)),
        None => Ok(()),
    }
}

/// Serves one request with the live run's parts; the requester hears every step and
/// the end. A live run's song uses the adapter it trains: a folder in the spec is refused.
pub(super) fn serve(request: SongRequest, voice: &mut Voice, parts: &Trained, cancel: &Cancel) {
    let SongRequest { spec, out, updates } = request;
    let result = match spec.adapter {
        Some(_) => Err(Error::BadRequest("a live run generates with the adapter it trains, not a folder".into())),
        None => voice.song(parts).and_then(|song| {
            make_song(&song, parts.adapter, &spec, load_planner(&spec)?.as_ref(), cancel, &mut |e| {
                let _ = updates.send(Ok(e));
            })
        }),
    }
    .and_then(|audio| save_song(&out, &audio, &spec).map(|_| audio));
    let _ = updates.send(match result {
        Ok(audio) => Ok(written(out, &audio)),
        Err(Error::Cancelled) => Err("the run stopped before the song was made".into()),
        Err(e) => Err(e.to_string()),
    });
}

fn written(path: PathBuf, audio: &StereoAudio) -> GenerateEvent {
    GenerateEvent::Written { path, seconds: audio.duration_seconds(), sample_rate: audio.sample_rate }
}

/// The adapter a run that is not live generates with: `final/`, else its newest
/// checkpoint's; None before its first checkpoint.
pub fn latest_adapter(run_dir: &Path) -> Result<Option<PathBuf>> {
    let final_dir = run_dir.join("final/adapter");
    if final_dir.is_dir() {
        return Ok(Some(final_dir));
    }
    Ok(state::list_checkpoints(run_dir)?.into_iter().next().map(|newest| newest.join("adapter")))
}

/// Makes `spec` with the model of the run in `run_dir` (not live) and its newest adapter
/// at `spec.adapter_scale` into `out`. A run without an adapter yet generates only at
/// strength 0 (the base model).
pub fn generate_for_run(
    run_dir: &Path,
    spec: &GenerateSpec,
    out: &Path,
    on_event: &mut dyn FnMut(GenerateEvent),
) -> Result<GenerateEvent> {
    let config = RunConfig::from_toml_file(&run_dir.join("run.toml"))?;
    let adapter = match (latest_adapter(run_dir)?, spec.adapter_scale) {
        (_, 0.0) => None,
        (Some(dir), _) => Some(dir),
        (None, _) => {
            return Err(Error::BadRequest(
                "the run has no adapter yet (no checkpoint): set the strength to 0 to hear the base model".into(),
            ))
        }
    };
    let planner = load_planner(spec)?;
    let generator = Generator::load(&config.model)?;
    let spec = GenerateSpec { adapter, ..spec.clone() };
    let planned = plan_song(&spec, planner.as_ref(), &Cancel::never(), on_event)?;
    drop(planner);
    let latents = generator.latents(&planned, on_event)?;
    let audio = generator.decode(&latents, on_event)?;
    save_song(out, &audio, &spec)?;
    Ok(written(out.to_path_buf(), &audio))
}

/// The dataset song at `song` (a file of `config`'s dataset folder) as the model hears
/// it: the latents training uses, from the latent cache, through the model's decoder.
/// None when the cache does not hold them (caching off, or not yet prepared).
pub fn as_the_model_hears(config: &RunConfig, song: &Path) -> Result<Option<StereoAudio>> {
    let Some(cache) = config.latent_cache()? else { return Ok(None) };
    let file = inspect_folder(&config.data.folder, &config.data.labels)?
        .songs
        .into_iter()
        .find(|s| s.path == song)
        .ok_or_else(|| Error::BadAudio {
            path: song.to_path_buf(),
            reason: "not a song of the dataset folder".into(),
        })?;
    let device = Device::Cpu;
    let (encoder, conditioner, _) = config.model.encoders(&device)?;
    match cached_latents(&config.data, encoder.as_ref(), conditioner.as_ref(), &cache, file)? {
        Some(latents) => config.model.latent_decoder(&device)?.decode(&latents).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_songs_are_listed_with_their_requests_or_what_is_wrong_with_them() {
        let run = tempfile::tempdir().unwrap();
        assert_eq!(run_songs(run.path()).unwrap(), [], "no songs folder yet: no songs");
        let songs = run.path().join(SONGS_DIR);
        std::fs::create_dir_all(&songs).unwrap();
        let audio = StereoAudio { sample_rate: 48_000, left: vec![0.1; 480], right: vec![-0.1; 480] };
        let spec = GenerateSpec { caption: "plucks".into(), seed: 3, adapter_scale: 0.5, ..Default::default() };
        let (good, bad) = (songs.join("song-100-seed3.wav"), songs.join("song-200-seed4.wav"));
        save_song(&good, &audio, &spec).unwrap();
        save_song(&bad, &audio, &spec).unwrap();
        std::fs::write(bad.with_extension("json"), "{ not json").unwrap();
        // A song being written (its hidden temporary file) and other files are not songs.
        std::fs::write(songs.join(".song-300-seed5.wav.77.tmp"), b"RIFF").unwrap();
        std::fs::write(songs.join("notes.txt"), b"").unwrap();

        let listed = run_songs(run.path()).unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(listed[0], RunSong { path: good, spec: Ok(spec) });
        assert_eq!(listed[1].path, bad);
        let why = listed[1].spec.as_ref().unwrap_err();
        assert!(why.contains("song-200-seed4.json"), "{why}");
    }
}

//! Listening: a run's previews, songs made on request (Generate), the audio files the
//! web view plays and their pictures, and the dataset's songs as they are and as the
//! model hears them.
//!
//! Least privilege: the web view gets audio only as bytes from these commands, never
//! as a file URL; a path it names must resolve (links and `..` followed) inside the
//! runs folder, and a dataset song is named relative to the scanned dataset folder.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use ostinato_engine::charts::{waveform_svg, Theme};
use ostinato_engine::data::audio::{decode, decode_file};
use ostinato_engine::data::DataSpec;
use ostinato_engine::events::{read_events, Event};
use ostinato_engine::generate::plan::PlanSettings;
use ostinato_engine::generate::wav::float_wav_bytes;
use ostinato_engine::generate::{GenerateEvent, GenerateSpec};
use ostinato_engine::lora::{AdapterSummary, LoraAdapter};
use ostinato_engine::train::songs::{generate_for_run, latest_adapter, new_song_path, run_songs, RunSong, SongUpdate};

use super::engine;
use super::error::{engine_err, setting_err, BridgeError};
use super::outgoing::{EventSink, Outgoing};
use super::state::AppState;
use super::views::{AdapterView, PreviewView, SavedSongView, SongChoices, SongProgress, SongStage};

/// The size audio pictures are drawn at: about the width the previews panel gives them.
const PICTURE_SIZE: (u32, u32) = (360, 64);

impl AppState {
    /// `path` resolved (links and `..` followed), if that is inside the runs folder.
    fn inside_runs(&self, path: &Path) -> Option<PathBuf> {
        let resolved = path.canonicalize().ok()?;
        resolved.starts_with(self.runs_dir().canonicalize().ok()?).then_some(resolved)
    }

    /// `path` if it resolves to a file inside the runs folder, else why not.
    pub fn checked_audio_path(&self, path: &Path) -> Result<PathBuf, BridgeError> {
        self.inside_runs(path)
            .filter(|file| file.is_file())
            .ok_or_else(|| BridgeError::Invalid(format!("not a file of this app's runs: {}", path.display())))
    }

    /// `path` if it is an adapter folder inside the runs folder (as the window's pickers
    /// offer them), else an error for `field`.
    pub(super) fn checked_adapter_dir(&self, path: &Path, field: &str) -> Result<PathBuf, BridgeError> {
        self.inside_runs(path).filter(|dir| dir.is_dir()).ok_or_else(|| {
            let why = format!("{} is not an adapter folder of this app's runs", path.display());
            BridgeError::InvalidSettings([(field.to_string(), why)].into())
        })
    }

    /// The bytes of an audio file of a run (a preview, a generated song), for the player.
    pub fn audio(&self, path: &Path) -> Result<Vec<u8>, BridgeError> {
        let file = self.checked_audio_path(path)?;
        std::fs::read(&file)
            .map_err(|source| BridgeError::Io { context: format!("reading {}", file.display()), source })
    }

    /// The engine's picture of an audio file of a run (its waveform), as SVG.
    pub fn audio_picture(&self, path: &Path) -> Result<String, BridgeError> {
        let file = self.checked_audio_path(path)?;
        let audio = decode(&file).map_err(|e| BridgeError::Engine(format!("{}: {e}", file.display())))?;
        let theme = if self.lock().dark { Theme::Dark } else { Theme::Light };
        waveform_svg(&audio, PICTURE_SIZE, theme).map_err(engine_err)
    }

    /// Every preview of a run (the current one or one from History), from its log, oldest first.
    pub fn previews(&self, dir: &Path) -> Result<Vec<PreviewView>, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        let events = read_events(&dir.join("events.jsonl")).map_err(engine_err)?;
        Ok(events.into_iter().filter_map(|e| PreviewView::of(&dir, &e)).collect())
    }

    /// The run's newest adapter (final, else its newest checkpoint's) with the trigger
    /// word in its files; None before its first checkpoint.
    pub fn adapter(&self, dir: &Path) -> Result<Option<AdapterView>, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        let Some(path) = latest_adapter(&dir).map_err(engine_err)? else { return Ok(None) };
        let AdapterSummary { config, trigger } = LoraAdapter::describe(&path).map_err(engine_err)?;
        Ok(Some(AdapterView {
            path,
            settings: config.describe(),
            trigger_position: trigger.as_ref().map(|t| t.mode.name()),
            trigger: trigger.map(|t| t.tag),
        }))
    }

    /// Every song made from a run (in this session or an earlier one), oldest first.
    pub fn songs(&self, dir: &Path) -> Result<Vec<SavedSongView>, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        Ok(run_songs(&dir).map_err(engine_err)?.into_iter().map(SavedSongView::of).collect())
    }

    /// Starts a song from the run in `dir` with the user's choices; its progress goes to
    /// `sink` as `song` events under the returned id. A live run makes it at its next
    /// step boundary with the model it trains; any other run with its newest adapter.
    pub fn generate(&self, dir: &Path, choices: SongChoices, sink: impl EventSink) -> Result<u64, BridgeError> {
        let dir = self.checked_run_dir(dir)?;
        for (i, mixed) in choices.more_adapters.iter().enumerate() {
            self.checked_adapter_dir(&mixed.path, &format!("more_adapters[{i}].path"))?;
        }
        let spec = choices.spec();
        spec.validate().map_err(setting_err)?;
        let out = new_song_path(&dir, spec.seed);
        let (id, live) = {
            let mut g = self.lock();
            let id = g.take_song_id();
            let live = match g.run.live_control(&dir) {
                Some(control) => Some(control.generate(spec.clone(), out.clone())?),
                None => None,
            };
            (id, live)
        };
        let sink: Arc<dyn EventSink> = Arc::new(sink);
        let send = move |stage: SongStage| sink.send(Outgoing::Song(&SongProgress { id, stage }));
        send(SongStage::Waiting { live: live.is_some() });
        std::thread::Builder::new()
            .name("ostinato-song".into())
            .spawn(move || {
                let end = match live.map(|rx| follow(rx, &send)) {
                    Some(Some(end)) => end,
                    // Not live, or the run ended before its next step boundary.
                    _ => generate_for_run(&dir, &spec, &out, &mut |e| send(SongStage::of(e)))
                        .map(|written| send(SongStage::of(written)))
                        .map_err(|e| e.to_string()),
                };
                if let Err(message) = end {
                    send(SongStage::Failed { message });
                }
            })
            .map_err(|source| BridgeError::Io { context: "starting the song's thread".into(), source })?;
        Ok(id)
    }

    /// The dataset song `name` (relative to the scanned folder) as WAV bytes: as it is
    /// in its file (the part training uses), or (`heard`) as the model hears it, its
    /// cached latents decoded.
    pub fn dataset_audio(&self, name: &str, heard: bool) -> Result<Vec<u8>, BridgeError> {
        let folder = self.usable_song_folder(name)?;
        let path = folder.join(name);
        let audio = match heard {
            // The part training uses: a song may be hours long.
            false => decode_file(&path, DataSpec::default().cut(None))
                .map(|d| d.audio)
                .map_err(|e| BridgeError::Engine(format!("{}: {e}", path.display())))?,
            true => engine::heard_by_model(&self.start_request(self.settings(), folder), &path)?,
        };
        float_wav_bytes(&audio).map_err(engine_err)
    }
}

/// Relays a live run's updates until the song is written (Some(Ok)) or failed
/// (Some(Err)); None when the run ended before serving it.
fn follow(rx: Receiver<SongUpdate>, send: &dyn Fn(SongStage)) -> Option<Result<(), String>> {
    for update in rx.iter() {
        match update {
            Ok(e @ GenerateEvent::Written { .. }) => {
                send(SongStage::of(e));
                return Some(Ok(()));
            }
            Ok(e) => send(SongStage::of(e)),
            Err(message) => return Some(Err(message)),
        }
    }
    None
}

impl SongChoices {
    /// The engine's request: the user's choices, the engine's defaults for the rest.
    pub(super) fn spec(&self) -> GenerateSpec {
        GenerateSpec {
            caption: self.caption.clone(),
            lyrics: self.lyrics.clone(),
            duration_seconds: self.duration_seconds,
            seed: self.seed,
            adapter_scale: self.adapter_scale,
            lm: self.plan_with_lm.then(PlanSettings::default),
            more_adapters: self.more_adapters.clone(),
            parts: self.parts,
            ..GenerateSpec::default()
        }
    }
}

impl PreviewView {
    fn of(run_dir: &Path, event: &Event) -> Option<Self> {
        match event {
            Event::Preview { step, prompt, path, caption, seconds, took_s, .. } => Some(PreviewView {
                step: *step,
                prompt: *prompt,
                path: run_dir.join(path),
                caption: caption.clone(),
                seconds: *seconds,
                took_s: *took_s,
            }),
            _ => None,
        }
    }
}

impl SavedSongView {
    fn of(song: RunSong) -> Self {
        let spec = song.spec.as_ref().ok();
        SavedSongView {
            caption: spec.map(|s| s.caption.clone()),
            seconds: spec.map(|s| s.duration_seconds),
            seed: spec.map(|s| s.seed),
            adapter_scale: spec.map(|s| s.adapter_scale),
            problem: song.spec.err(),
            path: song.path,
        }
    }
}

impl SongStage {
    pub(super) fn of(event: GenerateEvent) -> Self {
        match event {
            GenerateEvent::Unplanned { reason } => SongStage::Unplanned { reason },
            GenerateEvent::Planning { phase, tokens } => SongStage::Planning { phase, tokens },
            GenerateEvent::Planned { codes, .. } => SongStage::Planned { codes },
            GenerateEvent::Started { steps, .. } => SongStage::Sampling { step: 0, steps },
            GenerateEvent::Step { step, steps } => SongStage::Sampling { step, steps },
            GenerateEvent::Decoding { .. } => SongStage::Decoding,
            GenerateEvent::Written { path, seconds, .. } => SongStage::Written { path, seconds },
        }
    }
}

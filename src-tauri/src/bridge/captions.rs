//! Captioning with ACE-Step's 5 Hz LM (the dataset editor's "Caption"): one batch at a
//! time on a thread of its own, the LM loaded once for the batch and dropped with it
//! (its memory freed), each song's caption, lyrics, language and genre kept in the
//! label store as the editor's edits are; the LM's tempo, key and meter only offered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ostinato_engine::cancel::Cancel;
use ostinato_engine::data::Field;
use ostinato_engine::label::understand::labeller::{Labelled, LmLabeller, Progress, UnderstandSettings};
use ostinato_engine::label::ANALYSED;
use ostinato_engine::load::source::ModelSource;
use ostinato_engine::load::{preferred_lm, FoundLm, LmVariant};
use ostinato_engine::Error as EngineError;

use super::error::BridgeError;
use super::outgoing::{EventSink, Outgoing};
use super::state::AppState;
use super::views::{CaptionEvent, CaptionProgress, CaptionStart, CaptionedSong, CaptionsDone, FileRow};

/// The web view hears a song's stage at most this often (the tiny test LM writes
/// thousands of tokens a second; each would be an event), and at each new stage.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

impl AppState {
    /// The complete 5 Hz LMs found on this machine, the one captioning takes when none
    /// is named first (`preferred_lm`: upstream's 1.7B where it is there).
    pub fn caption_lms(&self) -> Result<Vec<FoundLm>, BridgeError> {
        let found = self.models().list_lms()?;
        let preferred = preferred_lm(&found).map(|lm| lm.path.clone());
        let mut complete: Vec<FoundLm> = found.into_iter().filter(|lm| lm.complete).collect();
        complete.sort_by_key(|lm| Some(&lm.path) != preferred.as_ref());
        Ok(complete)
    }

    /// Starts captioning the songs `names` of the scanned folder (None: every usable
    /// one) with the LM at `lm` (None: the preferred one found) and the model the
    /// settings choose (its audio tokenizer hears the songs). Its progress and each
    /// song's outcome go to `sink`. One batch at a time, and none while a run trains
    /// (both would hold a model in memory).
    pub fn start_captions(
        &self,
        names: Option<Vec<String>>,
        lm: Option<&Path>,
        sink: impl EventSink,
    ) -> Result<CaptionStart, BridgeError> {
        let names = match names {
            Some(names) => names,
            None => self.usable_songs()?,
        };
        if names.is_empty() {
            return Err(BridgeError::Invalid("no usable song to caption".into()));
        }
        for name in &names {
            self.usable_song_folder(name)?;
        }
        let lm = self.caption_lm(lm)?;
        let (batch, cancel) = {
            let mut g = self.lock();
            if g.captioning.is_some() {
                return Err(BridgeError::Invalid("songs are being captioned: wait for them, or cancel first".into()));
            }
            if g.run.active_dir().is_some() {
                return Err(BridgeError::Invalid("a run is training: caption songs once it has ended".into()));
            }
            g.next_caption_batch += 1;
            (g.next_caption_batch - 1, g.captioning.insert(Cancel::never()).clone())
        };
        let start = CaptionStart { batch, lm: lm.name.clone(), path: lm.path.clone(), songs: names.len() };
        let batch = Batch {
            id: batch,
            state: self.clone(),
            lm: lm.path,
            model: self.settings().run.model,
            names,
            cancel,
            sink: Arc::new(sink),
        };
        let spawned = std::thread::Builder::new().name("ostinato-captions".into()).spawn(move || batch.run());
        if let Err(source) = spawned {
            self.lock().captioning = None;
            return Err(BridgeError::Io { context: "starting the captioning thread".into(), source });
        }
        Ok(start)
    }

    /// Cancels the captioning in progress (the song being captioned keeps its labels);
    /// whether there was one.
    pub fn cancel_captions(&self) -> bool {
        self.lock().captioning.as_ref().map(Cancel::cancel).is_some()
    }

    /// The usable songs of the scanned folder, by name.
    fn usable_songs(&self) -> Result<Vec<String>, BridgeError> {
        let g = self.lock();
        let dataset = g.dataset.as_ref().ok_or_else(|| BridgeError::Invalid("scan a dataset folder first".into()))?;
        Ok(dataset.files.iter().filter(|f| f.status == "ok").map(|f| f.name.clone()).collect())
    }

    /// The LM at `chosen` when it is one found complete (the web view names no other
    /// folder), else the preferred one; or where to get one.
    fn caption_lm(&self, chosen: Option<&Path>) -> Result<FoundLm, BridgeError> {
        let mut lms = self.caption_lms()?.into_iter();
        match chosen {
            Some(path) => lms.find(|lm| lm.path == path).ok_or_else(|| {
                BridgeError::Invalid(format!(
                    "{} is no complete 5 Hz LM found on this machine: the Model panel lists them",
                    path.display()
                ))
            }),
            None => lms.next().ok_or_else(|| {
                let default = LmVariant::DEFAULT;
                BridgeError::Invalid(format!(
                    "no complete 5 Hz LM found: download {} ({}) in the Model panel to caption songs",
                    default.name(),
                    default.approx_size()
                ))
            }),
        }
    }
}

/// A captioning batch, run on its own thread.
struct Batch {
    id: u64,
    state: AppState,
    lm: PathBuf,
    model: ModelSource,
    names: Vec<String>,
    cancel: Cancel,
    sink: Arc<dyn EventSink>,
}

/// Why a song was not captioned: the batch was cancelled, or what went wrong.
enum NotKept {
    Cancelled,
    Failed(String),
}

/// The batch was cancelled.
struct Cancelled;

impl Batch {
    fn run(self) {
        let mut finish = Finish { batch: self.id, state: self.state.clone(), sink: self.sink.clone(), done: None };
        finish.done = Some(self.caption_all());
    }

    /// Loads the LM, captions every song, and drops the LM (before the batch is over,
    /// so a next batch never holds two).
    fn caption_all(&self) -> CaptionsDone {
        let songs = self.names.len();
        let mut done = CaptionsDone { batch: self.id, songs, captioned: 0, failed: 0, cancelled: false, error: None };
        let batch = self.id;
        self.send(CaptionEvent::Progress(CaptionProgress { batch, song: None, number: 0, songs, stage: None }));
        let labeller = match self.load() {
            Ok(labeller) => labeller,
            Err(why) => {
                done.error = Some(why);
                return done;
            }
        };
        for (i, name) in self.names.iter().enumerate() {
            match self.caption(&labeller, name, i + 1) {
                Ok(true) => done.captioned += 1,
                Ok(false) => done.failed += 1,
                Err(Cancelled) => {
                    done.cancelled = true;
                    break;
                }
            }
        }
        done
    }

    fn load(&self) -> Result<LmLabeller, String> {
        let device = ostinato_engine::device::select(false).map_err(|e| e.to_string())?;
        LmLabeller::load(&self.lm, &self.model, &device.device, UnderstandSettings::default())
            .map_err(|e| format!("cannot load ACE-Step's LM from {}: {e}", self.lm.display()))
    }

    /// Captions the song `name` (the `number`th) and sends its outcome: whether its
    /// labels were kept (a song that fails keeps the labels it had).
    fn caption(&self, labeller: &LmLabeller, name: &str, number: usize) -> Result<bool, Cancelled> {
        let mut outcome = CaptionedSong {
            batch: self.id,
            song: name.to_string(),
            number,
            songs: self.names.len(),
            row: None,
            guesses: BTreeMap::new(),
            refused: Vec::new(),
            error: None,
        };
        match self.keep_caption(labeller, name, number) {
            Ok((row, labelled)) => {
                outcome.row = Some(row);
                outcome.guesses = guesses(&labelled);
                outcome.refused = labelled.refused;
            }
            Err(NotKept::Cancelled) => return Err(Cancelled),
            Err(NotKept::Failed(why)) => outcome.error = Some(why),
        }
        let kept = outcome.row.is_some();
        self.send(CaptionEvent::Song(outcome));
        Ok(kept)
    }

    /// What the LM writes of the song, kept; its stages sent on the way.
    fn keep_caption(&self, labeller: &LmLabeller, name: &str, number: usize) -> Result<(FileRow, Labelled), NotKept> {
        self.cancel.check().map_err(|_| NotKept::Cancelled)?;
        // The dataset may have been rescanned (another folder) since the batch began.
        let folder = self.state.usable_song_folder(name).map_err(|e| NotKept::Failed(e.to_string()))?;
        let mut last: Option<(Instant, std::mem::Discriminant<Progress>)> = None;
        let mut progress = |stage: Progress| {
            let kind = std::mem::discriminant(&stage);
            if last.is_some_and(|(at, was)| was == kind && at.elapsed() < PROGRESS_INTERVAL) {
                return;
            }
            last = Some((Instant::now(), kind));
            let (song, songs) = (Some(name.to_string()), self.names.len());
            let batch = self.id;
            self.send(CaptionEvent::Progress(CaptionProgress { batch, song, number, songs, stage: Some(stage) }));
        };
        let labelled = match labeller.understand(&folder.join(name), &self.cancel, &mut progress) {
            Ok(labelled) => labelled,
            Err(EngineError::Cancelled) => return Err(NotKept::Cancelled),
            Err(e) => return Err(NotKept::Failed(e.to_string())),
        };
        let row = self.state.keep_lm_labels(name, &labelled.labels).map_err(|e| NotKept::Failed(e.to_string()))?;
        Ok((row, labelled))
    }

    fn send(&self, event: CaptionEvent) {
        self.sink.send(Outgoing::Caption(&event));
    }
}

/// The LM's tempo, key and meter, as label values.
fn guesses(labelled: &Labelled) -> BTreeMap<Field, String> {
    ANALYSED.into_iter().filter_map(|f| Some((f, labelled.labels.get(f)?.to_string()))).collect()
}

/// Ends a batch however its thread ends: the slot freed for the next batch, and the
/// web view told it is over (a batch that panicked, that it stopped).
struct Finish {
    batch: u64,
    state: AppState,
    sink: Arc<dyn EventSink>,
    done: Option<CaptionsDone>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.state.lock().captioning = None;
        let done = self.done.take().unwrap_or_else(|| CaptionsDone {
            batch: self.batch,
            songs: 0,
            captioned: 0,
            failed: 0,
            cancelled: false,
            error: Some("captioning stopped unexpectedly (the app's log says why)".into()),
        });
        self.sink.send(Outgoing::Caption(&CaptionEvent::Done(done)));
    }
}
